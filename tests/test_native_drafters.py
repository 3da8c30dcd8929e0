"""EAGLE-3 and DFlash drafts (drafts trained on the target's hidden states), on the counting target and the drafts
built to compute it (native_models.py): greedy output is target-only output token for token whatever they draft;
the designed drafts are accepted and the negative controls (they read the wrong layer) never are; round by round,
their drafts are the drafts llama.cpp's own loop makes on the same files (llama-speculative-simple, built by
scripts/llama_reference.py: CI builds it); sampling is distributed as target-only sampling; bad files are one line
and exit 2, never an abort inside llama.cpp. debug=True checks both caches after every round."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import FrozenCosts, accept_every_draft, run_engine, same_distribution, sample_counts

import native_models as nm
from specdec_cli.backend import draft_files
from specdec_cli.cli import main
from specdec_cli.drafting import cost as costmodel
from specdec_cli.drafting import measure as measurement
from specdec_cli.drafting.auto import AutoDrafter
from specdec_cli.drafting.dflash import DFlashDrafter
from specdec_cli.drafting.eagle3 import Eagle3Drafter
from specdec_cli.drafting.hidden import FLUSH, WINDOW, HiddenDrafter
from specdec_cli.engine.events import Prefilled, Round
from specdec_cli.engine.stats import collect
from specdec_cli.errors import UsageError
from specdec_cli.options import RunConfig
from specdec_cli.run_inputs import Inputs
from specdec_cli.session import open_session

sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))
import llama_reference  # noqa: E402

# Where it is built, named before the tests move HOME (conftest: no test sees the user's stores)
os.environ.setdefault("SPECDEC_LLAMA_TOOLS", str(llama_reference.folder()))

DRAFTS = ["eagle3", "dflash", "dflash2", "eagle3_d2t"]
WRONG = ["eagle3_wrong", "dflash_wrong"]
# Counting prompts (the designed drafts' home ground), and others: the target counts on from any last byte.
PROMPTS = ["abcdefghijkl", "Hello, world", "xyz", "0123456789" * 3]


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> dict[str, Path]:
    return nm.write_native_set(tmp_path_factory.mktemp("native"))


def cfg(native, draft: str | None, **kw) -> RunConfig:
    base = dict(
        target=native["counter"],
        draft=native[draft] if draft else None,
        drafter=_kind(draft) if draft else "none",
        threads=2,
        ctx_size=512,
        debug=True,
        max_tokens=40,
    )
    return RunConfig(**(base | kw))


def _kind(draft: str) -> str:
    return "eagle3" if draft.startswith("eagle3") else "dflash"


@pytest.fixture(scope="module")
def target_only(native):
    with open_session(cfg(native, None)) as s:
        return {p: run_engine(s, p)[0] for p in PROMPTS}


def specdec(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("draft", DRAFTS + WRONG)
@pytest.mark.parametrize("k", [1, 3, 4, 7])
def test_greedy_output_is_target_only_output(native, target_only, draft, k):
    with open_session(cfg(native, draft, draft_tokens=k)) as s:
        drafted = accepted = 0
        for prompt in PROMPTS:
            ids, stats, _ = run_engine(s, prompt)
            assert ids == target_only[prompt], (prompt, k)
            mine = stats.by_drafter[_kind(draft)]
            drafted, accepted = drafted + mine.drafted, accepted + mine.accepted
    assert drafted > 0
    if draft in WRONG:
        assert accepted == 0  # one byte behind, always: a draft that reads the wrong layer accepts nothing
    elif k > 1:
        assert 0.3 * drafted < accepted < drafted  # right until the target skips a byte


def test_the_target_counts_as_designed(native, target_only):
    """The fixture's own check: the target writes what target_rule says (so acceptance means what it should)."""
    assert bytes(target_only["xyz"][:5]) != b""  # token ids are bytes + 3
    assert bytes(t - 3 for t in target_only["xyz"]) == nm.counting(ord("z"), 40)


