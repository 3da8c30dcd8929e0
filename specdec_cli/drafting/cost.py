"""The cost model: what a round of speculation costs on this machine and what it yields.

A round drafts k tokens and verifies them in one target decode of k+1 tokens. It emits
E[tokens | k] = 1 + sum_j prod_{i<=j} a_i tokens (a_i: the chance that draft token i is accepted once
1..i-1 were), so its rate is E[tokens | k] / (draft cost(k) + t(k+1)) against plain decoding's 1 / t(1):
Leviathan et al. (2023) with the measured verify cost t(n) instead of "verifying k+1 costs one".
On a CPU t(n) grows almost linearly until the batch is large enough for the matrix-multiply kernels
(n = 8..16 here), so a long draft can be cheaper per token than a short one: t(n) is measured, not assumed.

`--drafter auto` maximises that rate every round (`best_length`); the bench predicts each row's
speed-up with the same functions from the same `Costs`, which it hands to the session for auto to start
from, so its predicted-vs-measured check validates what auto uses. measure.py times the machine once per
session; `Costs.observe_*` refine it as rounds run.
"""

from __future__ import annotations

from typing import Sequence as Seq

import numpy as np


PREFILL_BATCH = 32  # the draft's prefill is timed as one decode of this many tokens (its cost per token)
# Online refinement.
SMOOTHING = 0.2  # weight of a new observation: follows drift within ~5 rounds, shrugs off one preempted decode
MAX_SAMPLE_RATIO = 2.0  # an observation 2x off the estimate is clipped: the OS paused us, the model did not change
# A shared machine slows (or frees) every decode alike, so an observation moves the whole curve and the draft's
# costs (by SMOOTHING), and its own size apart from the rest only by SHAPE: the measured shape is trusted more
# than the pace. Moving one size alone would make the sizes a run observes often (t(1): every plain round) part
# from the rest, so that drafting looked cheaper, or dearer, than it is: under a neighbour's load t(1) rose while
# t(2..) stayed, the draft model seemed to pay, and a chat answer took 1.4x its time.
SHAPE = 0.05


