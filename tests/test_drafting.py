"""Cost-aware drafting: prompt lookup, the k-chooser, `--drafter auto`, `--p-min`. Lossless always;
the chooser drafts only where the cost curve says it pays."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_engine, same_distribution, sample_counts

from specdec_cli.drafting.auto import AutoDrafter
from specdec_cli.drafting.cost import Costs, best_length, expected_tokens
from specdec_cli.engine.drafter import Draft, Outcome
from specdec_cli.engine.events import Round
from specdec_cli.engine.stats import collect
from specdec_cli.run_inputs import Inputs
from specdec_cli.drafting.lookup import LookupDrafter
from specdec_cli.drafting.matches import longest_match
from specdec_cli.engine.sampling import Sampler

GREEDY = Sampler()
RNG = np.random.default_rng(0)
REPEATING = ["abcabcabcabc", "def f(x):\n    return x\ndef g(x):\n    return", "the cat sat on the mat; the cat"]


# --- lookup on token lists ----------------------------------------------------------------------
def test_longest_match_prefers_the_longest_suffix_over_the_last_occurrence():
    #        0  1  2  3  4  5  6  7  8  9
    h = [1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3]  # suffix [1,2,3] occurs at 0..2; [2,3] also at 5..6 (more recent)
    length, start = longest_match(np.array(h))
    assert (length, start) == (3, 3)  # continue after the 3-token match: 9, not 8


def test_longest_match_takes_the_most_recent_of_equally_long_matches():
    h = [7, 4, 1, 7, 4, 2, 7, 4]
    assert longest_match(np.array(h)) == (2, 5)  # [7, 4] at 3..4 is more recent than at 0..1


def test_longest_match_without_an_earlier_occurrence():
    assert longest_match(np.array([1, 2, 3, 4])) == (0, -1)
    assert longest_match(np.array([5])) == (0, -1)


def test_longest_match_is_capped_and_may_overlap_the_suffix():
    h = np.array([6] * 10)  # a run of one token matches itself shifted by one
    length, start = longest_match(h, max_match=4)
    assert length == 4 and start == 9
    assert longest_match(h)[0] == 9  # uncapped: as long as the text allows


def test_lookup_drafter_proposes_the_continuation_after_the_match():
    d = LookupDrafter()
    committed = [10, 11, 12, 13, 14, 15, 20, 11, 12]
    draft = d.propose(committed, 3, GREEDY, RNG)
    assert draft.tokens == [13, 14, 15] and draft.q is None and draft.match == 2 and draft.source == "lookup"
    # The history grows with the committed text: the next call sees the new tokens.
    draft = d.propose(committed + [13, 14, 15, 20, 11], 4, GREEDY, RNG)
    assert draft.tokens[:2] == [12, 13] and draft.match >= 4


def test_lookup_drafter_needs_min_match_tokens():
    assert LookupDrafter(min_match=2).propose([1, 2, 3, 9, 3], 4, GREEDY, RNG).tokens == []  # one token matches
    draft = LookupDrafter(min_match=2).propose([1, 2, 3, 9, 2, 3], 4, GREEDY, RNG)
    assert draft.tokens == [9, 2, 3]  # the continuation runs to the end of the text so far


# --- following an edited copy -----------------------------------------------------------------
T, EQ, Z, NL, C, S, LB, PE, A, R = range(50, 60)  # `total`, `=`, `0`, newline, `count`, ...
NEW_NAME = [70, 71]  # the new name takes two tokens where the old took one: spans of unequal length
CODE = [5, 6, 7, 8, T, EQ, Z, NL, C, EQ, Z, NL, S, EQ, LB, NL, T, PE, A, NL, R, T, NL]
PROMPT = [1, 2, 3, *CODE]


def test_after_an_edit_the_copy_resumes_past_the_old_token_not_at_the_latest_match():
    d = LookupDrafter()
    answer = [5, 6, 7, 8]
    assert d.propose(PROMPT + answer, 4, GREEDY, RNG).tokens == [T, EQ, Z, NL]
    answer += [*NEW_NAME, EQ]  # the answer renames `total`; only ` =` matches the code again
    # ` =` last occurred before `[`: a plain suffix match would propose that. The copy was at `total`.
    assert longest_match(np.array(PROMPT + answer))[1] == PROMPT.index(LB)
    draft = d.propose(PROMPT + answer, 4, GREEDY, RNG)
    assert draft.tokens == [Z, NL, C, EQ]
    assert draft.match == 5  # the stretch copied so far (5 6 7 8, =) predicts the copy, not the 1-token re-entry


def test_a_few_tokens_in_common_are_not_a_copy_to_resume():
    d = LookupDrafter()
    answer = [6, 7]  # two tokens agree with the code: mostly chance, not yet a copy
    assert d.propose(PROMPT + answer, 4, GREEDY, RNG).tokens == [8, T, EQ, Z]
    answer += [*NEW_NAME, EQ]
    assert d.propose(PROMPT + answer, 4, GREEDY, RNG).tokens == []  # no re-entry; ` =` alone is too short


def test_a_rename_is_learned_once_and_drafted_through_at_its_next_occurrence():
    d = LookupDrafter()
    answer = [5, 6, 7, 8]
    d.propose(PROMPT + answer, 4, GREEDY, RNG)
    answer += [*NEW_NAME, EQ]
    d.propose(PROMPT + answer, 4, GREEDY, RNG)
    answer += [Z, NL, C, EQ, Z, NL, S, EQ, LB, NL]
    assert d.propose(PROMPT + answer, 4, GREEDY, RNG).tokens == [*NEW_NAME, PE, A]
    # Where the answer keeps the old name, the substitution is dropped: the next copy proposes `total` again.
    answer += [T, PE]
    assert d.propose(PROMPT + answer, 4, GREEDY, RNG).tokens == [A, NL, R, T]


def test_a_fully_taken_draft_keeps_the_copy_in_step():
    d = LookupDrafter()
    text = list(range(100, 130))
    assert d.propose(text + text[:3], 4, GREEDY, RNG).tokens == text[3:7]
    taken = text[:3] + text[3:8]  # all four drafted tokens, then the target's own (the next one) too
    draft = d.propose(text + taken, 4, GREEDY, RNG)
    assert draft.tokens == text[8:12] and draft.match == 8


def lookup_rounds(prompt: list[int], answer: list[int], k: int) -> list[tuple[int, list[int], int]]:
    """Greedy rounds of a fixed-k lookup against a known answer: (position, draft, tokens accepted) per round."""
    d, rounds, i = LookupDrafter(), [], 0
    while i < len(answer):
        draft = d.propose(prompt + answer[:i], k, GREEDY, RNG).tokens
        a = 0
        while a < len(draft) and i + a < len(answer) and draft[a] == answer[i + a]:
            a += 1
        rounds.append((i, draft, a))
        i += a + 1
    return rounds


def test_a_renamed_identifier_costs_one_rejected_draft_however_often_it_occurs():
    rng = np.random.default_rng(7)
    old, new = 99, [97, 98]
    code = []
    for _ in range(6):  # lines with repeated tokens, as code has: a plain suffix match is often ambiguous
        code += [*rng.integers(10, 60, size=6).tolist(), old, *rng.integers(10, 60, size=6).tolist(), 0]
    answer = [t for c in code for t in (new if c == old else [c])]
    prompt = [1, 2, old, 3, *new, 4, *code]  # "rename old to new in:" and the code
    rounds = lookup_rounds(prompt, answer, 8)
    # Rounds whose draft had the old name where the answer wrote the new one:
    stumbles = [i for i, draft, a in rounds if a < len(draft) and draft[a] == old and answer[i + a] == new[0]]
    assert len(stumbles) == 1  # only the first occurrence: every later one is drafted with the new name
    assert sum(a for _, _, a in rounds) > 0.8 * len(answer)


# --- the k-chooser on synthetic cost curves ---------------------------------------------------
def linear_curve(n_max: int = 32) -> Costs:
    """Verifying n tokens costs n single decodes: drafts can never pay unless always right."""
    return Costs({1: 0.03, n_max: 0.03 * n_max}, None, n_max)


def flat_curve(n_max: int = 32) -> Costs:
    """Verifying up to 16 tokens costs 1.2 single decodes (memory-bound hardware): long drafts pay."""
    return Costs({1: 0.03, 16: 0.036, n_max: 0.072}, None, n_max)


def test_expected_tokens_is_one_plus_the_prefix_products():
    assert expected_tokens([]).tolist() == [1.0]
    assert expected_tokens([0.5, 0.5]).tolist() == pytest.approx([1.0, 1.5, 1.75])
    assert expected_tokens([1.0] * 4)[-1] == 5.0


def test_chooser_decodes_plainly_when_the_curve_says_drafts_cannot_pay():
    k, rate, e = best_length([0.9] * 16, linear_curve())
    assert k == 0 and e == 1.0 and rate == pytest.approx(1 / 0.03)


def test_chooser_drafts_long_when_verification_is_nearly_free():
    k, rate, _ = best_length([0.9] * 31, flat_curve())
    assert k == 15  # the longest draft that still fits the cheap 16-token batch
    assert rate > 4 / 0.03


def test_chooser_counts_the_draft_cost():
    # A draft model at c = 0.5 on the flat curve: drafting pays at 90% acceptance, not at 30%.
    assert best_length([0.9] * 8, flat_curve(), 0.015)[0] > 0
    assert best_length([0.3] * 8, flat_curve(), 0.015)[0] == 0


def test_costs_interpolate_and_learn_online():
    c = Costs({1: 0.01, 4: 0.04, 8: 0.05}, None, 16)
    assert c.verify(2) == pytest.approx(0.02) and c.verify(16) == pytest.approx(0.10)  # beyond: per-token cost of 8
    for _ in range(30):
        c.observe_verify(2, 0.015)
    assert c.verify(2) == pytest.approx(0.015, rel=0.01)
    c.observe_verify(2, 10.0)  # one preempted decode moves the estimate by a bounded step only
    assert c.verify(2) < 0.02


def test_quick_measurement_times_a_few_sizes_and_the_thorough_one_every_size(open_pair):
    from specdec_cli.drafting.measure import measure

    s = open_pair("draft", drafter="auto")
    tokens = s.prompt_tokens("def f(x):")
    quick = measure(s.target_ctx, s.draft_ctx, tokens, 32)
    assert list(quick.measured) == [1, 2, 4, 8, 16] and len(quick.table) == 32  # the rest interpolated
    assert quick.draft > 0 and quick.draft_catch_up is None and quick.plain == quick.measured[1]
    thorough = measure(s.target_ctx, s.draft_ctx, tokens, 4, thorough=True)
    assert list(thorough.measured) == [1, 2, 3, 4] and thorough.draft > 0 and thorough.draft_catch_up > 0


def test_auto_decodes_plainly_without_a_match_and_drafts_a_long_reliable_match():
    auto = AutoDrafter(flat_curve(), LookupDrafter(), None)
    assert auto.propose([1, 2, 3, 4, 5], 31, GREEDY, RNG).tokens == []  # nothing to copy
    text = list(range(100, 140))
    draft = auto.propose(text + text[:20], 31, GREEDY, RNG)  # 20 tokens already match the earlier text
    assert draft.source == "lookup" and draft.tokens == text[20 : 20 + len(draft.tokens)] and len(draft.tokens) >= 8
    assert draft.predicted > 1.0


def test_auto_never_drafts_when_verification_costs_what_it_saves():
    auto = AutoDrafter(linear_curve(), LookupDrafter(), None)
    text = list(range(100, 140))
    assert auto.propose(text + text[:20], 31, GREEDY, RNG).tokens == []


def test_auto_learns_lookup_acceptance_from_rounds_it_did_not_draft():
    """A plain round still tells whether lookup's first token was right: the learner gets it for free."""
    auto = AutoDrafter(linear_curve(), LookupDrafter(), None)
    committed = [1, 2, 3, 9, 1, 2, 3]
    before = auto.source_accept["copy", 1].mean(3)
    for _ in range(20):
        draft = auto.propose(committed, 8, GREEDY, RNG)
        assert draft.tokens == []
        auto.observe(draft, Outcome(path=[], token=9, draft_seconds=0.0, verify_seconds=0.03))  # lookup's guess
    assert auto.source_accept["copy", 1].mean(3) > max(before, 0.9)