def _ours(native, draft: str, k: int, n: int, prompt: str) -> list[llama_reference.Round]:
    drafts = []
    propose = HiddenDrafter.propose

    def spy(self, *a, **kw):
        d = propose(self, *a, **kw)
        drafts.append(d)
        return d

    HiddenDrafter.propose = spy
    try:
        with open_session(cfg(native, draft, draft_tokens=k, max_tokens=n, ctx_size=2048)) as s:
            events = list(s.generate(s.prompt_tokens(prompt)))
    finally:
        HiddenDrafter.propose = propose
    rounds = [e for e in events if isinstance(e, Round)]
    out = [llama_reference.Round(tuple(d.tokens), len(d.tokens), r.accepted) for d, r in zip(drafts, rounds)]
    # llama.cpp's last round drafts with no room left (its dp.n_max 0 truncates nothing: pitfall 8); ours drafts
    # none there. The rounds before it are the comparison.
    return out[:-1] if drafts and drafts[-1].k == 0 else out


@pytest.mark.skipif(
    llama_reference.tool() is None, reason="llama-speculative-simple not built: scripts/llama_reference.py build"
)
@pytest.mark.parametrize("draft", ["eagle3", "dflash", "dflash2", "eagle3_wrong", "dflash_wrong"])
@pytest.mark.parametrize("k", [2, 4])
def test_drafts_are_llama_cpps_round_by_round(native, draft, k):
    """llama-speculative-simple --spec-type draft-eagle3 / draft-dflash on the same files, greedy: every round the
    same draft (DFlash2 logs none: its length) and the same count accepted; and the same text."""
    for prompt in PROMPTS[:3]:
        theirs = llama_reference.rounds(native["counter"], native[draft], f"draft-{_kind(draft)}", k, 40, prompt)
        ours = _ours(native, draft, k, 40, prompt)
        assert len(ours) >= 5
        assert len(theirs) >= len(ours)
        for i, (a, b) in enumerate(zip(theirs, ours)):
            tokens = a.draft if a.draft is not None else b.draft  # (DFlash2's walk is not in llama.cpp's log)
            assert llama_reference.Round(tokens, a.drafted, a.accepted) == b, (prompt, i)


def test_a_designed_draft_is_accepted_where_the_target_does_not_skip(native):
    """EAGLE-3 drafts x + 2, x + 3, ... from the features of x; DFlash's block reads OFFSET positions back: both
    drafts are whole wherever no skip falls in them (so acceptance is exercised, not luck)."""
    for draft in ("eagle3", "dflash"):
        with open_session(cfg(native, draft, draft_tokens=3, max_tokens=60)) as s:
            events = list(s.generate(s.prompt_tokens("0123456789" * 3)))
        rounds = [e for e in events if isinstance(e, Round)]
        assert sum(r.accepted == 3 for r in rounds) >= len(rounds) // 3, draft


@pytest.mark.parametrize("draft", ["eagle3", "dflash"])
def test_sampling_is_distributed_as_target_only_sampling(native, draft, monkeypatch):
    """At temperature 3 over the best 3 (a few likely answers), with the draft's own distribution as q: after
    "abcdef" its first token's is the target's (always accepted), its second's is for "h", which the target skips
        (mostly rejected); and the negative control: accepting every draft token samples the draft's distribution,
        which the chi-square tells apart."""
    kw = dict(max_tokens=3, temp=3.0, top_k=3, draft_tokens=2)
    with open_session(cfg(native, None, **kw)) as plain:
        plain_counts, _ = sample_counts(plain, "abcdef", 1500)
    with open_session(cfg(native, draft, **kw)) as spec:
        spec_counts, stats = sample_counts(spec, "abcdef", 1500)
    ok, stat, cells = same_distribution(spec_counts, plain_counts)
    assert ok, (stat, cells)
    assert cells > 3 and 0.0 < stats.accept_rate < 1.0

    accept_every_draft(monkeypatch)
    with open_session(cfg(native, draft, **kw)) as wrong:
        assert not same_distribution(sample_counts(wrong, "abcdef", 1500)[0], plain_counts)[0]


