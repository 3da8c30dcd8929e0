"""Samplers are values: one object, built once from the options, processes target and draft logits alike.

Processing order: temperature, top-k, top-p, min-p, then renormalise. The same function gives p
(target) and q (draft), which the lossless acceptance rule requires.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


TINY_TEMP = 1e-30  # below this temperature a row is scaled in float64: in float32, 1 / temp would overflow
SAFE_SUM = 1e37  # a row's weights summed below this: none overflowed float32 (3.4e38) on the way
DRAW_BLOCK = 1024  # draw's blocks: ~150 of them over a 150k vocabulary, each a short cumulative sum


class NonFiniteLogits(ValueError):
    """A row of logits holds NaN or +infinity: no distribution can be made from it. The caller knows
    whose row it was (the target's is an error; a draft's stops that drafter)."""


@dataclass(frozen=True)
class Sampler:
    temp: float = 0.0  # 0 = greedy (argmax); no distribution is ever computed then
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off

    @property
    def greedy(self) -> bool:
        return self.temp == 0.0

    def probs(self, logits: np.ndarray, wide: bool = True) -> np.ndarray:
        """The processed distribution for one row of logits: float64, sums to 1. wide=False: float32, normalised in
        place (the target's rows in the acceptance rule, which reads an entry or two of each and draws from one:
        a float64 copy would double what is written for nothing the float32 weights did not already round)."""
        w, _, s = self._exp(logits)
        p = w if not wide else w.astype(np.float64)
        p *= p.dtype.type(1.0 / (s if not wide else total(p)))
        return p

    def weights(self, logits: np.ndarray) -> np.ndarray:
        """`probs` unnormalised (what `draw` takes), in float32: its exp costs a third of float64's on 150k ids
        (llama.cpp's sampler works in float32 too; target and draft rows go through this one function)."""
        return self._exp(logits)[0]

    def probs_entropy(self, logits: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """`probs(wide=False)` (written into `out` where given: a draft's q row, in place) and its entropy in nats.
        As log p = z - log(sum) over the scaled logits z, the entropy is one dot product (~0.01 ms) rather than a
        log pass over p (~0.25 ms on 150k ids)."""
        w, z, s = self._exp(logits, out, keep_z=True)
        with np.errstate(invalid="ignore"):
            nats = math.log(s) - float(np.dot(w, z)) / s  # NaN where top-k cut (0 * -inf): the log pass below
        if out is None:
            out = w
        elif w is not out:
            out[:] = w
        out *= out.dtype.type(1.0 / s)
        return out, nats if math.isfinite(nats) else entropy(out)

    def _exp(
        self, logits: np.ndarray, out: np.ndarray | None = None, keep_z: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None, float]:
        """(w, z, sum of w): the weights w = exp(z) after the cuts (in `out` where it fits), z the scaled logits
        (None unless kept). First z = logits / temperature as they are: two passes fewer than taking the max off
        first (~0.04 ms of ~0.15 on 150k ids). The max matters only where exp could overflow or lose the top to
        underflow; then the sum says so (infinite, NaN, or below the 1 that a top at or above 0 gives) and the
        row is done again the careful way, which also refuses NaN and +infinity. Either way the same weights up
        to float32's rounding of the scaled logits (~1e-6 relative where logits reach ~30)."""
        if self.temp >= TINY_TEMP:
            z = np.multiply(logits, np.float32(1.0 / self.temp), dtype=np.float32)
            with np.errstate(over="ignore", invalid="ignore"):  # (the sum below tells)
                w, s = self._weigh(self._top_k(z), out, keep_z)
            if 1.0 <= s < SAFE_SUM:
                return w, z if keep_z else None, s
        z = self._scaled(logits)
        w, s = self._weigh(z, out, keep_z)
        return w, z if keep_z else None, s

    def _weigh(self, z: np.ndarray, out: np.ndarray | None, keep_z: bool) -> tuple[np.ndarray, float]:
        dst = out if out is not None and out.dtype == z.dtype else None if keep_z else z
        w = self._cut(np.exp(z, out=dst))
        return w, total(w)

    def _scaled(self, logits: np.ndarray) -> np.ndarray:
        """(logits - max) / temperature, top-k's cut at -inf: a new array."""
        # The max off first: dividing by a tiny temperature then cannot overflow (and the finiteness check
        # judges the model's own logits, not the division). One buffer, changed in place: on a 150k row every
        # temporary costs as much as the arithmetic.
        if self.temp >= TINY_TEMP:
            z = np.subtract(logits, _finite_max(logits), dtype=np.float32)
            z *= np.float32(1.0 / self.temp)  # (a float32 division costs twice the multiply)
        else:
            z = np.subtract(logits, _finite_max(logits), dtype=np.float64)
            z /= self.temp
        return self._top_k(z)

    def _top_k(self, z: np.ndarray) -> np.ndarray:
        if 0 < self.top_k < z.size:
            kth = np.partition(z, -self.top_k)[-self.top_k]
            z[z < kth] = -np.inf
        return z

    def _cut(self, w: np.ndarray) -> np.ndarray:
        """top-p and min-p on unnormalised weights."""
        if self.top_p < 1.0:
            w = _top_p(w, self.top_p)
        if self.min_p > 0.0:
            w[w < self.min_p * w.max()] = 0.0
        return w

    def dist(self, logits: np.ndarray) -> np.ndarray:
        """The draft's distribution over its next token: `probs` when sampling; when greedy (which
        needs none to draw) the plain softmax, for the draft's confidence and entropy."""
        if not self.greedy:
            return self.probs(logits)
        z = np.exp(logits - _finite_max(logits))
        return z / z.sum()


class Argmax:
    """Each row's best token (the first of equal maxima, as numpy's argmax over the rows), found when the greedy
    rule first reads the row: it stops at the first mismatch, and a pass over 150k logits costs ~10 us."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows
        self._best: dict[int, int] = {}

    def __getitem__(self, i: int) -> int:
        if i not in self._best:
            row = self.rows[i]
            best = int(row.argmax())
            # argmax lands on a NaN or +inf when the row has one: checking the chosen value checks the row
            # (math's check: numpy's costs ~0.4 us on a scalar, every round).
            if not math.isfinite(row[best]):
                raise NonFiniteLogits("logits hold NaN or infinity")
            self._best[i] = best
        return self._best[i]


def block_sums(w: np.ndarray) -> np.ndarray:
    """The sums of w's DRAW_BLOCK-long blocks (the last may be shorter), in float64: one matrix-vector product
    through BLAS (~5 us over 150k float32 ids, each block summed in float32: ~2e-7 relative; numpy's sum and
    reduceat take ~25 us)."""
    if w.dtype not in (np.float32, np.float64):
        w = w.astype(np.float64)
    n = w.size - w.size % DRAW_BLOCK
    head = (w[:n].reshape(-1, DRAW_BLOCK) @ _ones(w.dtype)).astype(np.float64)
    return np.append(head, w[n:].sum(dtype=np.float64)) if n < w.size else head


_ONES: dict[np.dtype, np.ndarray] = {}


def _ones(dtype: np.dtype) -> np.ndarray:
    if dtype not in _ONES:
        _ONES[dtype] = np.ones(DRAW_BLOCK, dtype=dtype)
    return _ONES[dtype]


def total(w: np.ndarray) -> float:
    """sum(w), by blocks (`block_sums`)."""
    return float(block_sums(w).sum())


def _finite_max(z: np.ndarray) -> float:
    """The row's maximum, which softmax subtracts anyway; max() propagates NaN, so the same reduction
    catches NaN anywhere and +inf. -inf entries are fine (probability 0) unless every entry is -inf."""
    top = z.max()
    if not np.isfinite(top):
        raise NonFiniteLogits(f"logits hold {'NaN' if np.isnan(top) else top}")
    return top


def is_distribution(q: np.ndarray) -> bool:
    """A finite, non-negative vector summing to 1 (within rounding)."""
    s = total(q)
    # float32 rows: each entry rounded at 6e-8 when normalised, the sum by blocks to ~2e-7
    return bool(math.isfinite(s) and abs(s - 1.0) < (1e-6 if q.dtype == np.float64 else 1e-5) and q.min() >= 0.0)


def entropy(p: np.ndarray) -> float:
    """In nats; in float32 (a statistic: a float64 log over 150k ids, zeros picked out, cost ~0.5 ms)."""
    p = p.astype(np.float32)
    # A zero's log is the smallest normal's instead of -inf: 0 * log is then 0, not NaN.
    return -float(np.dot(p, np.log(np.maximum(p, np.finfo(np.float32).tiny))))


def softmax_summary(logits: np.ndarray) -> tuple[float, float, float]:
    """(max, normaliser, entropy in nats) of a row's plain softmax: what a greedy draft reads of its distribution
    (token i's probability is exp(logits[i] - max) / normaliser), from one exp pass in float32 (statistics and a
    predictor: rounding does not matter), without the normalised copy and the log pass that `dist` and
    `entropy` take (~0.1 ms against ~0.35 on 150k ids)."""
    top = _finite_max(logits)
    z = np.subtract(logits, top, dtype=np.float32)
    e = np.exp(z)
    s = total(e)
    with np.errstate(invalid="ignore"):
        h = math.log(s) - float(np.dot(e, z)) / s  # -sum(p log p), as log p = z - log(s)
    return float(top), s, h if math.isfinite(h) else entropy(e / s)  # (a -inf logit: 0 * -inf is NaN)


def _top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest most-probable set whose mass reaches top_p of the whole (nucleus sampling; p need not
    be normalised)."""
    reach = top_p * p.sum(dtype=np.float64)
    n = 64  # a full sort of a 150k vocabulary costs ~10 ms; the nucleus is usually far smaller
    while True:
        if n < p.size:
            idx = np.argpartition(p, -n)[-n:]
        else:
            idx = np.arange(p.size)
        idx = idx[np.argsort(-p[idx], kind="stable")]
        mass = np.cumsum(p[idx], dtype=np.float64)
        if mass[-1] >= reach or n >= p.size:
            keep = idx[: int(np.searchsorted(mass, reach)) + 1]
            out = np.zeros_like(p)
            out[keep] = p[keep]
            return out
        n *= 8


def draw(p: np.ndarray, rng: np.random.Generator, blocks: np.ndarray | None = None) -> int:
    """One token from an (unnormalised) non-negative vector; never a zero-probability token. The inverse CDF in
    two steps, the block and then the token in it: a cumulative sum over a whole 150k vocabulary is sequential
    (~0.3 ms), over the block sums and one block ~0.03 ms. The token one cumulative sum would give, but where
    rounding moves the point a hair across a boundary (the same sums, added in another order). `blocks`: p's
    `block_sums` where the caller has them."""
    if p.size <= DRAW_BLOCK:
        c = np.cumsum(p)
        return _first_past(c, rng.random() * c[-1], p)
    blocks = block_sums(p) if blocks is None else blocks
    c = np.cumsum(blocks)
    x = rng.random() * c[-1]
    b = _first_past(c, x, blocks)
    block = p[b * DRAW_BLOCK : (b + 1) * DRAW_BLOCK]
    return b * DRAW_BLOCK + _first_past(np.cumsum(block), x - (c[b - 1] if b else 0.0), block)


def _first_past(c: np.ndarray, x: float, p: np.ndarray) -> int:
    """The first index whose cumulative sum c exceeds x (its own mass is > 0); past the end, which only
    rounding reaches, the last with mass."""
    i = int(np.searchsorted(c, x, side="right"))
    if i < len(c):
        return i
    mass = np.flatnonzero(p)
    return int(mass[-1]) if mass.size else len(c) - 1
