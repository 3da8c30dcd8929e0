"""This machine's costs, timed: `measure` times target decodes of n tokens and the draft's decodes (quickly when
auto starts, thoroughly for the bench), and a session's `Curve` holds what auto uses: measured on first use,
kept between processes (curves.py), or adopted from the bench's measurement."""

from __future__ import annotations

import functools
import statistics
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Callable

from ..backend import neighbours
from ..engine.context import Context
from ..engine.kv import Sequence
from . import curves
from .cost import PREFILL_BATCH, Costs

# Quick: auto's start-up, a few seconds for the default pair on 2 cores (then kept a day: curves.py).
QUICK_SIZES = (1, 2, 4, 8, 16)  # the rest is interpolated
QUICK_PASSES = 3  # the fastest of three: a decode is often slowed by the OS or a neighbour, never sped up
QUICK_WARMUP = 3  # decodes before timing: the first ones after loading run slow
QUICK_CONTEXT = 32  # tokens of context before each timed decode
# Thorough: the bench's, about 12 s; every size, timed as speculation runs it.
CURVE_MAX = 16  # the bench times t(n) for n = 1..16 (more if a row drafts longer)
REPEATS = 5  # median of 5 decodes per point: steady on a shared machine, cheap enough
WARMUP_SECONDS = 3.0  # right after loading, decodes run ~10% slow for a while
WARMUP_MAX = 150  # ...but tiny models settle within this many decodes
CONTEXT = 64  # tokens of context before each timed decode, so attention costs what it does in use
# A sane idle CPU (doubt): with another program on the cores, llama.cpp's threads wait at every step for the one
# that is descheduled, and a decode runs ~60x slower at the default -t (SmolLM2 on 2 cores: 1.38 s a token).
MIN_BANDWIDTH = 1e9  # bytes/s: a lone token's decode reads every weight once; idle CPUs read 2-100 GB/s (here 8)
DECODE_FLOOR = 0.005  # seconds any decode may take besides that (a tiny model's idle decode: 0.1 ms here)
MIN_SLOPE = 1.25  # t(16) / t(1): 2-10x on an idle CPU (the tiny test models to 1.5B); flatter, t(1) was inflated
MAX_SPREAD = 4.0  # slowest / fastest of the passes at one size (median over sizes): idle 1.0-1.8 here, busy 7-250
# Cores' worth of CPU that other programs may take while a curve is measured with -t leaving them none (a desktop's
# background: ~0.05; one other program decoding or compiling: 1 or more). Beyond it the curve is doubted however it
# looks: the kernel's count (backend/neighbours.py) catches a moderately skewed curve that passes every check above.
MIN_OTHERS = 0.5

# What shows the user that auto measures this machine's costs, given the threads and the curves' folder (the UI's
# spinner): the engine and drafting return data only.
Measuring = Callable[[int, Path], AbstractContextManager[object]]


def unseen(threads: int, folder: Path) -> AbstractContextManager[object]:
    return nullcontext()


class Curve:
    """This machine's costs for a target (and draft) context, as auto uses them: measured on first use
    (about a second; it empties both caches, which `measurements` counts), kept between processes under
    `key` (curves.py; None: never kept), or adopted from a measurement handed in (the bench's thorough
    one); auto refines them as rounds run. `draft`: the draft's context, opened (loaded) when asked for
    (a measurement needs it); None without a draft. `draft_load`: what loading it took, where it was loaded.
    `announce`: what shows that the machine is being measured (the UI's spinner) while it is; `check`: why a
    measurement cannot be the idle machine's (doubt; None: no check), one that is used but never kept. After a
    measurement, `seconds` is what it took and `doubted` the check's answer."""

    def __init__(
        self,
        target: Context,
        draft: Callable[[], Context] | None,
        n_max: int,
        key: str | None = None,
        kept: dict | None = None,
        about: dict | None = None,
        announce: Callable[[], AbstractContextManager[object]] = nullcontext,
        check: Callable[[Costs, float | None], str | None] | None = None,
    ):
        """kept: what curves.load read under `key` (an earlier process's measurement), or None; about: what
        the curve is kept with (curves.save)."""
        self.target, self.draft, self.n_max, self.key, self.about = target, draft, n_max, key, about
        self.announce, self.check = announce, check
        self.seconds = 0.0
        self.doubted: str | None = None
        self.costs: Costs | None = None
        self.measurements = 0
        self.source: str | None = None  # "measured" | "cached" | "given": where the costs came from
        self._kept = Costs(n_max=n_max, **kept) if kept else None
        self.draft_load: float | None = None

    def keep(self) -> None:
        """Keep the curve again with the draft's figures auto has just timed (an EAGLE-3 or DFlash draft's, the MTP
        heads'): a later process knows them without loading the draft, and leaves it unloaded where it cannot pay."""
        if self.key is not None and self.costs is not None and self.source == "measured" and not self.doubted:
            curves.save(self.key, self.costs.kept(), self.about)  # (its age stays its own)

    def adopt(self, measured: Costs) -> Costs:
        self.costs = measured.copy(self.n_max)  # auto refines its own copy, sized for its drafts
        self.source = "given"
        return self._loaded()

    def get(self, tokens: list[int]) -> Costs:
        if self.costs is None and self._kept is not None:
            self.costs, self.source = self._kept.copy(), "cached"
        elif self.costs is None:
            with self.announce():
                draft = self.draft() if self.draft else None  # (loaded first: its time is not the measurement's)
                t0, before = time.perf_counter(), neighbours.sample()
                self.costs = measure(self.target, draft, tokens, self.n_max)
                self.seconds = time.perf_counter() - t0
                others = neighbours.since(before)  # (who else ran meanwhile: not the measurement's time)
            self.measurements += 1
            self.source = "measured"
            # A doubted measurement is used for this run (it is the machine as it is now; auto refines it as rounds
            # run), never kept: a later run, the machine idle again, measures its own.
            self.doubted = self.check(self.costs, others) if self.check else None
            if self.key is not None and not self.doubted:
                curves.save(self.key, self._loaded().kept(), self.about)
        return self._loaded()

    def _loaded(self) -> Costs:
        if self.draft_load is not None:  # loaded in this process: its own figure
            self.costs.draft_load = self.draft_load
        return self.costs

    def check_drift(self) -> None:
        """After a run: a kept curve that auto's observations moved far from (plain decoding's cost, the one
        every round observes, off by more than curves.DRIFT either way) is dropped: measured next time."""
        if self.source == "cached" and self._kept is not None:
            ratio = self.costs.plain / self._kept.plain
            if not 1 / curves.DRIFT <= ratio <= curves.DRIFT:
                curves.drop(self.key)
                self._kept = None