def test_auto_prefers_plain_to_a_draft_model_that_costs_too_much():
    class NeverCalled:
        name = "model"
        failed = False

        def take_notice(self):
            return None

        def lag(self, committed):
            return 1

        def propose(self, *a, **kw):
            raise AssertionError("auto drafted with a model that cannot pay")

    costs = linear_curve()
    costs.draft = 0.016  # c = 0.53, the 0.5B-for-1.5B pair on 2 cores
    auto = AutoDrafter(costs, None, NeverCalled())
    assert auto.propose([1, 2, 3], 8, GREEDY, RNG) == Draft([], None, predicted=1.0)


# --- end to end on the tiny F32 fixtures -------------------------------------------------------
@pytest.fixture(scope="module")
def target_only(models):
    from conftest import config
    from specdec_cli.session import open_session

    with open_session(config(models, None, max_tokens=40)) as s:
        return {p: run_engine(s, p)[0] for p in REPEATING}


@pytest.mark.parametrize("k", [1, 4, 16])
def test_lookup_greedy_matches_target_only(open_pair, target_only, k):
    s = open_pair(None, drafter="lookup", max_tokens=40)
    for prompt in REPEATING:
        ids, stats, _ = run_engine(s, prompt, draft_tokens=k)
        assert ids == target_only[prompt], (prompt, k)
        assert set(stats.by_drafter) <= {"lookup"}


