"""The server's one pool of slots, as a review found it wanting: each finding reproduced, as a property that fails
without its fix. A failing part fails alone (a tree is bounded by the target's room); a freed slot goes to the head
of the line; a client that left stops its prompt at the next chunk, streamed or not; auto prices a draft by the
tokens at stake in its step (a chunk counts once), and a step teaches the shared curve once; a file read off the turn lets the other slots step;
an exact-mode prompt takes its turn beside a neighbour's answer; the target's heads and hidden-state drafts draft
in slots, each answer its answer alone."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import numpy as np
import pytest
import native_models as nm
from conftest import config
from test_parallel import Recorder, alone, drive, generation, handed_over, together

from specdec_cli import prefixes
from specdec_cli.batching.claim import Claim, Priority
from specdec_cli.batching.policy import AGING
from specdec_cli.batching.rendezvous import Part, Steps
from specdec_cli.drafting.cost import Costs, Loaded, best_length
from specdec_cli.engine.context import StepFigures
from specdec_cli.engine.stats import Fold, collect
from specdec_cli.run_inputs import Inputs
from specdec_cli.serve import api, service as service_module
from specdec_cli.serve.gate import Gate
from specdec_cli.serve.service import Service
from specdec_cli.session import RunConfig, open_session


# --- 1. one part's failing decode fails that part alone -----------------------------------------------------------


class Refuses(Recorder):
    """A context whose decode refuses any batch holding a part of generation 9 (a slot whose share is full)."""

    def decode_parts(self, parts):
        if any(p.tokens[0] == 9 for p in parts):
            raise RuntimeError("llama_decode failed: no KV slot")
        return super().decode_parts(parts)


def test_a_part_whose_decode_fails_fails_alone_and_the_others_in_its_step_get_their_rows():
    steps, ctx, got, errors = Steps(), Refuses(), [], []

    def failing():
        with steps.joined():
            try:
                steps.decode(ctx, Part([9], [0], [(0,)], 0))
            except RuntimeError as e:
                errors.append(str(e))

    bad = threading.Thread(target=failing)
    good = generation(steps, ctx, 1, [1] * 3, got=got)
    for t in (bad, good):
        t.start()
    handed_over(steps, 2)
    drive(steps, [bad, good])
    assert errors == ["llama_decode failed: no KV slot"]
    assert got == [(1, 1)] * 3  # every decode of the other generation went through, its own rows back


def test_a_tree_to_the_contexts_end_is_bounded_by_the_targets_room_alone_and_in_a_slot(models):
    """The draft holds a window of the text, so its cache has room where the target has none: a tree as wide as the
    draft's room wrote past the target's cells at the context's end (a 500 for its step's every request)."""
    cfg = config(models, branches=4, draft_tokens=8, ctx_size=256, p_split=0.01)
    prompt = "the quick brown fox jumps over the lazy dog " * 3
    with open_session(cfg) as s:
        r = collect(s.generate(s.prompt_tokens(prompt), Inputs(), max_tokens=1000))
    assert r.stats.stop_reason == "context" and r.stats.tree_rounds > 0
    out, steps = together(cfg, [prompt, "hello world"], 2, max_tokens=1000)  # a plain neighbour beside it
    assert out[0].stats.stop_reason == "context" and out[0].tokens == r.tokens
    assert out[1].tokens == alone(cfg, ["hello world"], max_tokens=1000)[0] and steps.shared > 0


# --- 6. the gate: first come, first served --------------------------------------------------------------------------


def test_a_freed_slot_goes_to_the_request_at_the_head_of_the_line_not_to_a_newcomer():
    for _ in range(30):
        assert _served_in_turn() == ["first", "waiter", "newcomer"]


def _served_in_turn() -> list[str]:
    """One slot held; a request waits for it; it frees as a newcomer arrives: the order they got it in."""
    gate, order = Gate([_Slot()], queue=4), []
    holding, release = threading.Event(), threading.Event()

    def ask(name, hold=None):
        with gate.admit(Claim()):
            order.append(name)
            if hold is not None:
                holding.set()
                hold.wait(10)

    first = threading.Thread(target=ask, args=("first", release))
    first.start()
    holding.wait(10)
    waiter = threading.Thread(target=ask, args=("waiter",))
    waiter.start()
    _until(lambda: len(gate._line) == 1)
    release.set()
    newcomer = threading.Thread(target=ask, args=("newcomer",))
    newcomer.start()
    for t in (first, waiter, newcomer):
        t.join(10)
    return order


class _Slot:
    """A slot as the gate hands it out (bind and release)."""

    def bind(self, claim):
        self.claim = claim

    def release(self):
        self.claim = None


def _until(condition, timeout: float = 10.0) -> None:
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout
        time.sleep(0.001)


# --- 7. a client that left: its prompt stops at the next chunk, streamed or not -----------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_during_a_long_prompt_stops_it_at_the_next_chunk(models, monkeypatch, stream):
    monkeypatch.setattr(service_module, "WATCH", 0.002)  # (its connection looked at often; each step slowed below)
    slow = Steps._decode

    def decode(ctx, parts):
        time.sleep(0.05)  # a step of a larger model: many looks at the connection during one
        slow(ctx, parts)

    monkeypatch.setattr(Steps, "_decode", staticmethod(decode))
    cfg = config(models, None, ctx_size=4096, lookup_cache=False)
    with open_session(cfg, slots=1) as s:
        service, stop = Service(s, "m", {"m"}, 1), threading.Event()
        work = threading.Thread(target=service.work, args=(stop,))
        work.start()
        try:
            req = api.parse("completion", {"prompt": "lorem ipsum dolor " * 150, "max_tokens": 4, "stream": stream})
            tokens = service.tokens(req)
            steps = service.pool.steps
            assert len(tokens) > 6 * steps.chunk  # seven chunks and more
            items = list(service.run(req, tokens, gone=lambda: steps.steps >= 2))
        finally:
            stop.set()
            work.join(30)
    assert steps.steps <= 3  # the chunk under way when it was seen to leave, no more
    assert not any(type(i).__name__ == "Finished" for i in items)


# --- a chat's next turn finds its last turn's slot -----------------------------------------------------------------


def test_a_chats_next_turn_is_given_the_slot_that_holds_its_last_turn(models):
    """Of the free slots the gate hands out the one whose cells serve most of the prompt (llama-server picks a slot
    by its prompt's similarity): a turn sent after another client's request still reuses its last turn's cells."""
    cfg = config(models, None, ctx_size=1024, lookup_cache=False)
    with open_session(cfg, slots=2) as s:
        service, stop = Service(s, "m", {"m"}, 1), threading.Event()
        work = threading.Thread(target=service.work, args=(stop,))
        work.start()

        def ask(prompt: str) -> int:
            req = api.parse("completion", {"prompt": prompt, "max_tokens": 4, "temperature": 0})
            items = list(service.run(req, service.tokens(req), gone=lambda: False))
            return next(i for i in items if type(i).__name__ == "Finished").cached

        try:
            first = "lorem ipsum dolor sit amet " * 8
            assert ask(first) == 0
            assert ask("a completely different request") == 0  # (in the other slot: it was free longest)
            assert ask(first + "and more") >= len(service.tokens(api.parse("completion", {"prompt": first}))) - 2
        finally:
            stop.set()
            work.join(30)


# --- 8. auto prices a draft by the tokens at stake in its step; a step teaches the curve once ----------------------------


class Step:
    def __init__(self, own: int, rows: int, stake: int, seconds: float = 0.1, teaches: bool = True):
        self.last_step = StepFigures(own, rows, seconds, stake, teaches)


CPU = {1: 0.05, 2: 0.07, 4: 0.12, 8: 0.23, 16: 0.45, 64: 1.8, 128: 3.6, 256: 7.2, 512: 14.4}  # 1.5B, 2 cores


def test_beside_a_prompts_chunk_a_draft_is_priced_by_the_tokens_at_stake_not_the_chunks_rows():
    c = Costs(CPU, draft=0.005, n_max=512)
    beside_chunk = Loaded(c, Step(own=1, rows=257, stake=2))  # its token and another request's 256-token chunk
    k = best_length([0.9] * 8, beside_chunk, 0.005)[0]
    assert k >= 4  # the step grows by 2%: drafting pays the drafting request about 4x its rate
    as_rows = Loaded(c, Step(own=1, rows=257, stake=257))  # (what counting the chunk's rows would price)
    assert best_length([0.9] * 8, as_rows, 0.005)[0] == 0


def test_a_step_teaches_the_shared_curve_once_whatever_number_of_slots_it_carried():
    shared, one = Costs(CPU, n_max=512), Costs(CPU, n_max=512)
    figures = [StepFigures(2, 6, 0.5, 3, teaches) for teaches in (True, False, False)]  # the step named one teacher
    for f in figures:  # three slots' rounds in one step of 6 rows that took 0.5 s (the curve says about 0.17)
        Loaded(shared, _Last(f)).observe_verify(2, 0.6)
    Loaded(one, _Last(figures[0])).observe_verify(2, 0.6)
    assert shared.verify(6) == one.verify(6) != Costs(CPU, n_max=512).verify(6)  # learned once, as by one slot


class _Last:
    def __init__(self, figures: StepFigures):
        self.last_step = figures


def test_the_steps_name_one_teacher_a_step_among_the_generations_it_carried():
    steps, ctx, figures = Steps(), Recorder(), []

    def run(name):
        with steps.joined():
            for _ in range(4):
                figures.append(steps.decode(ctx, Part([name] * 2, [0, 1], [(0,)] * 2, 0)).figures)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    handed_over(steps, 3)
    drive(steps, threads)
    assert steps.steps == 4 and steps.shared == 4  # every step carried all three
    assert sum(f.teaches for f in figures) == steps.steps and all(f.stake == 5 for f in figures)


def test_a_first_round_after_prompts_read_together_is_priced_by_the_step_of_one_row_each_that_follows():
    """Four requests' prompts read in one step: each one's first round joins a step of four rows (a token each),
    not of the prompts' rows; priced by the prompt step's rows, drafting looked cheap beside three prompts and every
    request drafted (and read its prompt into the draft) where beside three generating rows it does not pay."""
    steps, ctx, figures = Steps(), Recorder(), []

    def run(name):
        with steps.joined():
            figures.append(
                steps.decode(ctx, Part([name] * 30, list(range(30)), [(0,)] * 30, 29, prompt=True, ends=True)).figures
            )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    handed_over(steps, 4)
    drive(steps, threads)
    assert steps.steps == 1 and [(f.rows, f.beside, f.stake) for f in figures] == [(120, 3, 4)] * 4
    c = Costs(CPU, draft=0.005, n_max=512)
    assert best_length([0.9] * 8, Loaded(c, _Last(figures[0])), 0.005)[0] == 0  # as beside three generating rows
    assert best_length([0.9] * 8, Loaded(c, Step(own=1, rows=4, stake=4)), 0.005)[0] == 0
    assert best_length([0.9] * 8, Loaded(c, Step(own=30, rows=120, stake=4)), 0.005)[0] > 0  # (the prompt step's rows)


class _Behind:
    """A draft model `lag` tokens behind the text (1,500: an editor's prompt it has not read): a round it drafts is
    recorded, not made."""

    name, failed, per_round, opened, window = "model", False, False, True, 2048

    def __init__(self, lag: int):
        self.drafted, self._lag = 0, lag

    def loaded(self):
        return True

    def take_notice(self):
        return None

    def prefill(self, tokens):
        pass

    def lag(self, committed, k, size):
        return self._lag

    def propose(self, committed, k, sampler, rng, policy):
        self.drafted += 1
        raise _Drafted


class _Drafted(Exception):
    pass


REAL = {1: 0.076, 2: 0.115, 4: 0.168, 8: 0.233, 16: 0.242, 256: 1.85}  # the 1.5B's curve as kept here (AMX)


def _drafts(costs, lag: int, answered: int, learned: tuple[float, float] | None = None) -> bool:
    """Whether auto drafts with a model `lag` tokens behind, `answered` tokens into the answer (`learned`: its
    acceptance as learned so far, hits and rounds; None: the prior)."""
    from specdec_cli.drafting.auto import AutoDrafter, Rate
    from specdec_cli.engine.sampling import Sampler

    model, prompt = _Behind(lag), list(range(1000, 2551))
    auto = AutoDrafter(costs, None, model, max_tokens=256)
    if learned is not None:
        auto.model_rate = Rate(*learned)
    auto.prefill(prompt[:-1])
    try:
        auto.propose(prompt + [7] * answered, 8, Sampler(), np.random.default_rng(0))
    except _Drafted:
        pass
    return bool(model.drafted)


def test_beside_a_chunk_the_draft_is_not_brought_in_step_on_the_promise_of_the_rest_of_the_answer():
    """An editor's /infill beside a chat prompt's chunks: priced as the slow step beside it goes, reading its 1,551
    prompt tokens into the draft looked paid back by the rest of the answer, and the feed went in steps of its own
    beside the chat's chunks (16 tokens: 36 s against 12 s alone). Beside others a draft is brought in step only
    where the round itself pays for it; alone it may still be paid back by the answer."""
    c = Costs(REAL, draft=0.0386, draft_prefill=0.0055, n_max=512)
    beside_chunk = Loaded(c, Step(own=1, rows=257, stake=2, seconds=1.85))
    for answered in (0, 8):
        assert not _drafts(beside_chunk, lag=1500, answered=answered)
        assert _drafts(beside_chunk, lag=1, answered=answered)  # in step: beside a chunk a draft pays
    gpu = Costs({1: 0.01, 8: 0.011, 64: 0.02, 512: 0.1}, draft=0.001, draft_prefill=0.0001, n_max=512)
    assert _drafts(gpu, lag=1500, answered=0)  # alone, paid back by the answer: unchanged


def test_beside_others_a_draft_is_priced_at_its_learned_acceptance_not_at_the_optimistic_bound():
    """Alone, auto explores the draft at its acceptance's optimistic bound (0.96 before a round has been seen); beside
    others, they pay for the exploration too: 4 clients each explored the draft beside each other's short prompts
    (8.3 s more in decodes a round, 0.91x the old server's rate). There the learned mean prices it."""
    c = Costs(REAL, draft=0.0386, draft_prefill=0.0055, n_max=512)
    beside_prompt = Loaded(c, Step(own=1, rows=30, stake=2, seconds=0.3))  # another's 29-token prompt chunk
    assert not _drafts(beside_prompt, lag=60, answered=5)
    assert _drafts(beside_prompt, lag=60, answered=5, learned=(96.0, 100.0))  # a draft known to be right: drafts
    assert _drafts(c, lag=1, answered=5)  # alone it explores, as ever


# --- 10. a file read off the turn: the other slots step meanwhile -------------------------------------------------


def test_a_prefix_restore_reads_its_files_off_the_turn_while_another_slot_generates(models, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_PREFIX_CACHE", str(tmp_path / "prefix-cache"))
    cfg = config(models, ctx_size=2048, lookup_cache=False)
    system = "the cache keeps a prompt so that a server restarted later reads it back " * 16
    with open_session(cfg, slots=2) as s:
        assert s.keep_prefixes(prefixes.MAX_BYTES, print) is None
        steps = Steps()
        a, b = s.open_slots(steps)
        done: dict = {}

        def ask(slot, prompt, key, **kw):
            with steps.joined():
                fold = Fold()
                for event in s.generate(s.prompt_tokens(prompt), Inputs(reuse=True), slot, **kw):
                    fold.add(event)
                done[key] = fold

        first = threading.Thread(target=ask, args=(b, system + "question one", "first"), kwargs=dict(max_tokens=4))
        first.start()
        drive(steps, [first])
        s.keep_prompt()  # its blocks on disk (the server's idle turn)
        reading, go = threading.Event(), threading.Event()
        read = prefixes.blocks.read

        def slow_read(path, limit):
            reading.set()
            assert go.wait(30), "the other slot never finished while this one read"
            return read(path, limit)

        monkeypatch.setattr(prefixes.blocks, "read", slow_read)
        restoring = threading.Thread(target=ask, args=(a, system + "question two", "restored"), daemon=True)
        restoring.start()
        _until(reading.is_set)
        other = threading.Thread(target=ask, args=(b, "hello world", "other"), kwargs=dict(max_tokens=8), daemon=True)
        other.start()
        drive(steps, [other])  # it generates its whole answer while the restore reads
        go.set()
        drive(steps, [restoring])
    assert len(done["other"].tokens) == 8 and done["restored"].cached > 0


# --- 3. exact mode: a prompt's context takes its turn beside a neighbour's answer ---------------------------------


def test_in_exact_mode_a_long_prompt_is_answered_while_a_neighbour_still_generates(models):
    cfg = config(models, None, exact=True, ctx_size=1024, lookup_cache=False)
    with open_session(cfg, slots=2) as s:
        steps = Steps(chunk=64)
        a, b = s.open_slots(steps)
        ended: dict = {}

        def ask(slot, prompt, key, kw):
            with steps.joined():
                tokens = s.prompt_tokens(prompt)
                ended[key] = (
                    len(tokens),
                    collect(s.generate(tokens, Inputs(), slot, **kw)).stats.generated_tokens,
                    steps.steps,
                )

        long_answer = threading.Thread(target=ask, args=(a, "once upon a time", "answer", dict(max_tokens=300)))
        long_answer.start()
        _until(lambda: steps.running == 1 and len(steps._waiting) == 1)
        steps.step(1)  # it generates
        prompt = threading.Thread(
            target=ask, args=(b, "lorem ipsum dolor sit amet " * 20, "prompt", dict(max_tokens=1))
        )
        prompt.start()
        drive(steps, [long_answer, prompt], timeout=120)
    (n_prompt, _, prompt_end), (_, n_answer, answer_end) = ended["prompt"], ended["answer"]
    assert n_prompt > 8 * 64 and n_answer > 40  # a prompt of many chunks; an answer of more steps
    assert prompt_end < answer_end  # its chunks took turns with the answer's steps, not after its end


# --- heads and hidden-state drafts under slots -------------------------------------------------------------------


PROMPTS = ["hello world " * 3, "the quick brown fox", "a b c d e f g", "lorem ipsum dolor sit amet " * 12]


@pytest.mark.parametrize("exact", [True, False])
def test_the_targets_mtp_heads_draft_in_slots_and_each_answer_is_its_answer_alone(models, exact):
    """Exact mode: each answer is its answer alone. Fast mode: this fixture's F32 rows differ by a batch's shape (its
    first prompt parts from a lone run's with --drafter none too), so there the heads draft, are accepted and share
    steps, every round's caches checked (debug)."""
    cfg = config(models, None, target=models["mtp"], drafter="mtp", draft_tokens=3, exact=exact)
    out, steps = together(cfg, PROMPTS, 3, max_tokens=32)
    if exact:
        assert [out[i].tokens for i in range(len(PROMPTS))] == alone(cfg, PROMPTS, max_tokens=32)
    else:
        assert steps.shared > 0
    mine = [out[i].stats.by_drafter["mtp"] for i in out]
    assert all(m.drafted > 0 for m in mine) and sum(m.accepted for m in mine) > 0


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return nm.write_native_set(tmp_path_factory.mktemp("native"))


@pytest.mark.parametrize("arch", ["eagle3", "dflash"])
def test_a_hidden_state_draft_drafts_in_slots_and_each_answer_is_its_answer_alone(native, arch):
    cfg = RunConfig(target=native["counter"], draft=native[arch], drafter=arch, draft_tokens=4, threads=2,
                    ctx_size=512, debug=True)  # fmt: skip
    prompts = ["abcdefghijkl", "Hello, world", "xyz", "0123456789" * 3]
    out, steps = together(cfg, prompts, 3, max_tokens=32)
    assert [out[i].tokens for i in range(len(prompts))] == alone(cfg, prompts, max_tokens=32)
    drafted = [out[i].stats.by_drafter[arch] for i in out]
    assert all(d.drafted > 0 and d.accepted > 0 for d in drafted) and steps.shared > 0


def test_urgent_prompts_chunks_go_first_in_a_real_session(models):
    """The parts' kinds come from the slots' states (a prompt's rows before its last token), not their sizes; a
    prompt's last chunk is marked as such."""
    cfg = config(models, None, ctx_size=1024, lookup_cache=False)
    prompt = "lorem ipsum dolor sit amet " * 24  # (more chunks than AGING: the other's chunk comes by aging)
    with open_session(cfg, slots=2) as s:
        steps = Steps(chunk=32)
        a, b = s.open_slots(steps)
        order: list = []
        kinds, ends = [], []
        real = Steps._choose

        def choose(self):
            ctx, parts = real(self)
            kinds.append([(p.priority, p.prompt) for p in parts])
            ends.extend((p.order, p.ends) for p in parts if p.prompt and not p.draft)
            return ctx, parts

        Steps._choose = choose
        try:
            for slot, priority in ((a, Priority.NORMAL), (b, Priority.URGENT)):
                slot.bind(Claim(priority, order=len(order)))
                order.append(slot)

            def ask(slot):
                with steps.joined():
                    collect(s.generate(s.prompt_tokens(prompt), Inputs(), slot, max_tokens=2))

            threads = [threading.Thread(target=ask, args=(slot,)) for slot in order]
            for t in threads:
                t.start()
            handed_over(steps, 2)
            drive(steps, threads)
        finally:
            Steps._choose = real
    prompt_steps = [[pr for pr, p in k if p] for k in kinds if any(p for _, p in k)]
    assert len(prompt_steps) >= 6  # each prompt's chunks were prompt parts (the slots' states say so)
    assert prompt_steps[0] == [Priority.URGENT]  # the urgent prompt's chunk first, though the other came first
    normal = [i for i, k in enumerate(prompt_steps) if Priority.NORMAL in k]
    assert normal and normal[0] <= AGING  # and the other, starved AGING steps, had its chunk then
    for o in range(2):  # each prompt's last chunk says so (auto prices its first round by the step of rows after it)
        chunks = [e for order_, e in ends if order_ == o]
        assert len(chunks) >= 3 and chunks[-1] and not any(chunks[:-1])


# --- a stop that lands as a slot's thread starts ------------------------------------------------------------------


def test_a_stop_that_lands_as_a_slot_thread_starts_ends_the_server_cleanly(monkeypatch):
    """A SIGTERM that landed while the pool started a generation's thread left a thread counted and not started, and
    the stop's join raised "cannot join thread before it is started" (a CI run: exit 1 where 0 was due). Here the
    signal is sent as the thread is about to start: the server must stop with the signal, the generation run out."""
    from specdec_cli import signals
    from specdec_cli.serve.jobs import Job
    from specdec_cli.serve.pool import Pool

    start = threading.Thread.start

    def signalled(thread):
        if thread.name == "specdec-slot":
            os.kill(os.getpid(), signal.SIGTERM)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", signalled)
    job, jobs = Job(lambda: iter(["an item"]), Claim()), queue.Queue()
    jobs.put(job)
    restore = signals.install()
    try:
        with pytest.raises(signals.Interrupted):
            Pool(Steps()).work(threading.Event(), jobs, lambda: None)
        assert job.done.is_set() and job.out.get_nowait() == "an item"
    finally:
        restore()


@pytest.mark.parametrize("where", ["_decode", "_stake"])
def test_a_signal_that_cuts_a_step_anywhere_leaves_its_generations_to_end_at_the_stop(monkeypatch, where):
    """SIGTERM raises on the decoding thread wherever it is: in the decode, or after it, before the step has answered
    its parts (a CI run: the stream of `test_sigterm_mid_stream_ends_the_stream_cleanly_and_exits_0` hung, its part
    taken from the waiting list and never answered, and the server's close waited on its connection for ever)."""
    from specdec_cli.batching import rendezvous

    steps, ctx, errors = Steps(), Recorder(), []

    def run():
        with steps.joined():
            try:
                steps.decode(ctx, Part([1], [0], [(0,)], 0))
            except RuntimeError as e:
                errors.append(str(e))

    def signalled(*args):
        raise KeyboardInterrupt  # as signals.py's handler raises, on this thread

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    handed_over(steps, 1)
    monkeypatch.setattr(rendezvous.Steps if where == "_decode" else rendezvous, where, signalled)
    with pytest.raises(KeyboardInterrupt):
        steps.step(1.0)
    steps.close(RuntimeError("shutting down"))
    thread.join(10)
    assert not thread.is_alive() and errors == ["shutting down"]
