"""The target's own draft heads (MTP / NextN), on tiny fixtures written like the hybrid ones (tiny_models.py):
mimo2 (attention only) with two chained heads (`mtp`) and with one (`mtp_one`), the Gated DeltaNet hybrid qwen35
with its one (`qwen35_mtp`), and a mirror head that repeats the target's last prediction (`mtp_mirror`).

Greedy output must be target-only output token for token, whatever the draft length and whether auto chooses the
heads; sampling must be distributed as target-only sampling; the heads' cells must hold exactly the committed
text (debug=True checks them after every round, with the target's)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from conftest import accept_every_draft, config, run_engine, same_distribution, sample_counts

from specdec_cli import drafting
from specdec_cli.run_inputs import Inputs
from specdec_cli.backend import mtp as backend
from specdec_cli.cli import main
from specdec_cli.drafting.mtp import MAX_LAG, PROMPT_ROWS, HeadCache, MtpDrafter
from specdec_cli.engine.events import Round
from specdec_cli.engine.stats import collect
from specdec_cli.errors import SpecdecError
from specdec_cli.options import RunConfig
from specdec_cli.session import open_session

HEADS = ["mtp", "mtp_one", "qwen35_mtp"]
PROMPTS = ["hello world", "The quick brown fox", "abcabcabcabc", "def f(x):\n    return x"]


@pytest.fixture(scope="module")
def target_only(models):
    out = {}
    for name in HEADS:
        with open_session(config(models, None, target=models[name], max_tokens=40)) as s:
            out |= {(name, p): run_engine(s, p)[0] for p in PROMPTS}
    return out


def heads(open_pair, models, name: str, **kw):
    return open_pair(None, target=models[name], drafter="mtp", **({"max_tokens": 40} | kw))


def specdec(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_greedy_mtp_drafts_are_target_only_output(open_pair, models, target_only, name, k):
    s = heads(open_pair, models, name, draft_tokens=k, p_min=0.0)
    drafted = accepted = 0
    for prompt in PROMPTS:
        ids, stats, _ = run_engine(s, prompt)
        assert ids == target_only[name, prompt], (prompt, k)
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert 0 < accepted < drafted  # the heads drafted, were right and wrong


@pytest.mark.parametrize("name", HEADS)
def test_auto_with_the_heads_is_target_only_output(open_pair, models, target_only, frozen_costs, name):
    """A model with heads and no draft: auto's model source is the heads (frozen_costs: it drafts, as where it
    pays, whatever this machine measures), with lookup beside them, and -k auto over the heads alone."""
    for drafter, k in (("auto", None), ("mtp", None)):
        s = open_pair(None, target=models[name], drafter=drafter, draft_tokens=k, max_tokens=40)
        rounds = 0
        for prompt in PROMPTS:
            ids, stats, _ = run_engine(s, prompt)
            assert ids == target_only[name, prompt], (prompt, drafter)
            rounds += stats.by_drafter["mtp"].drafted if "mtp" in stats.by_drafter else 0
        assert rounds > 0, drafter  # it chose the heads


def test_auto_chooses_the_heads_where_there_is_no_draft(capsys, models):
    """The default drafter of a target with heads and no --draft is auto over them; with a draft, the draft."""
    code, out, err = specdec(capsys, "generate", "hello", "--target", str(models["mtp"]), "-n", "4", "--json")
    assert code == 0, err
    cfg = json.loads(out)["config"]
    assert cfg["drafter"] == "auto" and cfg["draft"] is None and "MTP heads" in cfg["draft_choice"]
    with open_session(config(models, None, target=models["mtp"], drafter="auto")) as s:
        assert s.target.heads
        sources = drafting.Sources(k=None, costs=lambda: s.curve.get([1, 2]), draft=None, heads=s.home.heads)
        assert isinstance(sources.auto().draft_model, MtpDrafter)
    with open_session(config(models, None, target=models["target"], drafter="auto")) as s:
        assert not s.target.heads  # no heads: nothing loaded, auto drafts by lookup alone


def test_the_mirror_head_sees_the_targets_hidden_state_at_the_right_position(open_pair, models, monkeypatch):
    """A mirror head's logits are the target's own at the position before (tiny_models.py): its first draft token
    is the last committed token wherever the target chose that token (every round after the first). A hidden
    state one position off would propose another token nearly always."""
    seen = []
    propose = MtpDrafter.propose

    def spy(self, committed, k, sampler, rng, policy=drafting.model.FIXED):
        draft = propose(self, committed, k, sampler, rng, policy)
        seen.append((committed[-1], draft.tokens[:1]))
        return draft

    monkeypatch.setattr(MtpDrafter, "propose", spy)
    s = heads(open_pair, models, "mtp_mirror", draft_tokens=1, p_min=0.0)
    for prompt in PROMPTS:
        seen.clear()
        run_engine(s, prompt)
        later = [(last, d) for last, d in seen[1:] if d]
        assert len(later) > 10
        assert sum(d == [last] for last, d in later) >= 0.9 * len(later), later


def test_chained_heads_draft_one_token_each(open_pair, models, target_only):
    """Two heads: a round drafts at most two tokens (head 0 the first, head 1 the second, from head 0's hidden
    state), and head 1's tokens are accepted too."""
    s = heads(open_pair, models, "mtp", draft_tokens=6, p_min=0.0)
    rounds = []
    for prompt in PROMPTS:
        events = list(s.generate(s.prompt_tokens(prompt)))
        assert collect(iter(events)).tokens == target_only["mtp", prompt]
        rounds += [e for e in events if isinstance(e, Round)]
    assert max(r.drafted for r in rounds) == 2
    assert sum(r.accepted == 2 for r in rounds) > 0  # the second head was right