class Costs:
    """t(n) for n = 1..n_max (seconds per target decode of n tokens) and the draft's cost per token.
    Where measured apart: `plain`, plain decoding's seconds per token (back to back), which stands for
    t(1) since a round that drafts nothing is plain decoding; `draft_catch_up`, a draft decode of
    2 tokens (the first one after a fully accepted round, which feeds the draft the token it never saw);
    `draft_prefill`, the draft's seconds per token of a PREFILL_BATCH-token decode (its window's prefill);
    `draft_load`, the seconds it took to load the draft model and open its context."""

    shared = False  # others' rows in the run's next step (a lone run has none; Loaded: a slot's)

    def __init__(
        self,
        verify: dict[int, float],
        draft: float | None = None,
        n_max: int = 64,
        plain: float | None = None,
        draft_catch_up: float | None = None,
        draft_prefill: float | None = None,
        draft_load: float | None = None,
        draft_source: str | None = None,
        spread: float | None = None,
    ):
        self.measured = dict(sorted(verify.items()))  # t(n) as timed (after a draft decode): the bench reports it
        self.draft = draft
        self.draft_source = draft_source  # whose figures draft, draft_catch_up, draft_prefill are (use_draft)
        self.spread = spread  # a fresh measurement's: how far its passes at one size fell apart (slowest / fastest)
        self._drafts: dict[str, tuple] = {}  # other sources' figures, while another's are in use
        self.draft_catch_up = draft_catch_up
        self.draft_prefill = draft_prefill
        self.draft_load = draft_load
        self._plain = plain
        points = {**self.measured, 1: plain} if plain is not None else self.measured
        sizes = sorted(points)
        n = np.arange(1, n_max + 1)
        table = np.interp(n, sizes, [points[s] for s in sizes])
        last = sizes[-1]  # beyond the last size: the same cost per token (the kernels are saturated by then)
        table[n > last] = points[last] * n[n > last] / last
        self.table = table

    def copy(self, n_max: int | None = None) -> Costs:
        """Its own Costs to refine, from the same measurement, with a table of n_max sizes."""
        return Costs(
            self.measured,
            self.draft,
            n_max or len(self.table),
            self._plain,
            self.draft_catch_up,
            self.draft_prefill,
            self.draft_load,
            self.draft_source,
        )

    def kept(self) -> dict:
        """The measurement, as curves.py keeps it (Costs' arguments; before auto refines it)."""
        return dict(
            verify=self.measured,
            draft=self.draft,
            plain=self._plain,
            draft_catch_up=self.draft_catch_up,
            draft_prefill=self.draft_prefill,
            draft_load=self.draft_load,
            draft_source=self.draft_source,
        )

    def verify(self, n: int) -> float:
        return float(self.table[min(n, len(self.table)) - 1])

    def verify_many(self, n: np.ndarray) -> np.ndarray:
        """t(n) for an array of sizes."""
        return self.table[np.minimum(n, len(self.table)) - 1]

    def beyond(self, n: np.ndarray) -> np.ndarray:
        """t(n) past the table too: its last size's cost per token beyond it (the kernels are saturated there)."""
        last = len(self.table)
        return np.where(n <= last, self.table[np.minimum(n, last) - 1], self.table[-1] * n / last)

    @property
    def plain(self) -> float:
        return self.verify(1)

    @property
    def draft_ratio(self) -> float | None:
        """t_draft / t_target(1): the draft's cost in target tokens (the paper's c)."""
        return self.draft / self.plain if self.draft is not None else None

    def relative(self, n: int) -> float:
        return self.verify(n) / self.plain

    def catch_up(self, gap: int) -> float:
        """The extra cost of a draft decode of `gap` tokens over one (`draft_batch`)."""
        return self.draft_batch(gap) - self.draft if gap > 1 and self.draft is not None else 0.0

    def draft_batch(self, n: int) -> float:
        """Seconds for one draft decode of n tokens: measured for 1 and 2 (the catch-up after a fully accepted
        round) and per token at PREFILL_BATCH, which stands for longer batches (a window's prefill); between
        them, the target's curve at the draft's scale (the same kernels at another size)."""
        if self.draft is None or n <= 1:
            return self.draft or 0.0
        if n == 2 and self.draft_catch_up is not None:
            return self.draft_catch_up
        if n >= PREFILL_BATCH and self.draft_prefill is not None:
            return n * self.draft_prefill
        return self.draft * self.verify(n) / self.plain

    def drafting(self, k: int, catch_up: float, block: bool = False) -> np.ndarray:
        """Seconds to draft 1..k tokens with the model: k decodes, the first one also feeding the gap (`block`: one
        decode drafts them all, a DFlash block)."""
        return catch_up + (np.ones(k) if block else np.arange(1, k + 1)) * (self.draft or 0.0)

    def draft_round(self, a: float, k: int) -> float:
        """Expected seconds to draft k tokens when each is accepted with probability a: k one-token decodes,
        plus the measured catch-up after a fully accepted round (probability a^k); none where not measured."""
        extra = self.catch_up(2) if self.draft_catch_up is not None else 0.0
        return k * (self.draft or 0.0) + a**k * extra

    def use_draft(self, source: str, timing) -> bool:
        """The draft's figures of `source` (a drafter's name) from now on: each source its own (a session may draft
        with the target's heads in one run and a draft in another: a bench sweep). The first source takes what the
        curve has (a draft model's, measured with it), where it has any; another's are timed by `timing()` ->
        (seconds a decode, a catch-up decode of 2, a token of a long feed) the first time, and kept. Returns whether it
        timed them now."""
        if self.draft_source == source:
            return False
        if self.draft_source is not None:
            self._drafts[self.draft_source] = (self.draft, self.draft_catch_up, self.draft_prefill)
            figures = self._drafts.get(source)
        else:
            figures = None if self.draft is None else (self.draft, self.draft_catch_up, self.draft_prefill)
        timed = figures is None
        self.draft, self.draft_catch_up, self.draft_prefill = timing() if timed else figures
        self.draft_source = source
        return timed

    def observe_verify(self, n: int, seconds: float) -> None:
        old = self.table[n - 1]
        pace = _smooth(old, seconds) / old  # the machine's drift: every cost alike
        self.table *= pace
        for name in ("draft", "draft_catch_up", "draft_prefill"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name) * pace)
        self.table[n - 1] = _smooth(self.table[n - 1], seconds, SHAPE)  # this size's own shape, slowly

    def observe_draft(self, seconds_per_token: float) -> None:
        self.draft = seconds_per_token if self.draft is None else _smooth(self.draft, seconds_per_token)


