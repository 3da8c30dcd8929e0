"""Hybrid models speculate through llama.cpp's recurrent-state snapshots (tiny random lfm2 and qwen35
fixtures: short-conv or Gated DeltaNet layers beside attention layers).

The target keeps a snapshot of its state per draft token, so a rejected tail of the verify batch is
dropped like KV cells are; a recurrent draft drafts in a copy of its state (drafts are one-token decodes,
which snapshots cannot undo). Greedy output must be target-only output token for token, sampling must
be distributed as target-only sampling, and the caches must hold exactly the committed text."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import config, run_engine, same_distribution, sample_counts

from specdec_cli.backend.context import Context
from specdec_cli.run_inputs import Inputs
from specdec_cli.backend.native import Model
from specdec_cli.engine import shapes as tree_module
from specdec_cli.engine.events import Round, Stopped, Token
from specdec_cli.engine.kv import Sequence
from specdec_cli.engine.sampling import Sampler
from specdec_cli.engine.stats import collect
from specdec_cli.errors import UsageError
from specdec_cli.session import open_session

ARCHS = ["lfm2", "qwen35"]
PROMPTS = ["hello world", "The quick brown fox", "abcabcabcabc", "z", "def f(x):\n    return x"]


@pytest.fixture(scope="module")
def target_only(models):
    out = {}
    for arch in ARCHS:
        with open_session(config(models, None, target=models[arch], max_tokens=40)) as s:
            out |= {(arch, p): run_engine(s, p)[0] for p in PROMPTS}
    return out


def pair(open_pair, models, arch: str, draft: str = "draft", **kw):
    return open_pair(f"{arch}_{draft}" if draft else None, target=models[arch], **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_fixtures_roll_back_through_snapshots_and_mamba_cannot(models, arch):
    with Model(models[arch]) as m:
        assert m.recurrent and m.rollback == "snapshots" and m.state_bytes() > 0
    with Model(models["recurrent"]) as m:
        assert m.rollback == "none"
    with Model(models["target"]) as m:
        assert m.rollback == "cells" and m.state_bytes() == 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_model_drafts_are_target_only_output(open_pair, models, target_only, arch, k):
    s = pair(open_pair, models, arch, draft_tokens=k, max_tokens=40)
    assert s.target_ctx.max_rollback == k  # a snapshot per draft token (-k), and no more
    for prompt in PROMPTS:
        assert run_engine(s, prompt, draft_tokens=k)[0] == target_only[arch, prompt], (prompt, k)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("drafter,k", [("lookup", 4), ("lookup", None), ("auto", None)])
def test_greedy_lookup_and_auto_are_target_only_output(open_pair, models, target_only, frozen_costs, arch, drafter, k):
    """frozen_costs: auto drafts as on hardware where it pays, whatever this machine measures."""
    s = pair(open_pair, models, arch, drafter=drafter, draft_tokens=k, max_tokens=40)
    drafted = 0
    for prompt in PROMPTS:
        ids, stats, _ = run_engine(s, prompt)
        assert ids == target_only[arch, prompt], (prompt, drafter, k)
        drafted += stats.drafted
    assert drafted > 0  # it speculated


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", [1, 3, 5])
def test_an_identical_draft_is_fully_accepted(open_pair, models, arch, k):
    """The draft drafts in a copy of its state, which takes the main state's place when all it drafted was
    accepted: a copy that lost or skipped a token would propose other tokens than the target's."""
    s = pair(open_pair, models, arch, "same", draft_tokens=k, max_tokens=60)
    ids, stats, _ = run_engine(s, "The quick brown fox")
    assert stats.accept_rate == 1.0 and stats.drafted > 0
    assert stats.mean_accepted > k


@pytest.mark.parametrize("arch", ARCHS)
def test_drafts_never_exceed_the_snapshots(models, arch):
    """A request for longer drafts than the context keeps snapshots for (a server's draft_tokens) drafts
    that many at most, and the output is unchanged."""
    cfg = config(models, f"{arch}_same", target=models[arch], draft_tokens=3, max_tokens=40)
    with open_session(cfg) as s:
        assert s.target_ctx.max_rollback == 3
        events = list(s.generate(s.prompt_tokens("hello world"), draft_tokens=8))
        plain = run_engine(s, "hello world", drafter="none")[0]
    assert max(e.drafted for e in events if isinstance(e, Round)) == 3
    assert collect(iter(events)).tokens == plain


