"""Slots: several generations' decodes in one step (batching/rendezvous.py), each in its share of the contexts
(batching/slots.py): steps take every running generation's rows, generations join and leave between steps, prompts go
in chunks, the urgent first; each answer is what it is alone; auto weighs a draft at the step's margin."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import itertools

from specdec_cli.batching.claim import Claim, Left, Priority
from specdec_cli.batching.rendezvous import Part, Steps
from specdec_cli.drafting.cost import Costs, Loaded, best_length
from specdec_cli.engine.context import StepFigures
from specdec_cli.engine.events import Prefilled, Token
from specdec_cli.engine.stats import collect
from specdec_cli.run_inputs import Inputs
from specdec_cli.session import RunConfig, open_session


class Recorder:
    """A context that records each step's parts (their sizes, kinds, priorities) and returns rows saying which part."""

    n_batch, max_outputs = 512, 64
    clock = iter(range(10**9))  # (steps in order, across contexts)

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, int, bool]]] = []
        self.when: list[int] = []

    def decode_parts(self, parts: list[Part]) -> list[np.ndarray]:
        self.when.append(next(Recorder.clock))
        self.batches.append([(p.tokens[0], len(p.tokens), p.prompt) for p in parts])
        return [np.full((p.outputs, 2), p.tokens[0]) for p in parts]


def drive(steps: Steps, threads: list[threading.Thread], timeout: float = 30.0) -> None:
    """The decoding thread's loop until every generation ended."""
    t0 = time.monotonic()
    while any(t.is_alive() for t in threads):
        steps.step(0.01)
        assert time.monotonic() - t0 < timeout, "the steps stalled"


def _in_order(*ctxs: Recorder) -> list:
    """Every context's batches in the order the steps decoded them."""
    return [b for _, b in sorted((w, b) for c in ctxs for w, b in zip(c.when, c.batches))]


def handed_over(steps: Steps, n: int) -> None:
    """Wait until n generations have handed over their rows (so that what a step takes does not race their start)."""
    t0 = time.monotonic()
    while len(steps._waiting) < n:
        assert time.monotonic() - t0 < 10
        time.sleep(0.005)


NORMAL, URGENT = Priority.NORMAL, Priority.URGENT
ORDERS = itertools.count(100)


def generation(steps: Steps, ctx, name, sizes, prompt=(), priority=NORMAL, got=None, before=None, order=None):
    """A generation's thread: prompt chunks, then decodes of the given sizes, each part's tokens all `name`."""

    def run():
        if before is not None:
            before.wait(10)
        with steps.joined():
            place = next(ORDERS) if order is None else order
            for n in list(prompt) + list(sizes):
                p = Part([name] * n, list(range(n)), [(0,)] * n, n - 1 if n in prompt else 0, prompt=n in prompt)
                p.priority, p.order = priority, place
                rows = steps.decode(ctx, p).rows
                if got is not None:
                    got.append((name, int(rows[0, 0])))

    return threading.Thread(target=run)


def test_a_step_carries_every_running_generation_and_joins_and_leaves_between_steps():
    steps, ctx, got = Steps(), Recorder(), []
    late = threading.Event()
    a = generation(steps, ctx, 1, [1] * 6, got=got)
    b = generation(steps, ctx, 2, [3, 1], got=got)  # leaves after two steps
    c = generation(steps, ctx, 3, [1] * 3, got=got, before=late)  # joins later
    for t in (a, b, c):
        t.start()
    handed_over(steps, 2)
    steps.step(5)
    late.set()
    drive(steps, [a, b, c])
    assert ctx.batches[0] == [(1, 1, False), (2, 3, False)] or ctx.batches[0] == [(2, 3, False), (1, 1, False)]
    names = [sorted(name for name, _, _ in batch) for batch in ctx.batches]
    assert all(len(set(n)) == len(n) for n in names)  # never two parts of one generation in a step
    assert sum(1 in n for n in names) == 6
    assert any(n == [1, 3] for n in names)  # c joined a's steps once b had left
    assert len(ctx.batches) < 6 + 2 + 3  # shared steps
    assert all(name == row for name, row in got)  # each generation got its own rows back