@pytest.mark.parametrize("draft, drafter", [("draft", "auto"), (None, "auto"), ("draft", "model"), (None, "lookup")])
def test_auto_greedy_matches_target_only(open_pair, frozen_costs, target_only, draft, drafter):
    # Frozen costs where drafting pays: on any machine auto drafts, so the output check has teeth.
    s = open_pair(draft, drafter=drafter, draft_tokens=None, max_tokens=40)  # -k auto
    drafted = {}
    for prompt in REPEATING:
        ids, stats, _ = run_engine(s, prompt)
        assert ids == target_only[prompt], prompt
        assert sum(d.rounds for d in stats.by_drafter.values()) == stats.rounds
        assert stats.predicted_vs_realised() is not None
        for name, d in stats.by_drafter.items():
            drafted[name] = drafted.get(name, 0) + d.drafted
    assert drafted.get("model" if draft else "lookup", 0) > 0, drafted


def test_lookup_drafts_on_repetitive_text(open_pair):
    s = open_pair(None, drafter="lookup", max_tokens=40)
    _, stats, _ = run_engine(s, "abcabcabcabcabcabc", draft_tokens=4)
    assert stats.by_drafter["lookup"].drafted > 0


def test_lookup_sampling_is_reproducible_with_a_seed(open_pair):
    s = open_pair(None, drafter="lookup", max_tokens=30, temp=0.8, seed=3)
    a = run_engine(s, REPEATING[0])[0]
    b = run_engine(s, REPEATING[0])[0]
    assert a == b and a


