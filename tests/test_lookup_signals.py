"""Lookup's signals for where an edited answer leaves its source, and the tree chooser that spends a flat
stretch of the cost curve on alternatives. Token lists only: no model."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cli.drafting.auto import AutoDrafter
from specdec_cli.drafting.cost import Costs, best_tree
from specdec_cli.engine.drafter import Draft, Outcome
from specdec_cli.drafting.lookup import Candidate, LookupDrafter
from specdec_cli.drafting.matches import occurrences
from specdec_cli.engine.sampling import Sampler
from specdec_cli.engine.shapes import Tree
from specdec_cli.drafting.hints import hints_in, renames_in

GREEDY = Sampler()
RNG = np.random.default_rng(0)
NL = 10  # a token that ends a line
T, EQ, Z, C, S, P, A = range(50, 57)  # `total`, ` =`, ` 0`, `count`, `skipped`, ` +`, `amount`
NEW = [70, 71]  # `subtotal`: two tokens where the old name took one
CODE = [5, 6, 7, NL, T, EQ, Z, NL, C, EQ, Z, NL, S, EQ, Z, NL, T, P, A, NL, 8, 9, NL]
PROMPT = [1, 2, 3, *CODE]


def newline(t: int) -> bool:
    return t == NL


def flat_then_rising(n_max: int = 32) -> Costs:
    """This CPU's shape: each token costs its own up to 8, then up to 16 verify about as much as 9."""
    t1 = 0.04
    return Costs({1: t1, 8: 4 * t1, 9: 5.4 * t1, 16: 5.6 * t1, n_max: 11 * t1}, None, n_max)


def linear(slope: float, n_max: int = 32) -> Costs:
    """Each verified token adds `slope` single decodes."""
    return Costs({1: 0.04, n_max: 0.04 * (1 + slope * (n_max - 1))}, None, n_max)


# --- the instruction ------------------------------------------------------------------------------
def test_hints_are_the_names_the_instruction_mentions_not_the_code_after_it():
    prompt = (
        'Add a `timeout` parameter to fetch_page and pass it to "urlopen".\n\ndef fetch_page(url, retry_count=3): ...'
    )
    assert hints_in(prompt) == ["timeout", "urlopen", "fetch_page"]
    assert renames_in("Rename the variable n to count in this code:\n\nn = 1") == [("n", "count")]
    assert renames_in("Rename `total` to `subtotal`, then return the code.") == [("total", "subtotal")]
    assert renames_in("Pages are supposed to be 1-based.") == []  # "X to Y" in prose is no rename


def test_a_rename_the_instruction_names_is_drafted_at_its_first_occurrence():
    """Without the instruction the first `total` is copied as it was (and rejected)."""
    answer = [5, 6, 7, NL]
    plain = LookupDrafter(newline=newline).candidates(PROMPT + answer, 4)[0]
    told = LookupDrafter(newline=newline, renames=(((T,), tuple(NEW)),)).candidates(PROMPT + answer, 4)[0]
    assert plain.tokens == [T, EQ, Z, NL]
    assert told.tokens == [*NEW, EQ, Z]


def test_a_name_the_instruction_mentions_marks_where_the_copy_may_be_edited():
    answer = [5, 6, 7, NL]
    assert LookupDrafter().candidates(PROMPT + answer, 6)[0].hot is None
    c = LookupDrafter(hints=((C,),)).candidates(PROMPT + answer, 6)[0]
    assert c.tokens == [T, EQ, Z, NL, C, EQ] and c.hot == 4


# --- where the answer edited before ---------------------------------------------------------------
def test_the_context_of_an_earlier_edit_marks_its_next_occurrence():
    d = LookupDrafter()
    answer = [5, 6, 7, NL, T, EQ, Z, NL]
    d.candidates(PROMPT + answer, 4)
    answer += [C, 99]  # after `0 \n count` the answer writes something new: it left the source after (NL, C)
    d.candidates(PROMPT + answer, 4)
    answer += [EQ, Z, NL]  # ... and comes back
    d.candidates(PROMPT + answer, 8)
    # A candidate that passes (NL, C) again is marked at the token the answer replaced last time.
    assert (NL, C) in d.departures
    assert d._hot(np.array(PROMPT + answer), [S, EQ, Z, NL, C, EQ]) == 5
    assert LookupDrafter()._hot(np.array(PROMPT + answer), [S, EQ, Z, NL, C, EQ]) is None