def test_an_urgent_prompt_goes_before_a_normal_one_and_rows_that_generate_go_in_every_step():
    steps, ctx = Steps(chunk=64), Recorder()
    start = threading.Event()
    normal = generation(steps, ctx, 1, [1], prompt=[64, 64, 64], before=start, order=0)  # (came first)
    urgent = generation(steps, ctx, 2, [1], prompt=[64, 64], priority=URGENT, before=start, order=1)
    gen = generation(steps, ctx, 3, [1] * 8)
    gen.start()
    steps.step(5)  # alone for a step
    for t in (normal, urgent):
        t.start()
    start.set()
    handed_over(steps, 3)
    drive(steps, [normal, urgent, gen])
    prompts = [[name for name, _, prompt in batch if prompt] for batch in ctx.batches]
    firsts = [p[0] for p in prompts if p]
    assert firsts[:2] == [2, 2] and firsts[2:] == [1, 1, 1]  # the urgent prompt's chunks first, whole
    assert all(len(p) <= 1 for p in prompts)  # one 64-token chunk a step: the budget
    with_gen = [batch for batch in ctx.batches if any(name == 3 for name, _, _ in batch)]
    assert len(with_gen) == 8 and sum(any(p for _, _, p in b) for b in with_gen) >= 3  # chunks rode beside it


def test_contexts_of_their_own_take_turns_and_equal_prompts_take_chunks_in_turn():
    steps, one, two = Steps(chunk=64), Recorder(), Recorder()
    a = generation(steps, one, 1, [1] * 4)  # exact mode: each slot's own target context
    b = generation(steps, two, 2, [1] * 4)
    for t in (a, b):
        t.start()
    handed_over(steps, 2)
    drive(steps, [a, b])
    served = [batch[0][0] for batch in _in_order(one, two)]  # whose rows each step decoded
    assert served in ([1, 2] * 4, [2, 1] * 4)  # in turn, not one whole answer and then the other
    steps, ctx = Steps(chunk=64), Recorder()
    long_ = generation(steps, ctx, 1, [1], prompt=[64] * 5, order=0)
    short = generation(steps, ctx, 2, [1], prompt=[64], order=1)  # same priority, came later
    for t in (long_, short):
        t.start()
    handed_over(steps, 2)
    drive(steps, [long_, short])
    firsts = [batch[0][0] for batch in ctx.batches if batch[0][2]]
    assert firsts.index(2) <= 1  # its one chunk went second, not after the long prompt's five


def test_closing_the_steps_ends_every_waiting_generation_with_the_error():
    steps, ctx, raised = Steps(), Recorder(), []

    def run():
        with steps.joined():
            try:
                steps.decode(ctx, Part([1], [0], [(0,)], 0))
            except RuntimeError as e:
                raised.append(str(e))
            try:
                steps.decode(ctx, Part([1], [0], [(0,)], 0))
            except RuntimeError as e:
                raised.append(str(e))

    t = threading.Thread(target=run)
    t.start()
    handed_over(steps, 1)
    steps.close(RuntimeError("stopping"))
    t.join(10)
    assert raised == ["stopping", "stopping"] and not ctx.batches


# --- the cost of a draft at the step's margin ----------------------------------------------------------------


class Step:
    def __init__(self, own: int, rows: int, seconds: float = 0.1, stake: int | None = None, teaches: bool = True):
        stake = rows - own + 1 if stake is None else stake  # (each other row a generating one's)
        self.last_step = StepFigures(own, rows, seconds, stake, teaches)


CPU = {1: 0.05, 2: 0.07, 4: 0.12, 8: 0.23, 16: 0.45}  # a 1.5B target on 2 cores, about: compute-bound


def test_a_drafts_rows_cost_the_step_at_its_margin_for_every_generation_in_it():
    c = Costs(CPU, draft=0.005, n_max=32)
    alone = Loaded(c, Step(1, 1))
    assert [alone.verify(n) for n in range(1, 9)] == [c.verify(n) for n in range(1, 9)]
    loaded = Loaded(c, Step(1, 4))  # three other rows in its step: four generations wait for a longer one
    for n in range(1, 9):
        assert loaded.verify(n) == pytest.approx(c.verify(1) + 4 * 0.05 / 0.12 * (c.verify(3 + n) - c.verify(4)))
    assert best_length([0.9] * 8, alone, 0.005)[0] == 2  # alone, drafting pays on this curve
    assert best_length([0.9] * 8, Loaded(c, Step(1, 4)), 0.005)[0] == 0  # beside three others, it does not
    assert loaded.draft == pytest.approx(0.005 * 4 * 0.05 / 0.12) and alone.draft == 0.005  # its decodes: waited for
    assert list(loaded.drafting(2, 0.0)) == pytest.approx([loaded.draft, 2 * loaded.draft])
    flat = Costs({1: 0.03, 16: 0.033, 32: 0.04}, draft=0.0005, n_max=32)  # a GPU's: rows cost little
    assert best_length([0.9] * 8, Loaded(flat, Step(1, 4)), 0.0005)[0] >= 4