def test_the_hybrid_target_drafts_within_its_snapshots(open_pair, models, target_only):
    """qwen35_mtp keeps recurrent-state snapshots: a draft longer than them is cut to them, and a rejected tail
    is rolled out of the target's state (debug=True checks the caches after every round)."""
    s = heads(open_pair, models, "qwen35_mtp", draft_tokens=3, p_min=0.0)
    assert s.target_ctx.max_rollback == 3
    for prompt in PROMPTS:
        events = list(s.generate(s.prompt_tokens(prompt), draft_tokens=8))
        assert max(e.drafted for e in events if isinstance(e, Round)) <= 3
        assert collect(iter(events)).tokens == target_only["qwen35_mtp", prompt]


def test_sampling_with_the_heads_is_distributed_as_target_only_sampling(open_pair, models, monkeypatch):
    """And the negative control: accepting every draft token samples the heads' distribution, which the
    chi-square tells apart."""
    kw = dict(max_tokens=2, temp=1.5, top_k=3)
    spec = heads(open_pair, models, "mtp_one", p_min=0.0, **kw)
    plain = open_pair(None, target=models["mtp_one"], drafter="none", **kw)
    spec_counts, stats = sample_counts(spec, "hello world", 1500, draft_tokens=2)
    plain_counts, _ = sample_counts(plain, "hello world", 1500)
    ok, stat, cells = same_distribution(spec_counts, plain_counts)
    assert ok, (stat, cells)
    assert cells > 3 and 0.0 < stats.accept_rate < 1.0

    accept_every_draft(monkeypatch)
    wrong = heads(open_pair, models, "mtp_one", p_min=0.0, **kw)
    assert not same_distribution(sample_counts(wrong, "hello world", 1500, draft_tokens=2)[0], plain_counts)[0]


def test_exact_mode_with_the_heads_is_target_only_output(models):
    for prompt in PROMPTS:
        runs = {}
        for drafter in ("none", "mtp"):
            with open_session(
                config(
                    models,
                    None,
                    target=models["mtp_one"],
                    drafter=drafter,
                    exact=True,
                    p_min=0.0,
                    draft_tokens=3,
                    max_tokens=40,
                )
            ) as s:
                runs[drafter] = run_engine(s, prompt, logprobs=2)
        assert runs["mtp"][0] == runs["none"][0], prompt
        assert runs["mtp"][1].drafted > 0


def test_the_prompt_feeds_the_heads_its_last_rows_only(open_pair, models):
    """The heads cost the prefill almost nothing: the target outputs the prompt's last PROMPT_ROWS rows, and the
    heads hold those positions and the answer's."""
    s = heads(open_pair, models, "mtp_one", draft_tokens=2, p_min=0.0, max_tokens=8)
    prompt = s.prompt_tokens("x" * 200)
    collect(s.generate(prompt))
    cache = s.home.heads()
    assert cache.start == len(prompt) - PROMPT_ROWS
    assert cache.heads.pos_range(0)[0] == cache.start


def test_a_model_without_heads_is_refused_in_one_line(capsys, models):
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "--drafter", "mtp")
    assert code == 2
    assert err.startswith("error: --drafter mtp: target.gguf has no MTP (NextN) draft heads"), err
    assert len(err.strip().splitlines()) == 2  # the error and its hint


def test_a_missing_binding_is_refused_in_one_line_and_auto_goes_on_without_the_heads(capsys, models, monkeypatch):
    """A llama-cpp-python without the experimental module (or one of its calls): --drafter mtp says which, and
    nothing else changes: auto on the same model drafts as it would without heads."""
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_cpp_ext", None)  # its import fails, as where it is missing
    assert backend.missing().startswith("llama_cpp.llama_cpp_ext")
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(models["mtp"]), "--drafter", "mtp")
    assert code == 2
    assert err.startswith("error: --drafter mtp: this llama-cpp-python lacks llama_cpp.llama_cpp_ext"), err
    code, out, err = specdec(capsys, "generate", "hello", "--target", str(models["mtp"]), "-n", "8", "--json")
    assert code == 0, err
    assert "mtp" not in json.loads(out)["stats"]["by_drafter"]
    monkeypatch.undo()
    monkeypatch.setattr(backend, "CALLS", (*backend.CALLS, "llama_no_such_call"))
    assert backend.missing() == "llama_cpp.llama_cpp_ext.llama_no_such_call"