def of_pair(
    target: Context,
    draft: Callable[[], Context] | None,
    paths: list[Path],
    threads: int,
    exact: bool,
    where: str,
    n_max: int,
    weight_bytes: int,
    *,
    anew: bool,
    measuring: Measuring,
    warn: Callable[[str], None],
) -> Curve:
    """A session's curve for the computation of `paths` (the target's file first) on this machine: kept from an
    earlier process (unless `anew`), else measured at the first need while `measuring` shows it. Only a local CPU's
    costs are checked for sense (doubt): a GPU's verify curve is flat, an RPC server's decode slow."""
    about = curves.about(paths, threads, exact, where, n_max)
    key = curves.key(about)
    check = (lambda costs, others: doubt(costs, weight_bytes, threads, others)) if where == "local" else None
    announce = functools.partial(measuring, threads, curves.folder())
    kept = None if anew else curves.load(key, warn)
    return Curve(target, draft, n_max, key=key, kept=kept, about=about, announce=announce, check=check)


def measure(
    target: Context, draft: Context | None, tokens: list[int], n_max: int = 64, thorough: bool = False
) -> Costs:
    """Time target decodes of n tokens and one-token draft decodes, after the prompt's tokens as context.
    Quick: the QUICK_SIZES up to n_max, the fastest of two passes, interpolated. Thorough: every n up to
    n_max, medians, each target decode right after a draft decode and vice versa (switching models costs
    ~1-2 ms on a CPU), t(1) also back to back as plain decoding runs, and the draft's catch-up decode."""
    context = CONTEXT if thorough else QUICK_CONTEXT
    sizes = list(range(1, n_max + 1)) if thorough else [n for n in QUICK_SIZES if n <= n_max]
    longest = max(sizes[-1], PREFILL_BATCH if draft is not None else 0)
    filler = (tokens * (1 + (context + longest) // max(len(tokens), 1)))[: context + longest]
    prefix, batch = filler[:context], filler[context:]
    seq = Sequence.empty(target)
    seq.append(prefix)
    dseq = Sequence.empty(draft) if draft is not None else None
    # A draft of another vocabulary gets ids of its own: what a token is does not change what its decode costs.
    dprefix, dbatch = ([t % draft.n_vocab for t in part] for part in (prefix, batch)) if draft else (prefix, batch)
    if dseq is not None:
        dseq.append(dprefix)

    def back(s: Sequence, text: list[int]) -> None:
        """To the context again. A recurrent state drops only what its snapshots cover (kv.Sequence): each
        timed decode may leave tokens behind, so it starts over from the context (untimed) now and then."""
        s.rollback(max(context, s.floor))
        if len(s) > 2 * context:
            s.rollback(context)  # clears it
            s.append(text[len(s) :])

    def t_target(n: int) -> float:
        return _timed(lambda: seq.append(batch[:n], outputs="all"), lambda: back(seq, prefix))

    def t_draft(n: int) -> float:
        return _timed(lambda: dseq.append(dbatch[:n]), lambda: back(dseq, dprefix))

    samples: dict[int, list[float]] = {n: [] for n in sizes}
    plain, drafts, catch_up, prefill = [], [], [], []
    if thorough:
        start = time.perf_counter()
        for _ in range(WARMUP_MAX):
            if time.perf_counter() - start > WARMUP_SECONDS:
                break
            t_target(4)
            if dseq is not None:
                t_draft(1)
        # Whole passes over n rather than n after n, so that drift on a shared machine spreads evenly.
        for _ in range(REPEATS):
            plain += [t_target(1) for _ in range(3)]
            for n in sizes:
                if dseq is not None:
                    drafts.append(t_draft(1))  # the draft runs, then the target verifies
                samples[n].append(t_target(n))
            if dseq is not None:
                catch_up.append(t_draft(2))
                prefill.append(t_draft(PREFILL_BATCH) / PREFILL_BATCH)
    else:
        for n in [sizes[-1]] * QUICK_WARMUP + sizes * QUICK_PASSES:
            samples[n].append(t_target(n))
        if dseq is not None:
            drafts = [t_draft(1) for _ in range(3)]
            prefill = [t_draft(PREFILL_BATCH) / PREFILL_BATCH]
    seq.rollback(0)
    if dseq is not None:
        dseq.rollback(0)
    # Thorough: medians of five. Quick: the fastest of the passes (the OS slows a decode, it never speeds one
    # up), and the median of three draft decodes.
    median = statistics.median
    # (the quick passes' spread, warm-ups left out: an idle machine repeats a decode within ~10%, a busy one not)
    spread = None if thorough else median(max(s[-QUICK_PASSES:]) / min(s[-QUICK_PASSES:]) for s in samples.values())
    return Costs(
        {n: (median(s) if thorough else min(s)) for n, s in samples.items()},
        median(drafts) if drafts else None,
        n_max,
        plain=median(plain) if plain else None,
        draft_catch_up=median(catch_up) if catch_up else None,
        draft_prefill=median(prefill) if prefill else None,
        spread=spread,
    )


def shared(others: float | None, threads: int, cores: int | None = None) -> bool:
    """Whether other programs took more of the machine's `cores` than -t left them, by more than MIN_OTHERS (a
    background's share): timings taken then are of a shared machine (`others`: neighbours.others; None: unknown)."""
    cores = cores or neighbours.cores()
    return others is not None and others > max(MIN_OTHERS, cores - threads + MIN_OTHERS / 2)


def doubt(
    costs: Costs, weight_bytes: int, threads: int, others: float | None = None, cores: int | None = None
) -> str | None:
    """Why a quick measurement on this CPU cannot be the idle machine's (None: it can), in words with what to try:
    other programs took more than MIN_OTHERS cores' worth (`others`, None: unknown) beyond what -t left them of the
    machine's `cores`; a lone token's decode slower than reading the target's `weight_bytes` at MIN_BANDWIDTH (plus
    DECODE_FLOOR); verifying 16 tokens less than MIN_SLOPE times one (every CPU pays for a batch's arithmetic: a flat
    curve is an inflated t(1), and makes drafting look free); or passes that fell MAX_SPREAD apart (the fastest of
    them is kept, and the OS let few through)."""
    cores = cores or neighbours.cores()
    crowded = shared(others, threads, cores)
    one = costs.plain
    limit = DECODE_FLOOR + weight_bytes / MIN_BANDWIDTH
    big = max((n for n in costs.measured if n <= 16), default=1)
    slope = costs.verify(big) / one
    # (passes of sub-DECODE_FLOOR decodes fall apart on the OS's jitter alone: a busy machine's are slow as well)
    noisy = one > DECODE_FLOOR and (costs.spread or 1.0) > MAX_SPREAD
    slow, flat = one > limit, big >= 8 and slope < MIN_SLOPE
    if not (crowded or slow or flat or noisy):
        return None
    taken = (
        f"other programs took {others:.1f} of its {cores} CPUs while auto measured it at -t {threads}; "
        if crowded
        else ""
    )
    seen = (
        taken
        + f"one token took {_shown(one)}"
        + (f" (its {_bytes(weight_bytes)} of weights take {_shown(limit)} at most)" if slow else "")
    )
    seen += f", verifying {big} {'only ' if flat else ''}{slope:.2f}x that" + (
        f" (an idle CPU: {MIN_SLOPE}x or more)" if flat else ""
    )
    seen += f", the same decode {costs.spread:.0f}x slower in one pass than in another" if noisy else ""
    fewer = f", or try fewer threads (-t {threads // 2})" if threads > 1 else ""
    return f"the machine looks busy: {seen}; this cost curve is used for this run but not kept: close other programs{fewer}"


def _bytes(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} KB"


def _shown(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 0.1 else f"{1000 * seconds:.1f} ms"


def _timed(run, undo) -> float:
    t0 = time.perf_counter()
    run()
    seconds = time.perf_counter() - t0
    undo()
    return seconds