@pytest.mark.parametrize("draft", ["eagle3", "dflash"])
def test_exact_mode_is_target_only_output(native, draft):
    runs = {}
    for name in (None, draft):
        with open_session(cfg(native, name, exact=True, draft_tokens=4)) as s:
            runs[name] = [run_engine(s, p, logprobs=2) for p in PROMPTS]
    for (ids, _, _), (want, _, _) in zip(runs[draft], runs[None]):
        assert ids == want
    assert sum(r[1].accepted for r in runs[draft]) > 0


@pytest.mark.parametrize("draft", ["eagle3", "dflash"])
def test_a_grammar_masks_the_drafts_as_the_target(native, draft):
    """Letters only: the target's best after "z" is "{", which the grammar refuses; drafts are masked the same way
    and the answer is constrained target-only decoding's."""
    gbnf = "root ::= [a-z]+"
    with open_session(cfg(native, None, max_tokens=30)) as s:
        want = run_engine(s, "uvwxy", gbnf=gbnf)[0]
    with open_session(cfg(native, draft, draft_tokens=4, max_tokens=30)) as s:
        ids, stats, text = run_engine(s, "uvwxy", gbnf=gbnf)
    assert ids == want and text.isalpha()
    assert stats.drafted > 0


def test_model_and_auto_draft_with_the_files_own_drafter(native, target_only, frozen_costs):
    """`--drafter model` with an EAGLE-3 file drafts with EAGLE-3; auto's model source is it (frozen_costs: a
    curve where drafting pays, as on a GPU); -k auto weighs its length."""
    for draft in ("eagle3", "dflash"):
        for drafter, k in (("model", 4), ("auto", None), (_kind(draft), None)):
            with open_session(cfg(native, draft, drafter=drafter, draft_tokens=k)) as s:
                assert s.drafter == (_kind(draft) if drafter == "model" else drafter)
                ids, stats, _ = run_engine(s, PROMPTS[0])
            assert ids == target_only[PROMPTS[0]]
            assert stats.by_drafter[_kind(draft)].drafted > 0, (draft, drafter)


def test_a_draft_of_the_wrong_kind_is_refused_in_one_line(capsys, native, models):
    counter = native["counter"]
    cases = [
        (["--draft", native["eagle3"], "--drafter", "dflash"], "--drafter dflash drafts with a DFlash draft"),
        (["--draft", native["dflash"], "--drafter", "eagle3"], "--drafter eagle3 drafts with an EAGLE-3 draft"),
        (["--draft", models["draft"], "--drafter", "eagle3"], "and a draft model was given"),
        (["--drafter", "eagle3"], "eagle3 needs a draft model"),
        (["--draft", native["eagle3"], "--drafter", "model", "--branches", "2"], "EAGLE-3 drafts a chain"),
        (["--draft", native["dflash"], "--drafter", "dflash", "--branches", "2"], "--branches 2"),
    ]
    for args, message in cases:
        code, _, err = specdec(capsys, "generate", "abc", "--target", counter, "-n", "4", *args)
        assert code == 2, (args, err)
        assert err.startswith("error: ") and message in err, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 2