def test_a_shared_round_teaches_the_steps_cost_not_its_own_rows_nor_its_wait():
    c, alone = Costs(CPU, n_max=32), Costs(CPU, n_max=32)
    Loaded(c, Step(2, 9, seconds=0.26)).observe_verify(2, 0.9)  # its 2 rows waited 0.9 s; the step of 9 took 0.26
    Loaded(alone, Step(2, 2, seconds=0.07)).observe_verify(2, 0.9)  # alone in a step of 0.07 s, after others' steps
    assert c.verify(2) == pytest.approx(CPU[2], rel=0.05)  # t(9) is about 0.26 on this curve: nothing moved much
    assert alone.verify(2) == pytest.approx(CPU[2], rel=0.05)
    Costs.observe_verify(alone, 2, 0.9)  # (the round's time, as a lone run learns it, would have moved it)
    assert alone.verify(2) > CPU[2] * 1.1


# --- generations in slots: each answer is its own ------------------------------------------------------------


PROMPTS = ["hello world " * 3, "the quick brown fox", "a b c d e f g", "lorem ipsum dolor sit amet " * 12]


def together(cfg: RunConfig, prompts: list[str], slots: int, chunk: int = 16, stop_after: dict | None = None, **kw):
    """Each prompt's tokens, generated in `slots` slots at once (more prompts wait for a slot), and the steps.
    stop_after: prompt index -> tokens after which its consumer walks away (a client that leaves)."""
    with open_session(cfg, slots=slots) as s:
        steps = Steps(chunk)
        free, lock, out = s.open_slots(steps), threading.Lock(), {}

        def run(i):
            with lock:
                slot = free.pop()
            with steps.joined():
                events = s.generate(s.prompt_tokens(prompts[i]), Inputs(), slot, **kw)
                if stop_after and i in stop_after:
                    n = 0
                    for e in events:
                        n += type(e).__name__ == "Token"
                        if n >= stop_after[i]:
                            break
                    events.close()
                    out[i] = None
                else:
                    out[i] = collect(events)
            with lock:
                free.append(slot)

        pending = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        running: list[threading.Thread] = []
        t0 = time.monotonic()
        while pending or any(t.is_alive() for t in running):
            running = [t for t in running if t.is_alive()]
            while pending and len(running) < slots:
                running.append(pending.pop(0))
                running[-1].start()
            steps.step(0.01)
            assert time.monotonic() - t0 < 300, "the steps stalled"
        return out, steps


def alone(cfg: RunConfig, prompts: list[str], **kw) -> list[list[int]]:
    with open_session(cfg) as s:
        return [collect(s.generate(s.prompt_tokens(p), Inputs(), **kw)).tokens for p in prompts]


# auto in exact mode: beside others it drafts by the load (Loaded), so its verify batches are not a lone run's, and in
# fast mode the fixtures' F32 products sum differently by a batch's shape: a near-tie may tip (docs/serve.md).
@pytest.mark.parametrize(
    "how",
    [
        dict(drafter="none"),
        dict(),
        dict(drafter="auto", exact=True),
        dict(branches=2, draft_tokens=4),
        dict(exact=True),
        dict(draft="other_vocab_draft", exact=True),  # another tokenizer's draft, its slots' cells in its own ids
    ],
    ids=["none", "model", "auto-exact", "tree", "exact", "foreign-exact"],
)
def test_each_answer_in_a_shared_step_is_the_answer_alone(models, how):
    from conftest import config

    cfg = config(models, **how)  # (debug: every round checks each slot's caches)
    out, steps = together(cfg, PROMPTS, 3, max_tokens=40)
    assert [out[i].tokens for i in range(len(PROMPTS))] == alone(cfg, PROMPTS, max_tokens=40)
    shared = sum(out[i].stats.shared_rounds for i in out)
    if how.get("exact"):  # each slot its own target context: no target step is shared
        assert shared == 0
    else:
        assert steps.shared > 0 and shared > 0
        assert max(out[i].stats.step_rows / out[i].stats.rounds for i in out) > 1


