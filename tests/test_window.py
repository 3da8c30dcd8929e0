"""The draft model's window and its lazy prefill (drafting/window.py): the target sees the whole text, so the
output is target-only's whatever the draft saw; the draft is fed only before a round it drafts in, and then
only its window (the text's head and its tail), the window sliding as the answer grows."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FrozenCosts, config, run_engine, same_distribution, sample_counts

from specdec_cli.drafting import window
from specdec_cli.run_inputs import Inputs
from specdec_cli.engine import kv
from specdec_cli.engine import shapes as tree_module
from specdec_cli.engine.stats import collect
from specdec_cli.session import open_session

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
SIZE = 64  # the window: the fixtures' prompts below are ~900 tokens (a byte vocabulary)


def long_prompt(seed: int = 1, words: int = 120) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=words))


@pytest.fixture(scope="module")
def target_only(models):
    # Exact mode: past 512 cells a lone token's attention takes another kernel path than a batch's (README:
    # Exact output), and these prompts are ~900 tokens; exact mode makes greedy output comparable token for token.
    with open_session(config(models, None, max_tokens=160, ctx_size=1536, exact=True)) as s:
        return {seed: run_engine(s, long_prompt(seed))[0] for seed in (1, 2)}


@pytest.mark.parametrize("k", [1, 3, 8])
def test_a_windowed_draft_gives_target_only_output_as_the_window_slides(open_pair, target_only, monkeypatch, k):
    cuts = []
    real_cut = kv.Sequence.cut
    monkeypatch.setattr(kv.Sequence, "cut", lambda self, *a: cuts.append(a) or real_cut(self, *a))
    s = open_pair("draft", max_tokens=160, ctx_size=1536, draft_window=SIZE, exact=True)
    for seed in (1, 2):
        ids, stats, _ = run_engine(s, long_prompt(seed), draft_tokens=k)  # debug=True checks the window every round
        assert ids == target_only[seed] and stats.drafted > 0
    assert len(cuts) >= 4  # it slid as the answers grew (twice an answer at least), not just once per prompt
    assert {sinks for sinks, _ in cuts} == {window.head(SIZE)}  # the prompt's head stays: its instruction
    # What the draft holds is bounded by the window, not the text: the head, the tail, its slack, a draft.
    lo, hi = s.draft_ctx.seq_pos_range(0)
    assert lo == 0 and hi < SIZE + window.SLACK + k + 1


def test_the_whole_text_without_a_window(open_pair, target_only):
    s = open_pair("draft", max_tokens=160, ctx_size=1536, draft_window=0, exact=True)
    ids, stats, _ = run_engine(s, long_prompt(1), draft_tokens=3)
    assert ids == target_only[1] and s.draft_ctx.seq_pos_range(0)[1] > len(s.prompt_tokens(long_prompt(1))) - 2


def test_windowed_sampling_is_distributed_as_target_only_sampling(open_pair, monkeypatch):
    """The window changes q (the draft's distribution), which the rule reads as it was sampled from. Negative
    control: accepting every draft token samples the windowed draft's distribution, which the test tells apart."""
    kw = dict(max_tokens=2, temp=1.5, top_k=3, ctx_size=1536, draft_window=SIZE)
    prompt = long_prompt(3, words=40)  # ~240 tokens: past the window
    spec, plain = open_pair("draft", **kw), open_pair(None, **kw)
    plain_counts, _ = sample_counts(plain, prompt, 1500)
    spec_counts, stats = sample_counts(spec, prompt, 1500, draft_tokens=2)
    ok, stat, cells = same_distribution(spec_counts, plain_counts)
    assert ok, (stat, cells)
    assert cells > 3 and 0.0 < stats.accept_rate < 1.0 and spec.draft_ctx.seq_pos_range(0)[1] < SIZE + 40

    def accept_all(p, q, tokens, rng):
        return len(tokens), int(rng.choice(len(p[-1]), p=p[-1]))

    monkeypatch.setattr(tree_module, "speculative_accept", accept_all)
    wrong, _ = sample_counts(spec, prompt, 1500, draft_tokens=2)
    assert not same_distribution(wrong, plain_counts)[0]


def test_a_reused_window_keeps_what_the_next_prompt_shares(open_pair):
    """A server's next turn: the draft's window is rolled back to the prompts' shared prefix, not emptied."""
    s = open_pair("draft", max_tokens=24, ctx_size=1536, draft_window=SIZE)
    first = s.prompt_tokens(long_prompt(4))
    r = collect(s.generate(first, Inputs(reuse=True), draft_tokens=3))
    turn = first + r.tokens + s.target.tokenize(" more", special=False)
    again = collect(s.generate(turn, Inputs(reuse=True), draft_tokens=3))  # debug=True: the reused window is checked
    assert again.stats.drafted > 0 and s.draft_ctx.seq_pos_range(0)[1] < SIZE + window.SLACK + 4


def test_a_shorter_prompt_after_a_slid_window_starts_from_its_head(open_pair):
    """The next request shares only its first tokens with a text whose window slid: the draft keeps what it
    holds of the shorter text (never more than the text), and drafts on from there."""
    s = open_pair("draft", max_tokens=40, ctx_size=1536, draft_window=SIZE)
    first = s.prompt_tokens(long_prompt(8))
    collect(s.generate(first, Inputs(reuse=True), draft_tokens=3))
    assert s.draft_ctx.seq_pos_range(0)[1] < SIZE + window.SLACK + 4  # it slid
    short = first[: window.head(SIZE) + 20]  # shares the head and a little more, far less than the window left out
    r = collect(s.generate(short, Inputs(reuse=True), draft_tokens=3))  # debug=True checks the draft against the text
    plain = collect(s.generate(short, drafter="none"))
    assert r.tokens == plain.tokens and r.stats.drafted > 0


def never_pays() -> FrozenCosts:
    """A compute-bound machine: verifying n tokens costs n decodes, a draft token 0.6 of one."""
    return FrozenCosts({1: 0.03, 32: 0.96}, 0.018, 32, draft_prefill=0.01, draft_load=1.0)


def test_a_run_that_never_drafts_with_the_model_feeds_it_nothing(models):
    prompt = long_prompt(5)
    with open_session(config(models, "draft", drafter="auto", max_tokens=40, ctx_size=1536)) as s:
        s.costs([], measured=never_pays())
        ids, stats, _ = run_engine(s, prompt)
        assert "model" not in stats.by_drafter
        assert s.draft_ctx.decode_seconds == 0.0 and s.draft_ctx.seq_pos_range(0) == (-1, -1)
    lazy = config(models, "draft", drafter="auto", max_tokens=40, ctx_size=1536)
    with open_session(lazy, lazy_draft=True) as s:
        s.costs([], measured=never_pays())
        assert run_engine(s, prompt)[0] == ids
        assert s.draft is None and s.draft_ctx is None  # never loaded


def pays_per_round(prefill: float) -> FrozenCosts:
    """Memory-bound verification (16 tokens cost 1.1 decodes) and a cheap draft token: the draft model pays
    every round once in step; `prefill`: its seconds per token to bring a window in step."""
    return FrozenCosts({1: 0.03, 16: 0.033, 32: 0.04}, 0.0005, 32, draft_prefill=prefill, draft_load=0.0)


@pytest.mark.parametrize("prefill, drafts", [(0.00001, True), (0.05, False)])
def test_auto_weighs_the_draft_models_prefill_against_what_the_answer_can_gain(models, prefill, drafts):
    """A long prompt and a short answer: a window's prefill at 0.05 s a token (3.4 s for the smallest window)
    costs more than 24 tokens can save (0.5 s at most), so auto never drafts with the model; at 10 us a token
    it does."""
    with open_session(config(models, "draft", drafter="auto", max_tokens=24, ctx_size=1536), lazy_draft=True) as s:
        s.costs([], measured=pays_per_round(prefill))
        ids, stats, _ = run_engine(s, long_prompt(6), lookup_cache=False)
        model = stats.by_drafter.get("model")
        assert (model is not None and model.drafted > 0) is drafts
        assert (s.draft is not None) is drafts  # loaded only where it drafts


def test_a_smaller_window_where_only_it_pays(models):
    """W is chosen by cost: halved from the configured 2048 while its prefill costs more than the answer can save
    (at 0.02 s a token: 2048 and 1024 hold the whole ~900-token text, 18 s; 512 and 256 cost 10 s and 5 s, against
    about 4 s saved; 128 costs 2.7 s)."""
    with open_session(config(models, "draft", drafter="auto", max_tokens=200, ctx_size=1536), lazy_draft=True) as s:
        s.costs([], measured=pays_per_round(0.02))
        stats = run_engine(s, long_prompt(7), lookup_cache=False)[1]
        assert stats.by_drafter["model"].drafted > 0
        hi = s.draft_ctx.seq_pos_range(0)[1]
        assert 128 <= hi < 128 + window.SLACK + 32