BAD = {
    "eagle3_hidden32": "was made for a target of hidden size 32; counter.gguf has 64",
    "eagle3_layer5": "reads target layer 5; counter.gguf has layers 0 to 1",
    "dflash_layer2": "reads target layer 2; counter.gguf has layers 0 to 1",
    "dflash_nomask": "has no mask token",
    "dflash_embd32": "was made for a target of hidden size 32",
    "eagle3_d2t_bad": "its d2t map names token ids outside its vocabulary of 259",
    "eagle3_d2t_short": "its d2t map has 200 ids for an output head of 256 rows",
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_draft_file_is_one_line_and_exit_2(capsys, native, bad):
    """Each of these aborts inside llama.cpp (native-drafters.md): here it is refused before llama.cpp sees the
    pair, by every drafter that would use it."""
    for drafter in ("auto", "model", _kind(bad)):
        code, _, err = specdec(
            capsys, "generate", "abc", "--target", native["counter"], "--draft", native[bad], "--drafter", drafter
        )
        assert code == 2, (bad, drafter, err)
        assert err.startswith("error: ") and BAD[bad] in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 2  # the error and its hint


def test_any_such_draft_for_a_qwen2_target_is_one_line(capsys, native):
    for draft in ("eagle3", "dflash"):
        code, _, err = specdec(capsys, "generate", "abc", "--target", native["counter_qwen2"], "--draft", native[draft])
        assert code == 2 and "is a qwen2 model, whose layer inputs llama.cpp does not hand out" in err, err


def test_the_checks_read_headers_alone(native):
    """draft_files.problem on each bad file's header, and on a target that would have to hand out its final layer."""
    for name, why in BAD.items():
        d = draft_files.read(native[name])
        assert why.replace("counter.gguf", "T") in draft_files.problem(d, "T", "llama", 64, 2)
    d = draft_files.read(native["dflash_layer2"])
    assert draft_files.problem(d, "T", "mimo2", 64, 2) is None  # mimo2's graph hands out layer n_layer too
    assert draft_files.read(native["counter"]) is None
    # A file embedding fewer tokens than its vocabulary: a run refuses it as damaged (gguf_file's header check), a
    # listing (models pair) by this check on its header's facts.
    from specdec_cli.models import facts

    d = draft_files.DraftFile(path=native["eagle3_embd_short"], **facts.read(native["eagle3_embd_short"]).draft)
    assert "embeds 100 tokens" in draft_files.problem(d, "T", "llama", 64, 2)
    assert draft_files.read(native["dflash2"]).variant == "dflash2"


def test_the_cells_follow_the_text_across_runs(native, monkeypatch):
    """A session's runs (a server's turns): the draft keeps the cells of the prefix the next prompt shares (EAGLE-3's
    last pair is fed again from the rows kept), a run of another drafter leaves them alone, and a run interrupted
    after a round leaves them whole (debug=True checks them every round)."""
    first = "abcdefghijkl"
    turns = [(first, "eagle3"), (first + "mno", "eagle3"), (first + "mnop", "none"), (first, "auto"), ("xyz", "eagle3")]
    with open_session(cfg(native, None)) as alone:
        expected = [run_engine(alone, text)[0] for text, _ in turns]
    with open_session(cfg(native, "eagle3", drafter="auto", draft_tokens=4)) as s:
        for i, ((text, drafter), want) in enumerate(zip(turns, expected)):
            r = collect(s.generate(s.prompt_tokens(text), Inputs(reuse=True), drafter=drafter))
            assert r.tokens == want, (text, drafter)
            if i == 1:
                assert s.home.hidden().start == 0  # the first turn's cells were kept, not started afresh
                assert s.target_ctx.tap is not None  # its runs attach the tap ...
        assert s.target_ctx.tap is None or s.drafter == "auto"
        collect(s.generate(s.prompt_tokens("abc"), drafter="none"))
        assert s.target_ctx.tap is None  # ... and a run that does not draft with it detaches it
        events = s.generate(s.prompt_tokens(first), drafter="eagle3")
        for e in events:
            if isinstance(e, Round):
                break
        events.close()  # interrupted after its first round
        r = collect(s.generate(s.prompt_tokens(first), Inputs(reuse=True), drafter="eagle3"))
        assert r.tokens == expected[0]


def test_auto_feeds_the_draft_from_its_first_draft_on(native, monkeypatch):
    """Under auto (a curve where it could pay) the draft is fed nothing until auto first drafts with it: the rows
    wait, the last WINDOW of them, so that a run it never drafts in costs nothing but reading them; its first draft
    feeds them (and --debug's checks hold from there). --drafter dflash feeds from the prompt on, FLUSH at a time."""
    gpu = FrozenCosts({1: 0.01, 16: 0.011, 32: 0.012}, 0.0005, 32)
    monkeypatch.setattr(measurement, "measure", lambda *a, **kw: gpu)
    pays = AutoDrafter._model_pays
    monkeypatch.setattr(AutoDrafter, "_model_pays", lambda *a, **kw: None)  # it never drafts with the model
    long = dict(ctx_size=4096, max_tokens=3 * FLUSH, remeasure=True)
    with open_session(cfg(native, "dflash", drafter="auto", draft_tokens=None, **long)) as s:
        r = collect(s.generate(s.prompt_tokens("abcdefghijkl")))
        assert "dflash" not in r.stats.by_drafter and s.home.hidden().end == 0  # never drafted, never fed
        assert len(s.home.hidden().rows) <= WINDOW
        monkeypatch.setattr(AutoDrafter, "_model_pays", pays)
        prompt = "abcdefghijkl" * 100  # longer than the window: its last WINDOW rows are fed at the first draft
        r = collect(s.generate(s.prompt_tokens(prompt), max_tokens=64))
        assert r.stats.by_drafter["dflash"].drafted > 0
        assert s.home.hidden().start > 0 and s.home.hidden().end >= len(s.prompt_tokens(prompt)) - 1
    with open_session(cfg(native, "dflash", drafter="dflash", draft_tokens=4, **long)) as s:
        collect(s.generate(s.prompt_tokens("abcdefghijkl" * 100), max_tokens=4))
        assert s.home.hidden().start == 0  # the whole prompt, fed as it came


@pytest.mark.parametrize("draft", ["eagle3", "dflash"])
def test_drafts_to_the_end_of_the_context(native, draft):
    runs = {}
    for name in (None, draft):
        with open_session(cfg(native, name, ctx_size=128, max_tokens=400, draft_tokens=4)) as s:
            runs[name] = collect(s.generate(s.prompt_tokens("abcdefghijkl")))
    assert runs[draft].tokens == runs[None].tokens
    assert runs[draft].stats.stop_reason == "context" and runs[draft].stats.accepted > 0


def test_a_long_prompt_is_fed_in_batches(native):
    """A prompt longer than FLUSH rows and than a draft decode (hidden.SPLIT): every position reaches the cells."""
    prompt = bytes((b % 200) + 32 for b in range(700)).decode("latin-1")
    for draft in ("eagle3", "dflash"):
        with open_session(cfg(native, draft, ctx_size=2048, max_tokens=20, draft_tokens=3)) as s:
            tokens = s.prompt_tokens(prompt)
            r = collect(s.generate(tokens))
            assert s.home.hidden().start == 0 and s.home.hidden().end >= len(tokens) - 1
        assert r.stats.drafted > 0


def test_auto_weighs_them_by_the_cost_curve(native, monkeypatch):
    """On a GPU-like curve (verifying 16 costs 1.1 of one, a draft decode 1/20 of a target's) auto drafts with them,
    and DFlash's whole block pays (one decode drafts it all); on a CPU-like one (every row its own cost, a draft
    decode half a target's) it drafts nothing with them: never slower than the target alone."""
    gpu = FrozenCosts({1: 0.01, 16: 0.011, 32: 0.012}, None, 32)
    cpu = FrozenCosts({1: 0.01, 2: 0.02, 4: 0.04, 8: 0.08, 16: 0.16, 32: 0.32}, None, 32)
    for curve, draft_cost, pays in ((gpu, 0.0005, True), (cpu, 0.005, False)):  # (cpu: left out from the start)
        monkeypatch.setattr(measurement, "measure", lambda *a, c=curve, **kw: c)
        for cls in (Eagle3Drafter, DFlashDrafter):
            monkeypatch.setattr(cls, "time_one", lambda self, t=draft_cost: (t, t, 0.0))  # (feeding: free)
        for draft in ("eagle3", "dflash"):
            curve.draft, curve.draft_source = None, None  # (auto times a draft decode where the curve has none)
            run = cfg(native, draft, drafter="auto", draft_tokens=None, max_tokens=60, remeasure=True)
            with open_session(run) as s:
                events = list(s.generate(s.prompt_tokens("0123456789" * 3)))
                read = s.target_ctx.tap is not None  # (where it cannot pay, the target's rows go unread)
            mine = [e for e in events if isinstance(e, Round) and e.drafter == _kind(draft)]
            assert read == pays
            assert bool(mine) == pays, (draft, pays)
            if pays and draft == "dflash":
                assert max(e.drafted for e in mine) == nm.BLOCK - 1


def test_costs_of_a_block(monkeypatch):
    c = costmodel.Costs({1: 0.01, 16: 0.011}, 0.002, 16)
    assert list(c.drafting(3, 0.001)) == pytest.approx([0.003, 0.005, 0.007])
    assert list(c.drafting(3, 0.001, block=True)) == pytest.approx([0.003, 0.003, 0.003])


def test_models_info_says_what_a_draft_reads(capsys, native):
    code, out, _ = specdec(capsys, "models", "info", native["dflash"], "--json")
    got = json.loads(out)["hidden_draft"]
    assert code == 0 and got["kind"] == "dflash" and got["target_layers"] == [1] and got["block_size"] == nm.BLOCK
    code, out, _ = specdec(capsys, "models", "info", native["eagle3"])
    assert "EAGLE-3: reads the inputs of target layers 1, 1, 1" in out
    code, out, _ = specdec(capsys, "models", "info", native["counter_qwen2"])
    assert "does not hand out a qwen2 model's layer inputs" in out
    code, out, _ = specdec(capsys, "models", "info", native["counter"], "--draft", native["eagle3_layer5"])
    assert code == 1 and "reads target layer 5" in out


def test_models_pair_and_draft_auto_find_them(capsys, native, tmp_path, monkeypatch):
    (tmp_path / "config.toml").write_text(f'model_dirs = ["{native["counter"].parent}"]\n')
    monkeypatch.setenv("SPECDEC_CONFIG", str(tmp_path / "config.toml"))
    code, out, _ = specdec(capsys, "models", "pair", native["counter"], "--json")
    rows = {r["name"]: r for r in json.loads(out)["drafts"]}
    assert code == 0
    for name in ("eagle3", "dflash", "dflash2"):
        assert rows[name]["can_draft"] and rows[name]["kin"] == "trained on it", name
    for name, why in BAD.items():
        assert not rows[name]["can_draft"] and why in rows[name]["problem"], name
    code, out, err = specdec(capsys, "generate", "abcdefghijkl", "--target", native["counter"], "-n", "12", "--json")
    got = json.loads(out)
    assert code == 0, err
    assert Path(got["config"]["draft"]).name in ("eagle3.gguf", "dflash.gguf", "dflash2.gguf", "eagle3_d2t.gguf")
    assert "trained on its hidden states" in got["config"]["draft_choice"]
    code, out, _ = specdec(capsys, "models", "pair", native["counter_qwen2"], "--json")
    assert not any(r["can_draft"] for r in json.loads(out)["drafts"] if r["name"].startswith(("eagle3", "dflash")))


def test_statistics_name_the_drafter(capsys, native):
    code, out, err = specdec(
        capsys, "generate", "abcdefghijkl", "--target", native["counter"], "--draft", native["dflash"],
        "--drafter", "model", "-k", "4", "-n", "30", "--json",
    )  # fmt: skip
    got = json.loads(out)
    assert code == 0, err
    assert got["config"]["drafter"] == "dflash"
    mine = got["stats"]["by_drafter"]["dflash"]
    assert mine["drafted"] > 0 and mine["accepted"] > 0 and mine["draft_ms_per_token"] > 0
    code, out, err = specdec(
        capsys, "generate", "abcdefghijkl", "--target", native["counter"], "--draft", native["eagle3"], "-k", "4",
        "--drafter", "eagle3", "-n", "30",
    )  # fmt: skip
    assert code == 0 and "eagle3" in err


def test_the_memory_check_counts_the_drafts_cache(native, monkeypatch):
    from specdec_cli import fit

    with open_session(cfg(native, None, ctx_size=4096)) as s:
        target_kv = 4096 * s.target.kv_bytes_per_token()
    monkeypatch.setattr(fit, "available_memory", lambda: target_kv + 1024)
    with open_session(cfg(native, None, ctx_size=4096)):
        pass  # the target's cache alone fits
    with pytest.raises(UsageError, match="of KV cache"):
        with open_session(cfg(native, "dflash", ctx_size=4096)):
            pass


def test_a_draft_whose_logits_turn_nan_stops_drafting_and_says_so(capsys, native, target_only):
    with open_session(cfg(native, "eagle3_nan", draft_tokens=4)) as s:
        events = list(s.generate(s.prompt_tokens(PROMPTS[0])))
    assert collect(iter(events)).tokens == target_only[PROMPTS[0]]
    notices = [e.message for e in events if type(e).__name__ == "Notice"]
    assert len(notices) == 1 and "non-finite logits" in notices[0] and "output is unaffected" in notices[0]


@pytest.fixture(scope="module")
def smollm2_drafts(smollm2, tmp_path_factory) -> dict[str, Path]:
    """Random EAGLE-3 and DFlash drafts of SmolLM2-135M's proportions (a llama model: it hands out its layer inputs),
    with its tokenizer: what a published draft for it would load as."""
    folder = tmp_path_factory.mktemp("smollm2-drafts")
    return {arch: nm.write_like(smollm2, folder / f"{arch}.gguf", arch) for arch in ("eagle3", "dflash")}


@pytest.mark.parametrize("arch", ["eagle3", "dflash"])
def test_a_real_target_with_its_drafts_is_exactly_target_only(smollm2, smollm2_drafts, arch):
    """SmolLM2 with drafts of its proportions: exact mode's greedy output is the target's alone, token for token,
    with the target's layer inputs read on every decode (reading them must not change what it computes), under a
    grammar too; the draft reads the target's layers 2, 15 and 27 (EAGLE-3) or five spread over its 30."""
    base = dict(target=smollm2, threads=2, ctx_size=1024, max_tokens=48, exact=True, debug=True)
    prompts = ["Write a haiku about the sea.", "List three prime numbers:"]
    with open_session(RunConfig(**base, drafter="none")) as s:
        want = [run_engine(s, p)[0] for p in prompts] + [run_engine(s, prompts[1], gbnf="root ::= [0-9, ]+")[0]]
    with open_session(RunConfig(**base, draft=smollm2_drafts[arch], drafter=arch, draft_tokens=4)) as s:
        got = [run_engine(s, p) for p in prompts] + [run_engine(s, prompts[1], gbnf="root ::= [0-9, ]+")]
        assert s.home.hidden().tap.layers == draft_files.read(smollm2_drafts[arch]).layers
    assert [g[0] for g in got] == want
    assert sum(g[1].drafted for g in got) > 0


def test_serve_batch_and_bench_draft_with_them(capsys, native, tmp_path):
    """Every command: a server's requests (a request may ask for plain decoding, or for the drafter by `model`) get
    the target's text; a batch file's; bench's rows sweep the file's own drafter in the draft model's place."""
    from test_serve import Served

    body = {"prompt": "abcdefghijkl", "max_tokens": 24, "temperature": 0}
    # -k 4: a fixed draft, so that `model` drafts with the file's drafter whatever this machine's timings make of it
    # under auto (auto's own choice is asked with frozen costs above; with measured ones a loaded CI machine declined).
    s = Served("--target", native["counter"], "--draft", native["dflash"], "-k", "4", "--debug", "--no-lookup-cache")
    try:
        answers = [s.post("/v1/completions", body | extra) for extra in ({"drafter": "model"}, {"drafter": "none"}, {})]
        wrong = s.post("/v1/completions", body | {"drafter": "eagle3"})
    finally:
        assert s.stop() == 0
    assert all(status == 200 for status, _, _ in answers)
    assert len({obj["choices"][0]["text"] for _, _, obj in answers}) == 1
    assert answers[0][2]["speculative"]["by_drafter"]["dflash"]["accepted"] > 0
    assert wrong[0] == 400 and "drafts with an EAGLE-3 draft" in wrong[2]["error"]["message"]

    requests = tmp_path / "requests.jsonl"
    requests.write_text('{"prompt": "abcdefghijkl", "max_tokens": 16}\n{"prompt": "uvwxyz", "max_tokens": 16}\n')
    code, _, err = specdec(
        capsys, "batch", requests, "-o", tmp_path / "out.jsonl", "--target", native["counter"],
        "--draft", native["eagle3"], "--drafter", "eagle3", "-k", "3", "--no-lookup-cache",
    )  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert code == 0, err
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in rows)

    code, _, err = specdec(
        capsys, "bench", "--target", native["counter"], "--draft", native["eagle3"], "-n", "16", "--runs", "1",
        "--draft-tokens", "3", "--prompts", Path(__file__).parent.parent / "scripts" / "short-answers.jsonl",
        "--json", tmp_path / "bench.json", "--no-lookup-cache",
    )  # fmt: skip
    assert code == 0, err
    drafters = {r["drafter"] for r in json.loads((tmp_path / "bench.json").read_text())["rows"]}
    assert "eagle3" in drafters and not {"model", "dflash"} & drafters