# --- line structure ---------------------------------------------------------------------------------
LONG_LINE = list(range(200, 230))  # a line longer than the re-entry window (REENTRY)
SOURCE = [5, 6, 7, NL, *LONG_LINE, NL, 40, 41, 42, 43, NL, 44, 45]


def test_after_a_rewritten_line_ends_the_copy_goes_on_at_the_next_source_line():
    """The answer rewrote a 30-token line; after its newline, the source's next line follows. The old
    lookup looked only 16 tokens past where the answer left, and a newline alone matches everywhere."""
    d = LookupDrafter(newline=newline)
    prompt = [1, 2, *SOURCE]
    answer = [5, 6, 7, NL, 200]
    d.candidates(prompt + answer, 4)
    answer += [300, 301, 302, 303, NL]  # left the source at 201, wrote its own line
    tokens = {tuple(c.tokens[:4]) for c in d.candidates(prompt + answer, 4)}
    assert (40, 41, 42, 43) in tokens
    assert LookupDrafter().propose(prompt + answer, 4, GREEDY, RNG).tokens[:4] != [40, 41, 42, 43]


def test_a_match_that_reaches_back_over_a_line_start_is_a_whole_line_copy():
    assert LookupDrafter(newline=newline).candidates(PROMPT + [5, 6, 7, NL, S], 4)[0].source == "line-copy"
    assert LookupDrafter(newline=newline).candidates([1, 2, 3, 4, 99, 3, 4], 2)[0].source == "copy"


# --- several candidates -----------------------------------------------------------------------------
def test_an_ambiguous_match_offers_each_continuation():
    text = [1, 2, 3, 7, 8, 1, 2, 3, 9, 9, 1, 2, 3]
    assert occurrences(np.array(text), limit=3) == [(3, 8), (3, 3)]
    sources = {(c.source, c.tokens[0]) for c in LookupDrafter().candidates(text, 2)}
    assert sources == {("copy", 9), ("other", 7)}


def test_earlier_answers_are_a_candidate():
    from specdec_cli.drafting.corpus import Corpus

    corpus = Corpus([np.array([60, 61, 62, 63, 64, 65])])
    c = LookupDrafter(corpus=corpus).candidates([1, 2, 61, 62, 63], 3)
    assert [(x.source, x.tokens) for x in c] == [("cache", [64, 65])]
    assert corpus.match(np.array([61, 62]), 3) == (0, [])  # two tokens are not enough in a large corpus


# --- the chooser: width where the curve is flat -----------------------------------------------------
COPY = (list(range(1, 13)), [0.97] * 12)  # a reliable copy
OTHER = ([1, 2, 3, 4, 5, 6, 99, 98], [0.97] * 6 + [0.2, 0.9])  # an unlikely other continuation after 6 tokens


def test_a_flat_stretch_of_the_curve_carries_alternatives_as_a_tree():
    tokens, parents, e, _ = best_tree([COPY, OTHER], flat_then_rising(), 31, 8, 31)
    assert tokens[:12] == COPY[0] and 99 in tokens  # the copy into the flat stretch, the other branch riding along
    shape = Tree.of(parents)
    assert shape.branches == 2 and shape.depth() == 12


@pytest.mark.parametrize("slope", [0.5, 0.2, 0.1])
def test_a_linear_curve_keeps_only_what_pays_for_itself(slope):
    tokens, parents, _, _ = best_tree([COPY, OTHER], linear(slope), 31, 8, 31)
    assert 99 not in tokens and tokens == COPY[0][: len(tokens)] and len(tokens) >= 6
    assert best_tree([([1, 2], [0.2, 0.2])], linear(0.5), 31, 8, 31)[0] == []  # plain decoding


def test_the_tree_never_has_more_branches_than_sequences_to_verify_them():
    many = [([i, i + 100], [0.2, 0.9]) for i in range(1, 20)]
    tokens, parents, _, _ = best_tree(many, flat_then_rising(), 31, 3, 31)
    assert Tree.of(parents).branches <= 3


