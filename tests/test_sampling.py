"""The sampler processes logits the same way for target and draft; these are its properties."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cli.engine.sampling import Sampler, draw


@pytest.fixture
def logits():
    return np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 3


def test_probs_is_a_distribution(logits):
    p = Sampler(temp=0.8).probs(logits)
    assert p.dtype == np.float64 and abs(p.sum() - 1) < 1e-12 and (p > 0).all()


def test_temperature_sharpens(logits):
    cold, hot = Sampler(temp=0.5).probs(logits), Sampler(temp=2.0).probs(logits)
    assert cold.max() > hot.max() and cold.argmax() == hot.argmax() == logits.argmax()


def test_top_k_keeps_exactly_k(logits):
    p = Sampler(temp=1.0, top_k=7).probs(logits)
    assert (p > 0).sum() == 7
    assert set(np.flatnonzero(p)) == set(np.argsort(logits)[-7:])


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.999])
def test_top_p_keeps_smallest_nucleus(logits, top_p):
    full = Sampler(temp=1.0).probs(logits)
    p = Sampler(temp=1.0, top_p=top_p).probs(logits)
    kept = np.flatnonzero(p)
    order = np.argsort(-full)
    n = len(kept)
    assert set(kept) == set(order[:n])  # the most probable tokens
    assert full[order[:n]].sum() >= top_p - 1e-12  # reaching the mass
    assert full[order[: n - 1]].sum() < top_p  # and no more than needed


def test_min_p_drops_tokens_below_fraction_of_top(logits):
    full = Sampler(temp=1.0).probs(logits)
    p = Sampler(temp=1.0, min_p=0.2).probs(logits)
    assert set(np.flatnonzero(p)) == set(np.flatnonzero(full >= 0.2 * full.max()))


def test_greedy_flag():
    assert Sampler().greedy and not Sampler(temp=0.1).greedy


def test_draw_never_picks_a_zero_probability_token():
    rng = np.random.default_rng(1)
    p = np.array([0.0, 0.3, 0.0, 0.0, 0.7, 0.0])
    seen = {draw(p, rng) for _ in range(2000)}
    assert seen == {1, 4}
