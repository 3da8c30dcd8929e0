"""The cost model: what a draft token and a verification of n tokens cost on this machine, and the
speed-up that follows for a given acceptance (Leviathan et al. 2023, with the measured verify cost)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..backend.native import Context
from ..engine.kv import Sequence

CURVE_MAX = 16  # the verify-cost curve is measured for n = 1..16 (more if a row drafts longer)
REPEATS = 5  # median of 5 decodes per point: steady on a shared machine, cheap enough (~12 s in all)
WARMUP_SECONDS = 3.0  # decode before timing anything: right after loading, decodes run ~10% slow for a while
CONTEXT = 64  # decode after this many tokens of context, so attention costs what it does in use


@dataclass(frozen=True)
class CostCurve:
    target: dict[int, float]  # n -> seconds for one target decode of n tokens
    draft: float | None  # seconds per draft token (one decode of one token); None without a draft

    @property
    def c(self) -> float | None:
        """t_draft / t_target(1): the draft's cost in target tokens."""
        return self.draft / self.target[1] if self.draft is not None else None

    def relative(self, n: int) -> float:
        return self.target[n] / self.target[1]

    def as_dict(self) -> dict:
        return {
            "target_seconds": {str(n): round(t, 6) for n, t in self.target.items()},
            "target_relative": {str(n): round(self.relative(n), 3) for n in self.target},
            "draft_seconds_per_token": round(self.draft, 6) if self.draft is not None else None,
            "c": round(self.c, 4) if self.c is not None else None,
        }


def expected_tokens_per_round(a: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): drafted tokens accepted in a row, plus the target's own token."""
    if k == 0:
        return 1.0
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def predicted_speedup(curve: CostCurve, a: float, k: int, draft_seconds: float | None = None) -> float:
    """E[tokens per round] * t_target(1) / (k * t_draft + t_target(k + 1))."""
    if k == 0:
        return 1.0
    t_draft = curve.draft if draft_seconds is None else draft_seconds
    return expected_tokens_per_round(a, k) * curve.target[1] / (k * t_draft + curve.target[k + 1])


def measure(target: Context, draft: Context | None, tokens: list[int], max_n: int = CURVE_MAX) -> CostCurve:
    """Time target decodes of n = 1..max_n tokens and single draft decodes, after CONTEXT tokens."""
    filler = (tokens * (1 + (CONTEXT + max_n) // max(len(tokens), 1)))[: CONTEXT + max_n]
    prefix, batch = filler[:CONTEXT], filler[CONTEXT:]
    seq = Sequence.empty(target)
    seq.append(prefix)
    dseq = None
    if draft is not None:
        dseq = Sequence.empty(draft)
        dseq.append(prefix)
    # Warm up first: the first decodes after loading page the weights in and would inflate t(1).
    start = time.perf_counter()
    while time.perf_counter() - start < WARMUP_SECONDS:
        _timed(lambda: seq.append(batch[:4], outputs="all"), lambda: seq.rollback(CONTEXT))
        if dseq is not None:
            _timed(lambda: dseq.append(batch[:1]), lambda: dseq.rollback(CONTEXT))
    # Whole passes over n rather than n after n, so that drift on a shared machine spreads evenly.
    samples: dict[int, list[float]] = {n: [] for n in range(1, max_n + 1)}
    draft_samples: list[float] = []
    for _ in range(REPEATS):
        for n in samples:
            samples[n].append(_timed(lambda: seq.append(batch[:n], outputs="all"), lambda: seq.rollback(CONTEXT)))
        if dseq is not None:
            for _ in range(3):
                draft_samples.append(_timed(lambda: dseq.append(batch[:1]), lambda: dseq.rollback(CONTEXT)))
    seq.rollback(0)
    if dseq is not None:
        dseq.rollback(0)
    curve = {n: statistics.median(t) for n, t in samples.items()}
    return CostCurve(curve, statistics.median(draft_samples) if draft_samples else None)


def _timed(run, undo) -> float:
    t0 = time.perf_counter()
    run()
    seconds = time.perf_counter() - t0
    undo()
    return seconds