class Loaded(Costs):
    """Costs as one of several generations that share each decode (a server's slots) sees them. Where its next step
    carries r rows besides its own token (as its last step foretells them: StepFigures.beside), drafting n - 1 tokens
    adds t(r + n) - t(r + 1) to the step, and what the step was to make waits that long: q tokens at stake, its own next
    one, each other generating row (a token it may make), and a prompt's chunk as one (its rows make no token: its
    request waits like one generation). Drafting pays the step where it adds tokens faster than the step's own rate q /
    t(r + 1); alone a round pays where E / t(n) beats 1 / t(1). Its rounds are weighed so, as if alone, at t'(n) = t(1)
    + W (t(r + n) - t(r + 1)) with W = q t(1) / t(r + 1): t(n) itself alone. Counting a chunk's rows as tokens at stake
    made a 256-token prompt chunk beside it look like 256 tokens waiting, and auto drafted nothing where drafting would
    have given the drafting request about 4x its rate for 2% on the step; counting generations instead of their rows
    undercounts a step of drafting neighbours (4 slots each verifying 4 rows), and drafts grew the step past what they
    paid: 4 clients measured 0.77x. A draft's decodes are steps the others wait for too: its figures by the same factor.

    In exact mode each slot decodes in a context of its own, one slot a step: a step carries its own rows alone,
    and t'(n) = t(n). Its drafts delay the others' steps by t(n) - t(1) a cycle, but over a cycle of every slot's
    steps the generations make (q - 1 + E) tokens in (q - 1) t(1) + t(n), more than q in q t(1) exactly where E /
    t(n) beats 1 / t(1): the alone condition (tests/test_parallel.py).

    A live view of the shared `costs` and of the slot's last step (`step.last_step`): each primitive below is
    restated; everything else Costs computes from them (a method of Costs that read its own table would raise here,
    having none, rather than answer for a lone run). A step's cost is learned once a step, by the one part it says
    `teaches`."""

    def __init__(self, costs: Costs, step):
        self.costs, self.step = costs, step  # (not Costs.__init__: no table of its own)

    def _load(self) -> tuple[float, float]:
        """(r: rows besides its own token, W: the weight of a row added to the step)."""
        f, c = self.step.last_step, self.costs
        r = f.beside
        if not r:
            return 0, 1.0
        return r, max(f.stake, 1) * c.verify(1) / float(c.beyond(np.asarray(r + 1)))

    @property
    def waiting(self) -> float:
        return self._load()[1]

    @property
    def shared(self) -> bool:
        return bool(self.step.last_step.beside)

    def verify(self, n: int) -> float:
        return float(self.verify_many(np.asarray(n)))

    def verify_many(self, n: np.ndarray) -> np.ndarray:
        (r, w), c = self._load(), self.costs
        if not r:
            return c.verify_many(n)
        return c.verify(1) + w * (c.beyond(np.asarray(n) + r) - float(c.beyond(np.asarray(r + 1))))

    def draft_batch(self, n: int) -> float:
        return self.costs.draft_batch(n) * self.waiting

    def _scaled(self, name: str) -> float | None:
        """One of the draft's figures, as the others in its step wait for it (None: not measured)."""
        seconds = getattr(self.costs, name)
        return None if seconds is None else seconds * self.waiting

    draft = property(lambda self: self._scaled("draft"))
    draft_catch_up = property(lambda self: self._scaled("draft_catch_up"))
    draft_prefill = property(lambda self: self._scaled("draft_prefill"))
    draft_load = property(lambda self: self._scaled("draft_load"))

    @property
    def draft_source(self) -> str | None:
        return self.costs.draft_source

    def use_draft(self, source: str, timing) -> bool:
        """The draft's figures timed, where they are, on the decoding thread (Steps.call): on this slot's own thread a
        small decode ran many times slower (a second OpenMP team against the first's spinning one), and auto kept
        the target's heads from drafting."""
        return self.costs.use_draft(source, lambda: self.step.steps.call(timing))

    def observe_verify(self, n: int, seconds: float) -> None:
        """The step's own time (the round's includes the steps that went before it), once a step: t(its tokens)."""
        f = self.step.last_step
        if f.teaches and f.rows <= len(self.costs.table):
            self.costs.observe_verify(f.rows, f.seconds)

    def observe_draft(self, seconds_per_token: float) -> None:
        """Not learned beside others: a round's drafting time includes the steps that went before its own."""

    def copy(self, n_max: int | None = None) -> Costs:
        raise TypeError("a slot's view of the costs is not a measurement to copy")

    kept = copy


