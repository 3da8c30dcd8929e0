"""The round's fast paths (issue 46: on a GPU the host's work per token decides the speed) give what the plain
numpy they replace gave: the same argmax, ties included; the same draws; the same distributions and verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specdec_cli.engine.acceptance import multi_draft_accept
from specdec_cli.engine.sampling import (
    DRAW_BLOCK,
    Argmax,
    NonFiniteLogits,
    Sampler,
    draw,
    entropy,
    softmax_summary,
)
from specdec_cli.engine.shapes import Tree

VOCAB = 151_936  # Qwen2.5's: rows this wide are what the fast paths are for


def logits(rng, rows: int = 1, width: int = VOCAB) -> np.ndarray:
    """Rows shaped as a model's: spread ~3.5, a token well above the rest."""
    z = (3.5 * rng.standard_normal((rows, width))).astype(np.float32)
    z[np.arange(rows), rng.integers(0, width, rows)] = 16.0
    return z


def test_lazy_argmax_is_numpys_argmax_over_the_rows_ties_included():
    rng = np.random.default_rng(0)
    rows = logits(rng, 6)
    rows[1, [7, 90_000, 151_935]] = 40.0  # equal maxima: the first id, as argmax(axis=1) picks it
    rows[2, :] = 1.0  # all equal: id 0
    rows[3, [VOCAB - 1, VOCAB - 2]] = 41.0
    lazy = Argmax(rows)
    assert [lazy[i] for i in range(len(rows))] == rows.argmax(axis=1).tolist()
    assert lazy[1] == 7 and lazy[2] == 0 and lazy[3] == VOCAB - 2


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_lazy_argmax_refuses_a_row_it_reads_with_nan_or_infinity(bad):
    rows = logits(np.random.default_rng(1), 3)
    rows[1, 5] = bad
    lazy = Argmax(rows)
    assert isinstance(lazy[0], int) and isinstance(lazy[2], int)  # rows read one by one
    with pytest.raises(NonFiniteLogits):
        lazy[1]


def test_greedy_verification_reads_no_row_after_the_first_mismatch():
    """Rows after the first rejected draft token are never used: they are never searched (one pass each)."""
    from specdec_cli.engine.shapes import CHAIN

    rows = logits(np.random.default_rng(2), 5)
    best = rows.argmax(axis=1).tolist()
    rows[2:] = np.nan  # would raise if read
    path, token = CHAIN.greedy_accept(Argmax(rows), [best[0], best[1] + 1, 5, 6])
    assert (path, token) == ([0], best[1])


def reference_draw(p: np.ndarray, u: float) -> int:
    """The draw as one cumulative sum over the whole vector (what `draw` did before it went by blocks)."""
    c = np.cumsum(p)
    return min(int(np.searchsorted(c, u * c[-1], side="right")), p.size - 1)