def test_models_info_says_how_many_heads(capsys, models):
    for name, n in (("mtp", 2), ("mtp_one", 1), ("qwen35_mtp", 1), ("target", 0)):
        code, out, _ = specdec(capsys, "models", "info", str(models[name]), "--json")
        assert code == 0 and json.loads(out)["mtp_layers"] == n, name


def test_the_heads_cost_and_acceptance_are_reported(capsys, models):
    code, out, err = specdec(
        capsys,
        "generate",
        "hello world",
        "--target",
        str(models["mtp_one"]),
        "--drafter",
        "mtp",
        "-k",
        "3",
        "--p-min",
        "0",
        "-n",
        "24",
        "--json",
    )
    assert code == 0, err
    mine = json.loads(out)["stats"]["by_drafter"]["mtp"]
    assert mine["drafted"] > 0 and mine["draft_ms_per_token"] > 0
    assert mine["accept_rate"] == pytest.approx(mine["accepted"] / mine["drafted"], abs=1e-4)
    assert json.loads(out)["config"]["p_min"] == 0.0
    code, out, _ = specdec(
        capsys, "generate", "hello", "--target", str(models["mtp"]), "--drafter", "mtp", "-n", "4", "--json"
    )
    assert json.loads(out)["config"]["p_min"] == 0.6 and json.loads(out)["config"]["draft_tokens"] == 2


def test_the_heads_keep_what_a_servers_next_turn_shares(models):
    """A session's runs (a server's turns): the heads keep the cells of the prefix the next prompt shares, runs of
    other drafters leave them alone (the target's decodes feed them only in runs that use them), and auto's first
    timing of a head empties them without the bookkeeping losing track (debug=True checks them every round)."""
    first = "The quick brown fox"
    turns = [(first, "mtp", 2), (first + " jumps", "none", None), (first + " jumps over", "auto", None)]
    turns += [(first, "mtp", 2)]
    with open_session(config(models, None, target=models["mtp_one"], drafter="auto", max_tokens=24)) as alone:
        expected = [run_engine(alone, text, drafter="none")[0] for text, _, _ in turns]
    with open_session(config(models, None, target=models["mtp_one"], drafter="auto", max_tokens=24)) as s:
        for (text, drafter, k), want in zip(turns, expected):
            r = collect(s.generate(s.prompt_tokens(text), Inputs(reuse=True), drafter=drafter, draft_tokens=k))
            assert r.tokens == want, (text, drafter)
        assert r.stats.by_drafter["mtp"].drafted > 0
        assert s.home.heads().end > len(s.prompt_tokens(first))  # the last turn's answer is in the heads' cells


def test_a_file_that_counts_heads_it_does_not_carry_has_none(capsys, models, tmp_path):
    """nextn_predict_layers kept, the heads' tensors left out (a converter's --no-mtp, a hostile file): llama.cpp
    loads it, and its heads' graph would abort the process. specdec sees no heads: auto runs without them,
    --drafter mtp is refused in one line."""
    from gguf import GGUFReader

    from tiny_models import byte_vocab, mimo2_weights, write_mimo2

    vocab = byte_vocab()
    trunk = {k: v for k, v in mimo2_weights(1234, len(vocab), heads=1).items() if not k.startswith("blk.2.")}
    path = write_mimo2(
        tmp_path / "stripped.gguf", trunk | {"blk.2.attn_norm.weight": trunk["blk.0.attn_norm.weight"]}, vocab
    )
    assert GGUFReader(path).fields["mimo2.nextn_predict_layers"].parts[-1][0] == 1
    assert backend.heads_in_header(path) == 0
    code, out, err = specdec(capsys, "generate", "hello", "--target", str(path), "-n", "8", "--json")
    assert code == 0, err
    assert "mtp" not in json.loads(out)["stats"]["by_drafter"]
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(path), "--drafter", "mtp")
    assert code == 2 and "has no MTP (NextN) draft heads" in err
    code, out, _ = specdec(capsys, "models", "info", str(path), "--json")
    assert code == 0 and json.loads(out)["mtp_layers"] == 0