def _smooth(old: float, new: float, weight: float = SMOOTHING) -> float:
    new = min(max(new, old / MAX_SAMPLE_RATIO), old * MAX_SAMPLE_RATIO)
    return old + weight * (new - old)


def rate(expected, draft_seconds, costs: Costs, drafted):
    """Tokens per second of a round that drafts `drafted` tokens in `draft_seconds` and is expected to emit
    `expected`: E / (draft seconds + t(drafted + 1)). The one formula every choice maximises (numbers, or
    arrays over draft lengths)."""
    if isinstance(drafted, int):
        return expected / (draft_seconds + costs.verify(drafted + 1))
    return expected / (draft_seconds + costs.verify_many(np.asarray(drafted) + 1))


def expected_tokens(accept: Seq[float]) -> np.ndarray:
    """E[tokens emitted] for every draft length 0..k, where accept[i] is the chance that draft token
    i+1 is accepted given that tokens 1..i were: 1 (the target's own token) + sum of prefix products."""
    return np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(accept))))


def expected_tokens_per_round(a: float, k: int) -> float:
    """The same with one acceptance a for every token: (1 - a^(k+1)) / (1 - a)."""
    return float(expected_tokens([a] * k)[-1])


def best_length(accept: Seq[float], costs: Costs, draft_cost: Seq[float] | float = 0.0) -> tuple[int, float, float]:
    """(k, tokens per second, expected tokens) for the best draft length k in 0..len(accept).
    draft_cost: seconds to draft k tokens, for every k (or one cost per token); k = 0 is plain decoding."""
    k_max = len(accept)
    e = expected_tokens(accept)
    if np.isscalar(draft_cost):
        spend = np.arange(k_max + 1) * float(draft_cost)
    else:
        spend = np.concatenate(([0.0], np.asarray(draft_cost, dtype=float)))
    rates = rate(e, spend, costs, np.arange(k_max + 1))
    k = int(np.argmax(rates))
    return k, float(rates[k]), float(e[k])


def predicted_speedup(costs: Costs, a: float, k: int) -> float:
    """A chain of k draft tokens, each accepted with probability a, over plain decoding:
    E[tokens | k] * t(1) / (draft cost(k) + t(k+1))."""
    if k == 0:
        return 1.0
    return rate(expected_tokens_per_round(a, k), costs.draft_round(a, k), costs, k) * costs.plain


