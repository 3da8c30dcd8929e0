"""Samplers are values: one object, built once from the options, processes target and draft logits alike.

Processing order: temperature, top-k, top-p, min-p, then renormalise. The same function gives p
(target) and q (draft), which the lossless acceptance rule requires.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """The processed distribution for one row of logits: float64, sums to 1."""
        # The max off first: dividing by a tiny temperature then cannot overflow (and the finiteness check
        # judges the model's own logits, not the division).
        z = (logits.astype(np.float64) - _finite_max(logits)) / self.temp
        if 0 < self.top_k < z.size:
            kth = np.partition(z, -self.top_k)[-self.top_k]
            z[z < kth] = -np.inf
        p = np.exp(z)
        p /= p.sum()
        if self.top_p < 1.0:
            p = _top_p(p, self.top_p)
        if self.min_p > 0.0:
            p[p < self.min_p * p.max()] = 0.0
        return p / p.sum()

    def dist(self, logits: np.ndarray) -> np.ndarray:
        """The draft's distribution over its next token: `probs` when sampling; when greedy (which
        needs none to draw) the plain softmax, for the draft's confidence and entropy."""
        if not self.greedy:
            return self.probs(logits)
        z = np.exp(logits - _finite_max(logits))
        return z / z.sum()


def _finite_max(z: np.ndarray) -> float:
    """The row's maximum, which softmax subtracts anyway; max() propagates NaN, so the same reduction
    catches NaN anywhere and +inf. -inf entries are fine (probability 0) unless every entry is -inf."""
    top = z.max()
    if not np.isfinite(top):
        raise NonFiniteLogits(f"logits hold {'NaN' if np.isnan(top) else top}")
    return top


def is_distribution(q: np.ndarray) -> bool:
    """A finite, non-negative vector summing to 1 (within rounding)."""
    total = q.sum()
    return bool(np.isfinite(total) and abs(total - 1.0) < 1e-6 and q.min() >= 0.0)


def entropy(p: np.ndarray) -> float:
    """In nats."""
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


def _top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest most-probable set whose mass reaches top_p (nucleus sampling)."""
    n = 64  # a full sort of a 150k vocabulary costs ~10 ms; the nucleus is usually far smaller
    while True:
        if n < p.size:
            idx = np.argpartition(p, -n)[-n:]
        else:
            idx = np.arange(p.size)
        idx = idx[np.argsort(-p[idx], kind="stable")]
        mass = np.cumsum(p[idx])
        if mass[-1] >= top_p or n >= p.size:
            keep = idx[: int(np.searchsorted(mass, top_p)) + 1]
            out = np.zeros_like(p)
            out[keep] = p[keep]
            return out
        n *= 8


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from an (unnormalised) non-negative vector; never a zero-probability token."""
    c = np.cumsum(p)
    i = int(np.searchsorted(c, rng.random() * c[-1], side="right"))
    return min(i, p.size - 1)