@pytest.mark.parametrize(
    "exact,draft", [(True, "draft"), (False, "draft"), (True, "other_vocab_draft")], ids=["exact", "fast", "foreign"]
)
def test_a_generation_that_stops_midway_leaves_its_slot_clean_for_the_next(models, exact, draft):
    """--debug checks every slot's caches every round (a stopped one's leftover cells raise). The answers are each
    one's alone in exact mode; in fast mode only where the steps' shapes match a lone run's: when the stopped ones
    leave is the threads' to say, and the fixtures' F32 products sum differently by a batch's shape (a near-tie
    tipped at token 17 once in CI)."""
    from conftest import config

    cfg = config(models, draft, exact=exact)
    prompts = PROMPTS + ["one two three four"]
    out, _ = together(cfg, prompts, 2, stop_after={0: 3, 2: 5}, max_tokens=30)
    assert out[0] is None and out[2] is None
    assert all(out[i].stats.stop_reason in ("eos", "max_tokens") for i in (1, 3, 4))
    if exact:
        expected = alone(cfg, prompts, max_tokens=30)
        for i in (1, 3, 4):  # the slots the stopped ones left served these, from caches rolled back
            assert out[i].tokens == expected[i]


def test_exact_answers_hold_beside_other_requests_on_a_quantized_model(smollm2):
    """SmolLM2's Q8_0 and Q4_1 products differ by batch shape without exact mode (tests/test_exact.py): in exact mode
    each slot's answer is its answer alone, whatever the other slot runs meanwhile."""
    cfg = RunConfig(target=smollm2, draft=None, drafter="lookup", threads=2, ctx_size=1024, exact=True, debug=True)
    prompts = ["Write a short poem about the sea.", "def fib(n):\n    " * 4, "List three colours.", "Count: 1, 2, 3,"]
    out, _ = together(cfg, prompts, 2, chunk=32, max_tokens=48, draft_tokens=4)
    assert [out[i].tokens for i in range(len(prompts))] == alone(cfg, prompts, max_tokens=48, draft_tokens=4)


# --- the server: --parallel ---------------------------------------------------------------------------------------


def open_stream(s, path: str, body: dict):
    """A streamed request's response, its first event read (it is generating now)."""
    import http.client
    import json

    conn = http.client.HTTPConnection(s.host, int(s.port), timeout=120)
    conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    r.read1(100)
    return conn, r


def test_two_slots_generate_at_once_the_queue_refuses_in_each_apis_shape_and_a_client_that_leaves_frees_its_slot(
    smollm2,
):
    from test_serve import Served

    s = Served("--target", smollm2, "--drafter", "none", "-np", "2", "--queue", "0", "-c", "1024", "--debug")
    try:
        a_conn, a = open_stream(s, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2000})
        b_conn, b = open_stream(s, "/v1/completions", {"prompt": "The history of Rome", "max_tokens": 60})
        for path, body, shape in [
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2}, lambda e: e["error"]["code"] == "queue_full"),
            (
                "/v1/messages",
                {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                lambda e: e["type"] == "error" and e["error"]["type"] == "overloaded_error",
            ),  # fmt: skip
            ("/completion", {"prompt": "hi", "n_predict": 2}, lambda e: e["error"]["code"] == 503),
        ]:
            status, headers, error = s.post(path, body)
            assert status == 503 and int(headers["Retry-After"]) >= 1 and shape(error), (path, error)
        rest = b.read().decode()  # b finishes while a still generates: they ran at once
        assert rest.rstrip().endswith("data: [DONE]") and a_conn.sock is not None
        assert '"finish_reason":"length"' in rest.replace(" ", "")
        a_conn.sock.shutdown(2)  # a leaves: its slot frees at its next step
        a_conn.close()
        t0 = time.monotonic()
        while True:
            status, _, body = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 4})
            if status == 200 or time.monotonic() - t0 > 30:
                break
            time.sleep(0.2)
        assert status == 200 and body["usage"]["completion_tokens"] == 4
        b_conn.close()
    finally:
        assert s.stop() == 0, s.stderr


