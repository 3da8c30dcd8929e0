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
WARMUP_MAX = 150  # ...but tiny models settle within this many decodes
CONTEXT = 64  # decode after this many tokens of context, so attention costs what it does in use


@dataclass(frozen=True)
class CostCurve:
    """Measured as speculation runs: each target decode right after a draft decode and vice versa
    (switching models costs ~1-2 ms on a CPU), and t(1) also alone, as plain decoding runs."""

    target: dict[int, float]  # n -> seconds for one target decode of n tokens (after a draft decode)
    draft: float | None  # seconds for a draft decode of one token; None without a draft
    plain: float | None = None  # seconds per token of plain decoding (target alone); default target[1]
    draft_catch_up: float | None = None  # a draft decode of 2 tokens: the first one after a fully accepted round

    @property
    def t_plain(self) -> float:
        return self.plain if self.plain is not None else self.target[1]

    @property
    def c(self) -> float | None:
        """t_draft / t_target(1): the draft's cost in target tokens."""
        return self.draft / self.t_plain if self.draft is not None else None

    def relative(self, n: int) -> float:
        return self.target[n] / self.t_plain

    def draft_round(self, a: float, k: int) -> float:
        """Drafting k tokens costs k one-token decodes, except that after a fully accepted round
        (probability a^k) the first decode also feeds the draft the token it never saw."""
        extra = (self.draft_catch_up - self.draft) if self.draft_catch_up is not None else 0.0
        return k * self.draft + (a**k) * extra

    def as_dict(self) -> dict:
        r = lambda x: round(x, 6) if x is not None else None  # noqa: E731
        return {
            "target_seconds": {str(n): round(t, 6) for n, t in self.target.items()},
            "target_relative": {str(n): round(self.relative(n), 3) for n in self.target},
            "plain_seconds_per_token": r(self.t_plain),
            "draft_seconds_per_token": r(self.draft),
            "draft_catch_up_seconds": r(self.draft_catch_up),
            "c": round(self.c, 4) if self.c is not None else None,
        }


def expected_tokens_per_round(a: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): drafted tokens accepted in a row, plus the target's own token."""
    if k == 0:
        return 1.0
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def predicted_speedup(curve: CostCurve, a: float, k: int) -> float:
    """E[tokens per round] * t_plain / (t_draft_round + t_target(k + 1)): Leviathan et al.'s
    speed-up with the measured costs (k * t_draft + t_target(k+1), plus the draft's catch-up)."""
    if k == 0:
        return 1.0
    return expected_tokens_per_round(a, k) * curve.t_plain / (curve.draft_round(a, k) + curve.target[k + 1])


def measure(target: Context, draft: Context | None, tokens: list[int], max_n: int = CURVE_MAX) -> CostCurve:
    """Time target decodes of n = 1..max_n tokens and draft decodes, after CONTEXT tokens of context."""
    filler = (tokens * (1 + (CONTEXT + max_n) // max(len(tokens), 1)))[: CONTEXT + max_n]
    prefix, batch = filler[:CONTEXT], filler[CONTEXT:]
    seq = Sequence.empty(target)
    seq.append(prefix)
    dseq = None
    if draft is not None:
        dseq = Sequence.empty(draft)
        dseq.append(prefix)

    def t_target(n: int) -> float:
        return _timed(lambda: seq.append(batch[:n], outputs="all"), lambda: seq.rollback(CONTEXT))

    def t_draft(n: int) -> float:
        return _timed(lambda: dseq.append(batch[:n]), lambda: dseq.rollback(CONTEXT))

    # Warm up first: decodes right after loading run slower for a while and would inflate t(1).
    start = time.perf_counter()
    for _ in range(WARMUP_MAX):
        if time.perf_counter() - start > WARMUP_SECONDS:
            break
        t_target(4)
        if dseq is not None:
            t_draft(1)
    # Whole passes over n rather than n after n, so that drift on a shared machine spreads evenly.
    samples: dict[int, list[float]] = {n: [] for n in range(1, max_n + 1)}
    plain, drafts, catch_up = [], [], []
    for _ in range(REPEATS):
        plain += [t_target(1) for _ in range(3)]  # back to back, as plain decoding runs
        for n in samples:
            if dseq is not None:
                drafts.append(t_draft(1))  # the draft runs, then the target verifies
            samples[n].append(t_target(n))
        if dseq is not None:
            catch_up.append(t_draft(2))
    seq.rollback(0)
    if dseq is not None:
        dseq.rollback(0)
    median = statistics.median
    return CostCurve(
        target={n: median(t) for n, t in samples.items()},
        draft=median(drafts) if drafts else None,
        plain=median(plain),
        draft_catch_up=median(catch_up) if catch_up else None,
    )


def _timed(run, undo) -> float:
    t0 = time.perf_counter()
    run()
    seconds = time.perf_counter() - t0
    undo()
    return seconds
