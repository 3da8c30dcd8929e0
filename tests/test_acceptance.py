"""The acceptance rules, in pure numpy: the speculative output must be distributed exactly as p."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specdec_cli.engine.acceptance import greedy_accept, speculative_accept
from specdec_cli.engine.sampling import draw

DRAWS = 40_000


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper 1e-4 quantile of chi-square (Wilson-Hilferty); a fixed seed makes the test deterministic."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    expected = probs * counts.sum()
    mask = expected > 0
    assert counts[~mask].sum() == 0, "a token with zero probability was produced"
    stat = float((((counts - expected) ** 2)[mask] / expected[mask]).sum())
    return stat, int(mask.sum()) - 1


def random_dist(rng, v: int, zeros: int = 0) -> np.ndarray:
    p = rng.random(v) ** 2
    p[rng.choice(v, zeros, replace=False)] = 0
    return p / p.sum()


def spec_two_tokens(p: np.ndarray, q: np.ndarray | None, rng, point_mass_tokens=None) -> tuple[int, int]:
    """Run one k=2 round (drafting from q, or the given deterministic draft) and return the first two
    output tokens, topping up with a plain sample from p when the round emitted only one."""
    if q is None:
        draft = list(point_mass_tokens)
    else:
        draft = [draw(q[0], rng), draw(q[1], rng)]
    m, token = speculative_accept(p, q, draft, rng)
    out = [*draft[:m], token]
    if len(out) == 1:
        out.append(draw(p[1], rng))  # in a real model row 1 would be re-evaluated; here rows are fixed
    return out[0], out[1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampling_rule_yields_exactly_p(seed):
    rng = np.random.default_rng(seed)
    v = 6
    # Rows do not depend on the prefix here, so the first two tokens must be independent draws
    # from p[0] and p[1]. q has zeros where p does not and vice versa: both edge cases of the ratio.
    p = np.stack([random_dist(rng, v, zeros=1) for _ in range(3)])
    q = np.stack([random_dist(rng, v, zeros=1) for _ in range(2)])
    counts = np.zeros((v, v))
    for _ in range(DRAWS):
        a, b = spec_two_tokens(p, q, rng)
        counts[a, b] += 1
    stat, df = chi2(counts.ravel(), np.outer(p[0], p[1]).ravel())
    assert stat < chi2_critical(df), (stat, df)


def test_acceptance_probability_is_sum_of_min_p_q():
    # Sample-and-compare would accept with probability sum(p*q); the paper's rule with sum(min(p, q)).
    rng = np.random.default_rng(5)
    p = np.stack([random_dist(rng, 8), random_dist(rng, 8)])
    q = random_dist(rng, 8)[None, :]
    accepted = sum(speculative_accept(p, q, [draw(q[0], rng)], rng)[0] for _ in range(DRAWS))
    expected = np.minimum(p[0], q[0]).sum()
    sd = math.sqrt(expected * (1 - expected) / DRAWS)
    assert abs(accepted / DRAWS - expected) < 5 * sd
    assert abs(expected - (p[0] * q[0]).sum()) > 10 * sd  # the two rules are distinguishable here


@pytest.mark.parametrize("draft", [[0, 0], [3, 1], [5, 2]])
def test_point_mass_rule_yields_exactly_p(draft):
    rng = np.random.default_rng(11)
    v = 6
    p = np.stack([random_dist(rng, v, zeros=1) for _ in range(3)])
    counts = np.zeros((v, v))
    for _ in range(DRAWS):
        a, b = spec_two_tokens(p, None, rng, point_mass_tokens=draft)
        counts[a, b] += 1
    stat, df = chi2(counts.ravel(), np.outer(p[0], p[1]).ravel())
    assert stat < chi2_critical(df), (stat, df)


def test_all_accepted_gives_bonus_from_last_row():
    rng = np.random.default_rng(0)
    p = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    q = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert speculative_accept(p, q, [1, 2], rng) == (2, 0)


def test_rejection_samples_from_residual_never_the_rejected_token():
    rng = np.random.default_rng(0)
    p = np.array([[0.5, 0.5, 0.0], [1 / 3] * 3])
    q = np.array([[0.0, 0.0, 1.0]])  # the draft token 2 has p = 0: always rejected
    for _ in range(200):
        m, t = speculative_accept(p, q, [2], rng)
        assert m == 0 and t in (0, 1)


@pytest.mark.parametrize(
    "target, draft, expected",
    [
        ([5, 6, 7, 8], [5, 6, 7], (3, 8)),  # all accepted: bonus from the last row
        ([5, 9, 7, 8], [5, 6, 7], (1, 9)),  # first mismatch at 1: the target's token replaces it
        ([4, 6, 7, 8], [5, 6, 7], (0, 4)),
        ([4], [], (0, 4)),  # nothing drafted: plain decoding
    ],
)
def test_greedy_accepts_longest_matching_prefix(target, draft, expected):
    assert greedy_accept(target, draft) == expected