@pytest.mark.parametrize("arch", ARCHS)
def test_sampling_is_distributed_as_target_only_sampling(open_pair, models, arch):
    kw = dict(max_tokens=2, temp=1.5, top_k=3)
    spec, plain = pair(open_pair, models, arch, **kw), pair(open_pair, models, arch, None, **kw)
    spec_counts, stats = sample_counts(spec, "hello world", 1500, draft_tokens=2)
    plain_counts, _ = sample_counts(plain, "hello world", 1500)
    ok, stat, cells = same_distribution(spec_counts, plain_counts)
    assert ok, (stat, cells)
    assert cells > 3 and 0.0 < stats.accept_rate < 1.0  # something to tell apart, and drafts both ways


def test_the_chi_square_catches_a_wrong_rule_and_a_wrong_temperature(open_pair, models, monkeypatch):
    """Negative controls: the test above can fail. Accepting every draft token samples the draft's
    distribution, not the target's; and target-only sampling at another temperature differs."""
    kw = dict(max_tokens=2, temp=1.5, top_k=3)
    plain = pair(open_pair, models, "lfm2", None, **kw)
    plain_counts, _ = sample_counts(plain, "hello world", 1500)
    hotter = pair(open_pair, models, "lfm2", None, **(kw | dict(temp=3.0)))
    assert not same_distribution(sample_counts(hotter, "hello world", 1500)[0], plain_counts)[0]

    def accept_all(p, q, tokens, rng):
        return len(tokens), int(rng.choice(len(p[-1]), p=p[-1]))

    monkeypatch.setattr(tree_module, "speculative_accept", accept_all)
    spec = pair(open_pair, models, "lfm2", **kw)
    assert not same_distribution(sample_counts(spec, "hello world", 1500, draft_tokens=2)[0], plain_counts)[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_random_early_stops_leave_both_caches_holding_the_committed_text(open_pair, models, arch):
    """debug=True checks both caches against the committed text after every round; a consumer that walks
    away mid-stream leaves the target's state at the committed text minus its last token."""
    s = pair(open_pair, models, arch, max_tokens=48, draft_tokens=8)
    rng = np.random.default_rng(1)
    for trial in range(25):
        prompt = s.prompt_tokens("".join(chr(c) for c in rng.integers(32, 127, size=int(rng.integers(1, 30)))))
        kw = dict(
            draft_tokens=int(rng.integers(1, 9)),
            max_tokens=int(rng.integers(1, 48)),
            temp=float(rng.choice([0.0, 0.8])),
            seed=trial,
        )
        stream = s.generate(prompt, **kw)
        emitted, eos, stop_after = 0, False, int(rng.integers(0, 12))
        for i, event in enumerate(stream):
            emitted += isinstance(event, Token)
            eos |= isinstance(event, Stopped) and event.reason == "eos"
            if i == stop_after:
                break
        stream.close()
        lo, hi = s.target_ctx.seq_pos_range(0)
        # One state, at the position it stands at: at least the tokens seen (a round's are committed before
        # the first is yielded), at most the prompt plus every token the budget allows, minus the last one.
        # An end-of-generation draft token accepted first leaves nothing of the verify batch to keep: the
        # whole decode goes, further back than any snapshot, and the state is cleared (the run is over).
        kept = lo == hi and len(prompt) + emitted - 2 <= hi <= len(prompt) + kw["max_tokens"] - 2
        assert kept or eos and (lo, hi) == (-1, -1), (trial, lo, hi)
        assert s.target_ctx.seq_pos_range(1) == (-1, -1)  # the target never forks
        assert s.draft_ctx.seq_pos_range(1) == (-1, -1), trial  # no draft copy is left behind
        # The next run starts from empty caches and still gives target-only output.
        expected = run_engine(s, "hello world", drafter="none", max_tokens=20)[0]
        assert run_engine(s, "hello world", draft_tokens=kw["draft_tokens"], max_tokens=20)[0] == expected


def test_a_rollback_past_the_snapshots_clears_the_state_and_the_text_is_fed_again(models):
    with Model(models["lfm2"]) as m, Context(m, n_ctx=256, n_threads=2, n_seq=1, snapshots=4) as ctx:
        tokens = m.tokenize("hello world, hello again", special=False)
        seq = Sequence.empty(ctx)
        seq.append(tokens[:10])
        seq.append(tokens[10:16], outputs="all")
        assert seq.floor == 12  # of the last decode's 6 tokens, 5 could go; 4 snapshots are kept
        seq.rollback(12)  # within the snapshots
        assert len(seq) == 12 and ctx.seq_pos_range(0) == (11, 11)
        row = seq.append(tokens[12:13])[0].copy()
        seq.rollback(5)  # further back than any snapshot: cleared
        assert len(seq) == 0 and ctx.seq_pos_range(0) == (-1, -1)
        fresh = Sequence.empty(ctx)
        fresh.append(tokens[:12])
        assert np.array_equal(fresh.append(tokens[12:13])[0], row)  # the snapshot was the true state
        # The whole last decode cannot go: llama.cpp would take it (3 <= 4 snapshots), from a stale snapshot.
        fresh.append(tokens[13:16])
        fresh.rollback(13)
        assert len(fresh) == 0 and ctx.seq_pos_range(0) == (-1, -1)


def test_trees_and_exact_mode_are_refused_in_one_line(models, capsys):
    from test_cli import one_line_error, specdec

    with pytest.raises(UsageError, match=r"--branches 2: tree drafting forks every branch's state"):
        open_session(config(models, "lfm2_draft", target=models["lfm2"], branches=2)).__enter__()
    base = ["generate", "hi", "--target", str(models["qwen35"]), "--draft", str(models["qwen35_draft"])]
    code, _, err = specdec(capsys, *base, "--branches", "3")
    assert code == 2 and "qwen35.gguf (qwen35) keeps a recurrent state" in one_line_error(err)
    code, _, err = specdec(capsys, *base, "--exact")
    assert code == 2 and one_line_error(err).startswith("error: --exact: qwen35.gguf (qwen35) keeps a recurrent state")


@pytest.mark.parametrize("arch", ARCHS)
def test_the_snapshot_memory_is_what_llama_cpp_allocates(models, arch):
    """Model.state_bytes (from the GGUF's metadata) x (1 + snapshots) x sequences, against llama.cpp's own
    figure for the recurrent cache it allocates (its log, in MiB to two decimals)."""
    code = (
        "import sys; from specdec_cli.backend.context import Context; from specdec_cli.backend.native import Model\n"
        "m = Model(sys.argv[1]); print('STATE', m.state_bytes(), flush=True)\n"
        "Context(m, n_ctx=256, n_threads=1, n_seq=2, snapshots=63).close()\n"
    )
    env = {**os.environ, "SPECDEC_LLAMA_LOG": "1"}
    run = subprocess.run([sys.executable, "-c", code, str(models[arch])], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    state = int(re.search(r"STATE (\d+)", run.stdout).group(1))
    mib = float(re.findall(r"llama_memory_recurrent: size = +([\d.]+) MiB", run.stderr)[-1])  # (-1: not the probe's)
    assert abs(state * 64 * 2 / 2**20 - mib) <= 0.005 + 1e-9, (state, mib)


@pytest.mark.parametrize(
    "name,rollback,words",
    [
        ("target", "cells", "KV cells: any rejected tail is dropped"),
        ("lfm2", "snapshots", "recurrent-state snapshots: one per draft token"),
        ("qwen35", "snapshots", "recurrent-state snapshots: one per draft token"),
        ("recurrent", "none", "cannot: llama.cpp keeps no snapshots of this architecture's state"),
    ],
)
def test_models_info_says_how_the_cache_rolls_back(capsys, models, name, rollback, words):
    import json

    from test_cli import specdec

    code, out, _ = specdec(capsys, "models", "info", str(models[name]), "--json")
    facts = json.loads(out)
    assert code == 0 and facts["rollback"] == rollback and facts["can_roll_back"] == (rollback != "none")
    assert facts["context_length"] == 32768 and facts["sliding_window"] is None
    assert (facts["recurrent_state_bytes"] > 0) == (rollback != "cells")
    code, out, _ = specdec(capsys, "models", "info", str(models[name]))
    assert code == 0 and words in out and "sliding window" in out
    assert ("no: auto decodes it plainly" in out) == (rollback == "none")


def test_a_servers_prefix_reuse_keeps_what_the_state_can_keep(models):
    """A second turn that extends the first reuses the state (nothing to drop); one that departs from it
    would need the state at an older position, which no snapshot holds: it starts from nothing."""
    from specdec_cli.engine.events import Prefilled

    def turn(s, tokens):
        events = list(s.generate(tokens, Inputs(reuse=True)))
        return next(e.cached for e in events if isinstance(e, Prefilled)), collect(iter(events)).tokens

    cfg = config(models, "lfm2_draft", target=models["lfm2"], max_tokens=24)
    with open_session(cfg) as s, open_session(cfg) as cold:
        first = s.prompt_tokens("The quick brown fox")
        _, answer = turn(s, first)
        second = first + answer + s.prompt_tokens("jumps")[1:]
        cached, ids = turn(s, second)
        assert cached == len(first) + len(answer) - 1  # all it held: the first turn's text but its last token
        assert ids == collect(cold.generate(second)).tokens
        other = s.prompt_tokens("A different start")
        cached, ids = turn(s, other)
        assert cached == 0 and ids == collect(cold.generate(other)).tokens


def test_the_memory_check_counts_the_snapshots(capsys, models, monkeypatch):
    """lfm2: 1 KiB of state per sequence; 63 snapshots of the target's make 64 KiB, the draft's two 2 KiB."""
    import specdec_cli.fit as fit
    from test_cli import one_line_error, specdec

    monkeypatch.setattr(fit, "available_memory", lambda: 100 << 10)  # 100 KiB free
    args = ["generate", "hi", "--target", str(models["lfm2"]), "--draft", str(models["lfm2_draft"]), "-c", "256"]
    code, _, err = specdec(capsys, *args, "-k", "63")
    assert code == 2, err
    assert "of KV cache and 0.1 MiB of recurrent state and its snapshots, but only 0.1 MiB" in one_line_error(err)
    assert "or -k (a snapshot per draft token)" in err
    code, _, err = specdec(capsys, *args, "-k", "4", "-n", "4")
    assert code == 0, err


@pytest.mark.parametrize("arch", ARCHS)
def test_a_recurrent_draft_drafts_in_a_copy_and_keeps_its_own_state(models, arch):
    """Drafted on its own state, a rejection would reach past the snapshots of its one-token decodes and
    clear it (correct, but the draft would read the whole text again every round)."""
    from specdec_cli.drafting.model import ModelDrafter

    with Model(models[f"{arch}_same"]) as m, Context(m, n_ctx=256, n_threads=2, n_seq=2) as ctx:
        prompt = m.tokenize("The quick brown fox", special=True)
        drafter = ModelDrafter(Sequence.empty(ctx))
        drafter.prefill(prompt[:-1])
        rng = np.random.default_rng(0)
        draft = drafter.propose(prompt, 4, Sampler(), rng)
        assert len(draft.tokens) == 4 and len(drafter.cache) == 2  # d2, d3 went to the copy (d4 is never decoded)
        drafter.rollback(len(prompt) + 1, draft)  # d1 accepted, d2 rejected: the copy goes
        drafter.check([*prompt, draft.tokens[0], 0])
        assert len(drafter.seq) == len(prompt) and len(drafter.cache) == 1  # its own state, not cleared
        committed = [*prompt, draft.tokens[0], 7]
        draft = drafter.propose(committed, 4, Sampler(), rng)
        drafter.rollback(len(committed) + 4, draft)  # all four accepted, and a bonus: the copy takes the state's place
        assert drafter.seq.tokens == [*committed, *draft.tokens[:3]] and len(drafter.cache) == 1
        assert ctx.seq_pos_range(0) == (len(committed) + 2,) * 2 and ctx.seq_pos_range(1) == (-1, -1)