def best_tree(
    candidates: Seq[tuple[Seq[int], Seq[float]]], costs: Costs, max_nodes: int, max_leaves: int, max_depth: int
) -> tuple[list[int], list[int], float, float]:
    """The draft tree that maximises expected tokens per second over the candidates' tokens.

    candidates: (tokens, a) pairs, a[i] the chance that token i is right once tokens 0..i-1 were. They
    are merged into a trie (shared prefixes once); where they part, their chances are exclusive (one
    token is right), scaled to sum to at most 1. A node's reach P (its whole path right) adds P to
    E[tokens]; taking nodes best reach first is the best tree for any node count n, and n is chosen to
    maximise E / t(n + 1). So the cost curve decides the width: where verifying more tokens costs about
    the same (a CPU's flat stretch, a GPU), unlikely alternatives ride along; where each token costs its
    own, only likely ones do. Returns (tokens, parents (-1: the committed text), E, rate)."""
    plain = rate(1.0, 0.0, costs, 0)
    # Most rounds of most answers end here: n nodes give at most n times the likeliest first token's chance,
    # and if even that cannot beat plain decoding at any n, no tree can (the trie is not built).
    first = max((a[0] for _, a in candidates if len(a)), default=0.0)
    n = np.arange(1, max_nodes + 1)
    if first <= 0.0 or not (rate(1.0 + n * min(first, 1.0), 0.0, costs, n) > plain).any():
        return [], [], 1.0, plain
    if len(candidates) == 1:  # a chain (most lookup rounds): the trie below, in numpy
        toks, accept = candidates[0]
        m = min(len(toks), len(accept), max_depth, max_nodes)
        # A node's reach is its chance times its parent's (a lone child's chance capped at 1, as siblings' sum is)
        e = np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(np.minimum(np.asarray(accept[:m], float), 1.0)))))
        rates = rate(e, 0.0, costs, np.arange(m + 1))
        n = int(np.argmax(rates))
        if not n or rates[n] <= plain:
            return [], [], 1.0, plain
        return [int(t) for t in toks[:n]], list(range(-1, n - 1)), float(e[n]), float(rates[n])
    tokens: list[int] = []
    parents: list[int] = []
    chance: list[float] = []  # P(node right | parent right), before scaling siblings
    children: dict[int, dict[int, int]] = {}
    for toks, accept in candidates:
        node = -1
        for depth, (t, a) in enumerate(zip(toks, accept)):
            if depth >= max_depth:
                break
            kids = children.setdefault(node, {})
            if t in kids:
                node = kids[t]
                chance[node] = max(chance[node], float(a))
                continue
            kids[t] = len(tokens)
            tokens.append(int(t))
            parents.append(node)
            chance.append(float(a))
            node = len(tokens) - 1
    reach = [0.0] * len(tokens)
    for parent, kids in sorted(children.items()):  # parents before children: nodes are numbered in order
        total = sum(chance[c] for c in kids.values())
        scale = 1.0 / total if total > 1.0 else 1.0
        for c in kids.values():
            reach[c] = (reach[parent] if parent >= 0 else 1.0) * chance[c] * scale
    order = sorted(range(len(tokens)), key=lambda i: (-reach[i], i))  # a parent never after its child
    chosen: list[int] = []
    taken: set[int] = {-1}
    leaves: set[int] = set()
    e = [1.0]  # e[n]: E with the first n chosen
    for i in order:
        if len(chosen) == max_nodes:
            break
        parent = parents[i]
        if parent not in taken or (parent not in leaves and len(leaves) >= max_leaves):
            continue  # its parent was left out, or it would be a branch with no sequence left to verify it in
        chosen.append(i)
        taken.add(i)
        leaves.discard(parent)
        leaves.add(i)
        e.append(e[-1] + reach[i])
    # Every node count's rate at once (a call per node was most of a round's bookkeeping); the first best wins.
    rates = rate(np.asarray(e), 0.0, costs, np.arange(len(e)))
    n = int(np.argmax(rates))
    best = (n, e[n], float(rates[n])) if n and rates[n] > plain else (0, 1.0, plain)  # (nodes, E, rate)
    keep = sorted(chosen[: best[0]])  # creation order: parents first
    index = {old: new for new, old in enumerate(keep)}
    return ([tokens[i] for i in keep], [index[parents[i]] if parents[i] >= 0 else -1 for i in keep], best[1], best[2])