def test_p_min_one_stops_every_draft_and_keeps_the_output(open_pair, target_only):
    s = open_pair("draft", drafter="model", p_min=1.0, max_tokens=40)
    for prompt in REPEATING:
        ids, stats, _ = run_engine(s, prompt, draft_tokens=4)
        assert ids == target_only[prompt]
        assert stats.drafted == 0  # no draft token of a random model has probability 1


def test_p_min_cuts_drafts_short(open_pair):
    s = open_pair("draft", drafter="model", max_tokens=40)
    _, free, _ = run_engine(s, REPEATING[1], draft_tokens=6)
    s2 = open_pair("draft", drafter="model", p_min=0.5, max_tokens=40)
    _, cut, _ = run_engine(s2, REPEATING[1], draft_tokens=6)
    assert cut.drafted / cut.rounds < free.drafted / free.rounds


def test_model_rounds_report_the_draft_entropy(open_pair):
    s = open_pair("draft", drafter="model", max_tokens=20)
    _, stats, _ = run_engine(s, "hello", draft_tokens=3)
    d = stats.by_drafter["model"]
    # Greedy, nothing reads the draft's probabilities: its entropy is taken from one row in STATS_EVERY.
    assert 0 < d.entropy_rounds < d.rounds
    assert 0.0 < d.entropy / d.entropy_rounds <= np.log(260)  # at most log(vocabulary)
    assert stats.as_dict()["by_drafter"]["model"]["mean_entropy"] > 0
    for kw in ({"p_min": 0.01}, {"temp": 0.8}):  # p-min reads every row's, as sampling computes every row's q
        s = open_pair("draft", drafter="model", max_tokens=20, **kw)
        rounds = []
        r = collect(s.generate(s.prompt_tokens("hello"), Inputs(), draft_tokens=3), on_event=rounds.append)
        # Every round that drafted a token has its entropy (the last may draft none: one token left to emit).
        drafting = sum(1 for e in rounds if isinstance(e, Round) and e.drafter == "model" and e.drafted > 0)
        assert r.stats.by_drafter["model"].entropy_rounds == drafting > 0


def test_lookup_sampling_matches_target_only_distribution(open_pair):
    """End to end with the point-mass rule: the first two tokens after a repetitive prompt (lookup
    drafts there), speculative vs target-only sampling, two-sample chi-square at the 1e-4 level."""
    kw = dict(max_tokens=2, temp=1.5, top_k=3)
    spec, plain = open_pair(None, drafter="lookup", **kw), open_pair(None, **kw)
    spec_counts, stats = sample_counts(spec, "abcabcabcab", 1500, draft_tokens=2)
    plain_counts, _ = sample_counts(plain, "abcabcabcab", 1500, draft_tokens=2)
    assert stats.drafted > 1000  # lookup did draft
    ok, stat, cells = same_distribution(spec_counts, plain_counts)
    assert ok and cells > 3, (stat, cells)


def test_a_machine_that_slows_moves_every_cost_alike():
    # A neighbour's load slows every decode; only plain rounds (t(1)) see it. Drafting must not look cheaper.
    c = Costs({1: 0.05, 2: 0.08, 4: 0.11}, draft=0.022, n_max=8, draft_catch_up=0.03, draft_prefill=0.008)
    before = [c.relative(n) for n in range(2, 9)], c.draft_ratio
    for _ in range(40):
        c.observe_verify(1, 0.075)
    assert c.plain == pytest.approx(0.075, rel=0.01)
    assert [c.relative(n) for n in range(2, 9)] == pytest.approx(before[0], rel=0.15)
    assert c.draft_ratio == pytest.approx(before[1], rel=0.15)
    assert c.draft_prefill > 0.008 * 1.3 and c.draft_catch_up > 0.03 * 1.3
