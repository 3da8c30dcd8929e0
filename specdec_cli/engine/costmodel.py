"""What a round costs and what it yields: the inputs `--drafter auto` maximises tokens per second with.

Verifying n tokens costs t(n) seconds: measured at start-up (about a second), refined online from
every verification. On a CPU t(n) grows almost linearly until the batch is large enough for the
matrix-multiply kernels (n = 8..16 here), so a long draft can be cheaper per token than a short one.
"""

from __future__ import annotations

import time
from typing import Sequence as Seq

import numpy as np

from ..backend.native import Context
from .kv import Sequence

MEASURE_SIZES = (1, 2, 4, 8, 16)  # two passes: ~1 s for a 1.5B model on 2 cores; the rest is interpolated
MEASURE_PASSES = 2  # the faster of two: a single decode is often slowed by the OS, rarely sped up
WARMUP = 3  # decodes before timing: the first ones after loading run slow
SMOOTHING = 0.2  # weight of a new observation: follows drift within ~5 rounds, shrugs off one preempted decode
MAX_SAMPLE_RATIO = 2.0  # an observation 2x off the estimate is clipped: the OS paused us, the model did not change


class Costs:
    """t(n) for n = 1..n_max (seconds per target decode of n tokens) and the draft's cost per token."""

    def __init__(self, verify: dict[int, float], draft: float | None = None, n_max: int = 64):
        sizes = sorted(verify)
        n = np.arange(1, n_max + 1)
        table = np.interp(n, sizes, [verify[s] for s in sizes])
        last = sizes[-1]  # beyond the last size: the same cost per token (the kernels are saturated by then)
        table[n > last] = verify[last] * n[n > last] / last
        self.table = table
        self.draft = draft

    def verify(self, n: int) -> float:
        return float(self.table[min(n, len(self.table)) - 1])

    @property
    def plain(self) -> float:
        return self.verify(1)

    def observe_verify(self, n: int, seconds: float) -> None:
        self.table[n - 1] = _smooth(self.table[n - 1], seconds)

    def observe_draft(self, seconds_per_token: float) -> None:
        self.draft = seconds_per_token if self.draft is None else _smooth(self.draft, seconds_per_token)

    def catch_up(self, gap: int) -> float:
        """A draft decode of `gap` tokens, scaled by the target's curve (the same kernels at another size)."""
        if gap <= 1 or self.draft is None:
            return 0.0
        return self.draft * (self.verify(gap) / self.plain - 1.0)


def _smooth(old: float, new: float) -> float:
    new = min(max(new, old / MAX_SAMPLE_RATIO), old * MAX_SAMPLE_RATIO)
    return old + SMOOTHING * (new - old)


def measure(target: Context, draft: Context | None, tokens: list[int], n_max: int = 64) -> Costs:
    """Time target decodes of each size in MEASURE_SIZES, and three draft decodes, after the prompt's
    own tokens as context. Interpolated between sizes; `Costs.observe_*` refine it as generation runs."""
    sizes = [n for n in MEASURE_SIZES if n <= n_max]
    filler = (tokens * (1 + (32 + max(sizes)) // max(len(tokens), 1)))[: 32 + max(sizes)]
    prefix, batch = filler[:32], filler[32:]
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    seq = Sequence.empty(target)
    seq.append(prefix)
    for n in [sizes[-1]] * WARMUP + sizes * MEASURE_PASSES:
        samples[n].append(_timed(lambda: seq.append(batch[:n], outputs="all")))
        seq.rollback(len(prefix))
    seq.rollback(0)
    t_draft = None
    if draft is not None:
        dseq = Sequence.empty(draft)
        dseq.append(prefix)
        times = []
        for t in batch[:3]:
            times.append(_timed(lambda: dseq.append([t])))
        dseq.rollback(0)
        t_draft = float(np.median(times))
    return Costs({n: min(s) for n, s in samples.items()}, t_draft, n_max)


def _timed(run) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def expected_tokens(accept: Seq[float]) -> np.ndarray:
    """E[tokens emitted] for every draft length 0..k, where accept[i] is the chance that draft token
    i+1 is accepted given that tokens 1..i were: 1 (the target's own token) + sum of prefix products."""
    return np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(accept))))


def best_length(accept: Seq[float], costs: Costs, draft_cost: Seq[float] | float = 0.0) -> tuple[int, float, float]:
    """(k, tokens per second, expected tokens) for the best draft length k in 0..len(accept).
    draft_cost: seconds to draft k tokens, for every k (or one cost per token); k = 0 is plain decoding."""
    k_max = len(accept)
    e = expected_tokens(accept)
    if np.isscalar(draft_cost):
        spend = np.arange(k_max + 1) * float(draft_cost)
    else:
        spend = np.concatenate(([0.0], np.asarray(draft_cost, dtype=float)))
    seconds = spend + np.array([costs.verify(k + 1) for k in range(k_max + 1)])
    rate = e / seconds
    k = int(np.argmax(rate))
    return k, float(rate[k]), float(e[k])