@pytest.mark.parametrize("curve", ["flat", 0.5, 0.1])
def test_one_candidate_gets_the_chain_the_trie_would_build(curve):
    """best_tree's chain path (one candidate, in numpy) chooses what the trie does: the same candidate twice
    takes the trie, as identical continuations merge into one."""
    rng = np.random.default_rng(11)
    costs = flat_then_rising() if curve == "flat" else linear(curve)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        c = (rng.integers(0, 1000, n).tolist(), rng.choice([0.0, 0.3, 0.9, 0.99, 1.0, 1.3], n).tolist())
        nodes, depth = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        chain, trie = best_tree([c], costs, nodes, 8, depth), best_tree([c, c], costs, nodes, 8, depth)
        assert chain[:2] == trie[:2] and np.allclose(chain[2:], trie[2:], rtol=1e-12)


def test_siblings_share_one_chance():
    """Two continuations of one point exclude each other: their chances are scaled to sum to at most 1."""
    tokens, parents, e, _ = best_tree([([1], [0.9]), ([2], [0.9])], flat_then_rising(), 31, 8, 31)
    assert sorted(tokens) == [1, 2] and abs(e - 2.0) < 1e-9


# --- the target's confidence ------------------------------------------------------------------------
def test_sure_is_the_targets_probability_of_its_token_at_ninety_percent():
    from specdec_cli.engine.speculative import _sure

    row = np.full(1000, -5.0, dtype=np.float32)
    row[7] = 10.0  # ~1 - 999 * e^-15: sure
    assert _sure(row, 7, Sampler())
    row[8] = 8.0  # e^-2 = 0.135 of the token's mass beside it: p = 0.88
    assert not _sure(row, 7, Sampler())
    row[8] = -5.0
    row[:] = np.where(
        np.arange(1000) == 7, 10.0, 2.0
    )  # no close runner-up, but 999 * e^-8 = 0.34 of the mass in the tail
    assert not _sure(row, 7, Sampler())
    assert _sure(row, 7, Sampler(temp=0.5))  # sharper at a lower temperature: 999 * e^-16


def test_auto_learns_lookup_apart_where_the_target_hesitated():
    """Rounds after tokens the target was unsure of (prose) teach auto that lookup fails there; after a
    token it was sure of (a copy), the chances stay where they were. One learner for both lost both."""
    auto = AutoDrafter(flat_then_rising(), LookupDrafter(), None)
    copy = Candidate(list(range(16)), "copy", 10)
    sure_before = auto._chances(copy)

    def round_after(sure: bool, offered: list[Candidate]) -> None:
        # What propose offered this round, carried by the draft; the target wrote something else.
        auto.observe(
            Draft([], None, offers=tuple(offered)),
            Outcome(path=[], token=999, draft_seconds=0, verify_seconds=0.04, sure=sure),
        )

    round_after(False, [])
    for _ in range(10):
        round_after(False, [copy])
    unsure = auto._chances(copy)
    round_after(True, [])
    assert auto._chances(copy) == sure_before and unsure[0] < 0.2 < sure_before[0]


class DraftModelStandIn:
    """What auto asks of a draft model it never drafts with (it failed), recording rollbacks."""

    name, failed, max_branches, follows_target = "model", True, 1, False

    def __init__(self):
        self.rollbacks: list[tuple[int, int]] = []

    def take_notice(self):
        return None

    def rollback(self, n: int, draft=None, winner: int = 0) -> None:
        self.rollbacks.append((n, winner))


def test_a_lookup_trees_winning_branch_is_not_asked_of_the_draft_models_cache():
    """The draft model has only its main sequence: after a lookup tree won on branch 1, it rolls back as a chain."""
    model = DraftModelStandIn()
    auto = AutoDrafter(flat_then_rising(), LookupDrafter(), model, max_branches=8)
    draft = auto.propose([1, 2, 3, 7, 8, 1, 2, 3, 9, 9, 1, 2, 3], 8, GREEDY, RNG)
    auto.rollback(14, draft, winner=1)
    assert model.rollbacks == [(14, 0)]