def test_a_prompt_the_target_holds_whole_keeps_the_drafts_cells(native):
    """Runs that reuse the target's cells (a server's turns, a bench's repeated prompts): an EAGLE-3 draft asks the
    target to decode again the few positions whose rows it lacks, and keeps its cells (the whole prompt's); a DFlash
    draft whose cells fell behind the target's (a run of another drafter between) starts afresh where the target's
    rows begin, rather than a block past a gap (which llama.cpp refuses)."""
    prompt = "abcdefghijkl"
    with open_session(cfg(native, None, max_tokens=200)) as alone:
        want = run_engine(alone, prompt)[0]
    with open_session(cfg(native, "eagle3", max_tokens=200, draft_tokens=4)) as s:
        for _ in range(2):
            events = list(s.generate(s.prompt_tokens(prompt), Inputs(reuse=True)))
            assert collect(iter(events)).tokens == want and s.home.hidden().start == 0
        prefilled = next(e for e in events if isinstance(e, Prefilled))
        assert 0 < prefilled.cached < len(s.prompt_tokens(prompt)) - 1  # the target decoded a position again
    other = '!"#$%&'  # a run of another drafter on another text, which the target keeps whole (80 tokens)
    with open_session(cfg(native, None, max_tokens=80)) as alone:
        answer = alone.target.piece  # (bytes of its tokens)
        text = other + b"".join(answer(t) for t in run_engine(alone, other)[0]).decode()
        wants = [run_engine(alone, p)[0] for p in (prompt, other, text)]
    with open_session(cfg(native, "dflash", drafter="auto", max_tokens=80, draft_tokens=4)) as s:
        for p, drafter, want in zip((prompt, other, text), ("dflash", "none", "dflash"), wants):
            r = collect(s.generate(s.prompt_tokens(p), Inputs(reuse=True), drafter=drafter))
            assert r.tokens == want, drafter
        assert r.stats.drafted > 0
