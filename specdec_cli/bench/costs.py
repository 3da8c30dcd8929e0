"""The cost model: what a draft token and a verification of n tokens cost on this machine, and the
speed-up that follows for a given acceptance (Leviathan et al. 2023, with the measured verify cost)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..backend.native import Context
from ..engine.kv import Sequence

CURVE_MAX = 16  # the verify-cost curve is measured for n = 1..16 (more if a row drafts longer)
REPEATS = 3  # median of 3 decodes per point: enough on a quiet machine, cheap enough (~5 s in all)
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
    curve = {}
    for n in range(1, max_n + 1):
        curve[n] = _median_time(lambda: seq.append(batch[:n], outputs="all"), lambda: seq.rollback(CONTEXT))
    draft_cost = None
    if draft is not None:
        dseq = Sequence.empty(draft)
        dseq.append(prefix)
        draft_cost = _median_time(lambda: dseq.append(batch[:1]), lambda: dseq.rollback(CONTEXT), repeats=3 * REPEATS)
        dseq.rollback(0)
    seq.rollback(0)
    return CostCurve(curve, draft_cost)


def _median_time(run, undo, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
        undo()
    return statistics.median(times)