def test_a_server_drafts_with_the_heads_per_request(models):
    """`specdec serve` on a model with heads: a request may ask for them (drafter mtp) or not, and gets the same
    text; a server whose target has none answers such a request with a 400 that says so, and goes on."""
    from test_serve import Served

    body = {"prompt": "Hello there", "max_tokens": 20, "temperature": 0}
    # (a fixed -k with no floor: with -k auto whether the heads draft is what this machine's measured costs say, and
    # a CI run once measured them not to pay)
    s = Served("--target", models["mtp_one"], "-k", "2", "--p-min", "0", "--debug", "--no-lookup-cache")
    try:
        answers = [s.post("/v1/completions", body | extra) for extra in ({"drafter": "mtp"}, {"drafter": "none"}, {})]
    finally:
        assert s.stop() == 0
    assert all(status == 200 for status, _, _ in answers), answers
    texts = {obj["choices"][0]["text"] for _, _, obj in answers}
    assert len(texts) == 1
    assert answers[0][2]["speculative"]["by_drafter"]["mtp"]["drafted"] > 0
    for target, drafter, why in (
        (models["target"], "auto", "has no MTP (NextN) draft heads"),
        (models["mtp_one"], "lookup", "was loaded without its MTP heads"),  # its drafter never uses them
    ):
        s = Served("--target", target, "--drafter", drafter, "--no-lookup-cache")
        try:
            status, _, obj = s.post("/v1/completions", body | {"drafter": "mtp"})
            assert status == 400 and why in obj["error"]["message"]
            assert s.post("/v1/completions", body)[0] == 200
        finally:
            assert s.stop() == 0


@pytest.mark.parametrize("name", ["mtp", "mtp_one"])
def test_the_heads_draft_to_the_end_of_the_context(models, name):
    """Every head's sequence holds every position the target does: chained heads (a sequence each) too, up to
    the context's last position (a cache shared by the heads' sequences ran out of cells halfway)."""
    runs = {}
    for drafter in ("none", "mtp"):
        cfg = config(models, None, target=models[name], drafter=drafter, p_min=0.0, ctx_size=256, max_tokens=400)
        with open_session(cfg) as s:
            runs[drafter] = collect(s.generate(s.prompt_tokens("Hello there")))
    assert runs["mtp"].tokens == runs["none"].tokens
    assert runs["mtp"].stats.stop_reason == "context" and runs["mtp"].stats.accepted > 0


def test_a_drafters_own_floor_follows_a_change_of_drafter(models):
    """A request or bench row for mtp on a session of another drafter gets mtp's p-min, unless it names one; a
    request for another drafter on an mtp session does not inherit mtp's."""
    auto = RunConfig(target=models["mtp"], drafter="auto")
    assert auto.p_min == 0.0 and auto.override(drafter="mtp").p_min == 0.6
    assert auto.override(drafter="mtp", p_min=0.1).p_min == 0.1
    assert RunConfig(target=models["mtp"], drafter="mtp").override(drafter="lookup").p_min == 0.0
    assert RunConfig(target=models["mtp"], drafter="mtp", p_min=0.3).override(drafter="lookup").p_min == 0.3


class FakeHeads:
    """What HeadCache asks of backend/mtp.Heads, without llama.cpp: the cells it was told to forget."""

    n, n_embd = 1, 4

    def __init__(self):
        self.taken, self.forgotten = [], []

    def forget(self, p0):
        self.forgotten.append(p0)


def test_heads_that_fell_far_behind_start_again_where_the_rows_reach():
    """Rounds without the heads (auto drafting otherwise) leave them MAX_LAG positions behind: they start again at
    the oldest row kept and are fed from there to the last committed token, not emptied to draft nothing."""
    cache = HeadCache(FakeHeads())
    n = 1000
    cache.heads.taken.append((list(range(n - 1)), [(0,)] * (n - 1), np.zeros((n - 1, 4), np.float32)))
    cache.begin(list(range(n - 1)))
    tokens, hidden = cache.pairs(list(range(n)))
    assert tokens and cache.start + len(tokens) == n  # fed through the last committed token
    assert len(tokens) <= MAX_LAG + 2 and len(hidden) == len(tokens)


def test_heads_llama_cpp_will_not_open_leave_auto_without_them(capsys, models, monkeypatch):
    """llama.cpp may refuse the heads a context (an architecture it loads heads for and cannot run, memory): auto,
    the default, drafts without them; --drafter mtp says why in one line."""

    def refuse(*args, **kw):
        raise SpecdecError("llama.cpp cannot draft with the MTP heads of mtp.gguf: no context")

    monkeypatch.setattr(backend, "Heads", refuse)
    code, out, err = specdec(capsys, "generate", "hello", "--target", str(models["mtp"]), "-n", "8", "--json")
    assert code == 0, err
    assert "mtp" not in json.loads(out)["stats"]["by_drafter"]
    code, _, err = specdec(capsys, "generate", "hello", "--target", str(models["mtp"]), "--drafter", "mtp")
    assert code == 1 and err.startswith("error: llama.cpp cannot draft with the MTP heads"), err