def test_a_request_beside_another_says_how_many_rows_its_steps_carried(smollm2):
    from test_serve import Served

    s = Served("--target", smollm2, "--drafter", "none", "-np", "2", "-c", "1024")
    try:
        conn, r = open_stream(s, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 400})
        status, _, body = s.post("/v1/completions", {"prompt": "The history of Rome", "max_tokens": 20})
        conn.close()
        assert status == 200
        stats = body["speculative"]
        assert stats["shared_rounds"] >= 15 and stats["mean_step_rows"] > 1.5  # its rows and the other's
    finally:
        assert s.stop() == 0, s.stderr


def test_sigterm_ends_every_slots_stream_cleanly_and_exits_0(smollm2):
    import signal

    from test_serve import Served

    s = Served("--target", smollm2, "--drafter", "none", "-np", "3", "-c", "1024")
    try:
        streams = [open_stream(s, "/v1/completions", {"prompt": f"Story {i}:", "max_tokens": 3000}) for i in range(3)]
        s.proc.send_signal(signal.SIGTERM)
        rests = [r.read().decode() for _, r in streams]
    finally:
        code = s.stop()
    assert all(x.rstrip().endswith("data: [DONE]") and "shutting down" in x for x in rests)
    assert code == 0 and "stopped" in s.stderr


def test_a_client_that_leaves_during_its_prompt_stops_it_at_the_next_chunk_and_its_slot_serves_the_next(models):
    from conftest import config

    cfg, prompt = config(models), "lorem ipsum dolor sit amet " * 12
    with open_session(cfg, slots=2) as s:
        steps = Steps(chunk=16)
        slot = s.open_slots(steps)[0]
        tokens, raised = s.prompt_tokens(prompt), []
        assert len(tokens) > 6 * 16  # a prompt of several chunks

        class Leaves(Claim):  # the client leaves after its prompt's second chunk
            left = property(lambda self: steps.steps >= 2)

        slot.bind(Leaves())

        def run(**kw):
            with steps.joined():
                try:
                    return collect(s.generate(tokens, Inputs(), slot, max_tokens=20, **kw))
                except Left:
                    raised.append(steps.steps)

        t = threading.Thread(target=run)
        t.start()
        drive(steps, [t])
        assert raised == [2]  # no third chunk was decoded
        slot.bind(Claim())
        out = {}
        t = threading.Thread(target=lambda: out.update(r=run()))
        t.start()
        drive(steps, [t])
    assert out["r"].tokens == alone(cfg, [prompt], max_tokens=20)[0]


def test_an_idle_slot_leaves_no_cells_in_the_shared_caches_and_its_next_turn_still_reuses_them(models):
    """Every decode attends over every used cell of a shared cache, so an idle slot's kept cells slow the others' (a
    four-slot server's one client 4.5% slower): they are parked between its runs, and its next turn starts from them
    as from cells that stayed (debug checks both caches every round)."""
    from conftest import config

    cfg = config(models)
    first = "lorem ipsum dolor sit amet " * 6
    turns = [s + " and then some more words" for s in (first, first + " consectetur")]

    def two_turns(slots: int):
        with open_session(cfg, slots=slots) as s:
            steps = Steps(chunk=16)
            slot, out, idle = s.open_slots(steps)[0], [], []

            def run():
                with steps.joined():
                    for text in turns:
                        events = list(s.generate(s.prompt_tokens(text), Inputs(reuse=True), slot, max_tokens=12))
                        cached = next(e.cached for e in events if isinstance(e, Prefilled))
                        out.append((cached, [e.id for e in events if isinstance(e, Token)]))
                        contexts = [slot.target.ctx] + ([s.draft_ctx] if s.draft_ctx is not None else [])
                        idle.append([c.seq_pos_range(q) for c in contexts for q in range(c.n_seq)])

            t = threading.Thread(target=run)
            t.start()
            drive(steps, [t])
            return out, idle

    parked, idle = two_turns(2)
    assert all(r == (-1, -1) for ranges in idle for r in ranges), idle
    stayed, held = two_turns(1)  # (one slot: nobody else decodes in its caches, its cells stay)
    assert any(r != (-1, -1) for r in held[0])
    assert parked[1][0] == stayed[1][0] > 0  # the second turn found the first's cells
    assert parked == stayed