class Fixed:
    """An rng whose next random() is u."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


def test_draw_by_blocks_is_the_draw_of_one_cumulative_sum():
    rng = np.random.default_rng(3)
    p = Sampler(temp=0.7).probs(logits(rng)[0])
    us = rng.random(2_000)
    assert [draw(p, Fixed(u)) for u in us] == [reference_draw(p, u) for u in us]


def test_draw_by_blocks_never_picks_a_zero_probability_token_and_follows_p():
    rng = np.random.default_rng(4)
    p = np.zeros(5 * DRAW_BLOCK + 17)
    live = np.r_[3, DRAW_BLOCK - 1, 2 * DRAW_BLOCK, 2 * DRAW_BLOCK + 5, 5 * DRAW_BLOCK + 2]  # whole blocks empty
    p[live] = [0.1, 0.2, 0.3, 0.15, 0.25]
    n = 40_000
    counts = np.bincount([draw(p, rng) for _ in range(n)], minlength=p.size)
    assert set(np.flatnonzero(counts)) <= set(live.tolist())
    assert np.abs(counts[live] / n - p[live]).max() < 0.01
    # The very end of the mass (rounding can take the point there) is the last token with mass, never one without.
    assert draw(p, Fixed(math.nextafter(1.0, 0.0))) == live[-1]
    assert draw(np.r_[0.5, 0.5, np.zeros(DRAW_BLOCK * 2)], Fixed(math.nextafter(1.0, 0.0))) == 1


def test_weights_are_probs_unnormalised_and_probs_sum_to_one():
    rng = np.random.default_rng(5)
    z = logits(rng)[0]
    for sampler in (Sampler(temp=0.7), Sampler(temp=1.0, top_k=40), Sampler(temp=0.9, top_p=0.9, min_p=0.05)):
        p, w = sampler.probs(z), sampler.weights(z)
        assert p.dtype == np.float64 and abs(p.sum() - 1.0) < 1e-12
        assert np.allclose(p, w / w.sum(dtype=np.float64), rtol=1e-12, atol=0)
        assert set(np.flatnonzero(p)) == set(np.flatnonzero(w))


def test_probs_entropy_is_probs_and_their_entropy_written_in_place():
    rng = np.random.default_rng(6)
    z = logits(rng)[0]
    for sampler in (Sampler(temp=0.7), Sampler(temp=1.0, top_k=40), Sampler(temp=1.2, min_p=0.01)):
        out = np.empty(VOCAB, np.float32)  # a draft's q row
        p, nats = sampler.probs_entropy(z, out)
        assert p is out and np.array_equal(p, sampler.probs(z, wide=False))
        assert np.allclose(p, sampler.probs(z), rtol=1e-5, atol=1e-12)
        nz = p[p > 0].astype(np.float64)
        assert abs(nats - float(-(nz * np.log(nz)).sum())) < 1e-4


def test_entropy_counts_zeros_as_nothing():
    p = np.array([0.5, 0.0, 0.25, 0.25, 0.0])
    assert abs(entropy(p) - 1.5 * math.log(2)) < 1e-6


def test_softmax_summary_is_the_plain_softmax():
    rng = np.random.default_rng(7)
    for z in (logits(rng)[0], np.r_[np.float32(-np.inf), logits(rng, 1, 1000)[0]]):
        top, total, nats = softmax_summary(z)
        p = np.exp(z.astype(np.float64) - z.max())
        p /= p.sum()
        assert top == z.max() and abs(1.0 / total - p.max()) < 1e-6
        nz = p[p > 0]
        assert abs(nats - float(-(nz * np.log(nz)).sum())) < 1e-4


def test_sure_decides_as_the_float64_softmax_does():
    from specdec_cli.engine.speculative import SURE, _sure

    rng = np.random.default_rng(8)
    checked = 0
    for peak in np.linspace(12.0, 24.0, 40):
        z = logits(rng)[0]
        token = int(z.argmax())
        z[token] = peak
        for sampler in (Sampler(), Sampler(temp=0.7)):
            scale = 1.0 if sampler.greedy else 1.0 / sampler.temp
            p = 1.0 / np.exp((z.astype(np.float64) - peak) * scale).sum()
            if abs(p - SURE) > 1e-4:  # (rounding decides right at the threshold)
                assert _sure(z, token, sampler) == (p >= SURE), (peak, p)
                checked += 1
    assert checked > 60


def test_a_point_mass_tree_rejects_as_with_explicit_one_hot_rows():
    """multi_draft_accept's q=None (deterministic drafts) removes the rejected token from r, which is what
    max(0, r - q) does with q a one-hot row: the same path and token for the same random numbers."""
    rng = np.random.default_rng(9)
    v = 50
    tree = Tree.of([-1, 0, -1, 2, -1])
    tokens = [3, 4, 3 + 1, 7, 9]
    one_hot = np.zeros((len(tokens), v))
    one_hot[np.arange(len(tokens)), tokens] = 1.0
    for trial in range(300):
        p = rng.random((len(tokens) + 1, v)) ** 4
        p /= p.sum(axis=1, keepdims=True)
        a = multi_draft_accept(p, None, tokens, list(tree.parents), np.random.default_rng(trial))
        b = multi_draft_accept(p, one_hot, tokens, list(tree.parents), np.random.default_rng(trial))
        assert a == b, trial


def test_a_tree_in_node_order_is_verified_without_a_copy():
    """Tree.verify hands back the decode's rows as they are when the layout is node order (most lookup trees),
    and reorders them otherwise: row i + 1 follows node i either way."""
    from test_round_loop import FakeContext

    from specdec_cli.engine.kv import Branches, Sequence

    class Recording(FakeContext):
        def decode_tree(self, *args, **kwargs):
            self.last = super().decode_tree(*args, **kwargs)
            return self.last

    for parents, tokens, after in [
        ([-1, 0, -1], [4, 5, 9], [4, 5, 6, 10]),  # laid out 0, 1, 2: node order
        ([-1, -1, 0], [4, 9, 5], [4, 5, 10, 6]),  # laid out 0, 2, 1
    ]:
        ctx = Recording()
        target = Branches(Sequence(ctx))
        target.main.append([1, 2])
        tree = Tree.of(parents)
        rows = tree.verify(target, [3], tokens)
        assert rows.argmax(axis=1).tolist() == after
        assert (rows is ctx.last) == (tree.layout() == sorted(tree.layout()))


def test_greedy_runs_make_no_random_generator():
    """numpy.random's first import costs ~20 ms of the first token's time, and greedy decoding draws nothing."""
    from test_round_loop import FakeContext

    from specdec_cli.engine.drafter import EMPTY, Drafter
    from specdec_cli.engine.kv import Sequence
    from specdec_cli.engine.speculative import Settings, generate

    class Seen(Drafter):
        def propose(self, committed, k, sampler, rng):
            self.rng = rng
            return EMPTY

    for sampler, want in ((Sampler(), type(None)), (Sampler(temp=0.8), np.random.Generator)):
        drafter = Seen()
        list(generate(Sequence(FakeContext()), drafter, [1, 2, 3], Settings(max_tokens=3, sampler=sampler, seed=0)))
        assert isinstance(drafter.rng, want)


@pytest.mark.parametrize("shift", [-400.0, -60.0, 0.0, 30.0, 90.0, 600.0])
def test_probs_do_not_depend_on_where_the_logits_sit(shift):
    """The weights are taken without the max off first where exp can neither overflow nor lose the top to
    underflow; elsewhere the careful way: every shift of a row gives its distribution (softmax is shift-free)."""
    rng = np.random.default_rng(8)
    z = logits(rng)[0]
    for sampler in (Sampler(temp=0.7), Sampler(temp=1.0, top_k=40), Sampler(temp=0.3, min_p=0.05)):
        ref = Sampler.probs(sampler, z.astype(np.float64) - z.max())
        p, nats = sampler.probs_entropy(z + np.float32(shift))
        assert np.allclose(p, ref, rtol=2e-4, atol=1e-9) and p.dtype == np.float32
        assert np.allclose(sampler.probs(z + np.float32(shift)), ref, rtol=2e-4, atol=1e-9)
        assert abs(nats - entropy(ref)) < 1e-3


def test_a_row_with_nan_or_infinity_is_refused_on_every_path():
    for bad in (np.nan, np.inf):
        z = logits(np.random.default_rng(9))[0]
        z[17] = bad
        for call in (Sampler(temp=0.7).probs, Sampler(temp=0.7).weights, Sampler(temp=1.0).probs_entropy):
            with pytest.raises(NonFiniteLogits):
                call(z)
