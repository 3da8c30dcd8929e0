"""Drafts that read the target's hidden states (EAGLE-3: eagle3.py; DFlash: dflash.py), and what they share: the
draft's cells and the target's rows it has yet to be fed (`FeatureCache`), and the drafter's part (`HiddenDrafter`).

The target's every decode hands its rows' layer inputs over (backend/hidden.LayerTap). A row is the draft's to feed
once the text it stands for is committed: the prompt's at once, a verify batch's where its tokens were accepted (the
winning branch, below the committed length). Committed rows wait, by position, until the next draft feeds them, or
until FLUSH of them wait (a long stretch of plain rounds): the draft's cache then holds the whole text, as llama.cpp's
loop keeps it, fed in batches, never a rejected row. What the cells hold lasts between runs (a session's), as the
target's cache does: a new prompt keeps the cells of the text it shares with the old one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..backend.hidden import DraftSeqs, TapSeqs
from ..engine.constraint import Follow, State, best_allowed
from ..engine.drafter import Draft, Drafter
from ..engine.kv import KVInvariantError
from ..engine.sampling import NonFiniteLogits, Sampler, draw, softmax_summary
from .tree import FIXED, DraftPolicy

FEED_BATCH = 32  # rows of the long feed time_one times (as measure.py's PREFILL_BATCH for a draft model)
TIMING_PASSES = 5  # time_one: the fastest of these (the OS slows a decode, never speeds one up)
FLUSH = 256  # committed rows kept unfed at most: features are wide (3 x 4,096 floats a row for an 8B EAGLE-3)
RECENT = 64  # fed rows kept: a next prompt that parts from the text near its end refeeds the last shared ones
WINDOW = 1024  # rows kept unfed, the last ones, until auto first drafts with it (then fed: its catch-up)


def pick(row: np.ndarray, state: State | None, sampler: Sampler, rng, p_min: float):
    """One draft token from a row of draft logits: (token, q row or None, its probability, the row's entropy), or
    None where the row's best is below `p_min` (llama.cpp's rule: the most likely token, not the drawn one).
    Greedy: the best the grammar allows (no distribution kept); sampling: a draw from the processed distribution,
    which the acceptance rule needs as q."""
    if not np.isfinite(row.max()):
        raise NonFiniteLogits("logits hold NaN or infinity")
    if sampler.greedy:  # no distribution to keep: one exp pass gives what it reads
        top, total, nats = softmax_summary(row)
        if 1.0 / total < p_min:
            return None
        d = int(row.argmax()) if state is None else best_allowed(row, state)
        return d, None, float(np.exp(row[d] - top)) / total, nats
    dist, nats = sampler.probs_entropy(row if state is None else state.mask(row))
    if dist.max() < p_min:
        return None
    d = draw(dist, rng)
    return d, dist, float(dist[d]), nats


@dataclass
class Picks:
    """A round's draft tokens so far, with what the acceptance rule (q, where sampled) and auto (each one's
    probability, its row's entropy) read of them."""

    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)

    def add(self, got: tuple) -> int:
        """`pick`'s (token, q row or None, probability, entropy); returns the token."""
        d, dist, p, nats = got
        self.tokens.append(d)
        self.confidence.append(p)
        self.entropies.append(nats)
        if dist is not None:
            self.q.append(dist)
        return d


def _fastest(run, ctx: DraftSeqs) -> float:
    best = float("inf")
    for _ in range(TIMING_PASSES):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
        ctx.forget(-1)
    return best


class FeatureCache:
    """A draft's cells (positions start..end-1) and the committed target rows not yet fed (`rows`: position ->
    features). `text`: the committed tokens as far as known (the cells were computed from its first end + SHIFT).
    Subclasses feed (`_feed`) as their architecture does."""

    SHIFT = 0  # EAGLE-3: 1 (the cell at p holds the token at p + 1 with the features of p)

    def __init__(self, ctx: DraftSeqs, tap: TapSeqs):
        self.ctx, self.tap = ctx, tap
        self.start = self.end = 0
        self.text: list[int] = []
        self.rows: dict[int, np.ndarray] = {}
        self._recent: dict[int, np.ndarray] = {}  # the last RECENT rows fed
        self._raw: list[tuple] = []  # the target's batches since the last settle: (tokens, pos, seqs, rows)
        self._prompt = False
        # Lazy (auto's, until it first drafts with it): rows are not fed but kept, the last WINDOW of them, so that a
        # run it never drafts in costs nothing but reading them; its first draft feeds them (a catch-up auto prices).
        self.lazy = False

    # --- the target's side ---------------------------------------------------------------------------------
    def attach(self) -> None:
        self.tap.attach(self._taken, self._drain)

    def detach(self) -> None:
        self.tap.detach()

    def _taken(self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], rows: np.ndarray) -> None:
        """A target decode's rows of this slot (on the decoding thread: kept, fed from `_drain`)."""
        if self._prompt:  # the prompt's: committed as they come, fed in batches (a long prompt's features are large)
            self.rows.update(zip(pos, rows))
        else:
            self._raw.append((tokens, pos, seqs, rows))

    def _drain(self) -> None:
        """After each target decode, on the run's thread: a prompt's rows fed FLUSH at a time (or kept, lazily)."""
        if self._prompt:
            self._bound()

    def _bound(self) -> None:
        """Rows waiting: fed, FLUSH at a time; lazy, the last WINDOW kept."""
        if self.lazy and len(self.rows) > WINDOW:
            last = max(self.rows)
            self.rows = {p: row for p, row in self.rows.items() if p > last - WINDOW}
        elif not self.lazy and len(self.rows) >= FLUSH:
            self.feed(len(self.text))

    def begin(self, tokens: list[int]) -> int:
        """A run's prompt but its last token, before the target decodes what it lacks of it: the cells of the text
        it shares with the last run's stay. Returns the first position whose row it lacks (the target's rows from
        there on feed it: where the target holds more of the text, it may decode those again)."""
        shared = next(
            (i for i, (a, b) in enumerate(zip(self.text, tokens)) if a != b), min(len(self.text), len(tokens))
        )
        keep = min(self.end, shared - self.SHIFT)
        if keep <= self.start:
            self.restart(0)
        else:
            self.ctx.forget(keep)
            self.end = keep
        # The rows of the shared text stay good (a row's features depend on the text up to it): those the cells
        # dropped (EAGLE-3's last pair, whose next token changed) are fed again from the recent ones.
        rows = {**self._recent, **self.rows}
        self.rows = {p: row for p, row in rows.items() if self.end <= p < shared}
        self._recent = {p: row for p, row in self._recent.items() if p < min(shared, self.end)}
        self.text = list(tokens)
        self._raw.clear()
        self._prompt = True
        need = self.end
        while need in self.rows:
            need += 1
        return need

    def prefill(self) -> None:
        """The prompt is decoded: feed what of it can be fed (lazy: keep its last rows)."""
        self._prompt = False
        if self.lazy:
            self._bound()
        else:
            self.feed(len(self.text))

    def settle(self, n: int, winner: int = 0) -> None:
        """The target's rows since the last call: those below position n of the winning branch are committed (a
        batch in the main sequence alone, a chain: every row below n); the others go. Too many waiting: fed."""
        for tokens, pos, seqs, rows in self._raw:
            chain = all(s == (0,) for s in seqs)
            for t, p, s, row in zip(tokens, pos, seqs, rows):
                if p < n and (chain or winner in s):
                    if p == len(self.text):  # the committed text as far as the target decoded it
                        self.text.append(t)
                    if p >= self.end:
                        self.rows[p] = row
        self._raw.clear()
        self._bound()

    # --- the draft's side ----------------------------------------------------------------------------------
    def restart(self, start: int) -> None:
        """Empty the cells; the next one fed is position `start`'s."""
        self.ctx.forget(-1)
        self.start = self.end = start
        self._recent.clear()

    def sync(self, committed: list[int]) -> None:
        """The committed text (a round's): the tokens the cells are fed with (it only grows within a run)."""
        self.text.extend(committed[len(self.text) :])

    def feed(self, limit: int, outputs: str = "none") -> int:
        """Feed the committed rows from `end` on, up to position `limit` (exclusive) and as far as they run without a
        gap (where the rows begin past `end`, the cells start afresh there: the target reused what the draft never
        saw); `outputs` "last": the last row's output (EAGLE-3's first draft token). Returns how many were fed."""
        for p in [p for p in self.rows if p < self.end]:
            del self.rows[p]
        if not self.rows:
            return 0
        if self.end not in self.rows:  # a gap: start again at the newest unbroken stretch
            first = max(p for p in self.rows if p - 1 not in self.rows)
            for p in [p for p in self.rows if p < first]:
                del self.rows[p]
            self.restart(first)
        n = 0
        while self.end + n < limit and self.end + n in self.rows:
            n += 1
        n = self._feedable(n)
        if n:
            fed = {p: self.rows.pop(p) for p in range(self.end, self.end + n)}
            self._feed(self.end, np.stack(list(fed.values())), outputs)
            self.end += n
            self.recent(fed)
        return n

    def recent(self, fed: dict[int, np.ndarray]) -> None:
        """Keep the last RECENT rows fed (a next prompt may part from the text just after them)."""
        self._recent.update(fed)
        for p in [p for p in self._recent if p < self.end - RECENT]:
            del self._recent[p]

    def _feedable(self, n: int) -> int:
        """Of n rows from `end`, how many can be fed now (EAGLE-3: those whose next token is known)."""
        return n

    def _feed(self, pos0: int, features: np.ndarray, outputs: str) -> None:
        raise NotImplementedError

    def lag(self, committed: list[int]) -> int:
        """Rows the next draft feeds before it drafts (EAGLE-3: with the one it drafts from): from `end`, or where
        the rows waiting begin past a gap (kept lazily: the last WINDOW)."""
        first = self.end if self.end in self.rows or not self.rows else min(self.rows)
        return max(len(committed) - 1 - first, 0)

    def check(self, committed: list[int]) -> None:
        """Debug: the cells hold positions start..end-1, computed from the committed text."""
        name = f"{self.ctx.file.label} draft"
        want = (self.start, self.end - 1) if self.end > self.start else (-1, -1)
        if self.ctx.pos_range() != want:
            raise KVInvariantError(f"{name} holds positions {self.ctx.pos_range()}, expected {want}")
        upto = self.end + self.SHIFT if self.end > self.start else 0
        if self.text[:upto] != committed[:upto] or upto > len(committed):
            raise KVInvariantError(f"{name}'s cells were computed from another text than the committed one")


class HiddenDrafter(Drafter):
    """What EAGLE-3 and DFlash drafters share: the cache they feed (`cache`, held between runs), the grammar they
    follow, p_min (the draft's probability of its best token: stop below it), and auto's view of a model source
    (`lag`, `opened`, `window`, `failed`, `time_one`). Subclasses draft (`_draft`)."""

    window = None  # its cells hold the whole text (nothing to choose)
    opened = True  # its context opened with the session's first run that drafts with it
    follows_target = True  # its cells mirror the target's committed text: a rollback follows the target's winner
    per_round = False  # DFlash: one decode drafts the whole block (auto prices a round, not a token)

    def __init__(
        self,
        cache: FeatureCache,
        p_min=0.0,
        vocab=None,
        grammar: State | None = None,
        is_eog=lambda t: False,
        lazy: bool = False,
    ):
        """lazy: auto's model source, fed from its first draft on (FeatureCache.lazy)."""
        self.cache, self.p_min, self.is_eog, self.lazy = cache, p_min, is_eog, lazy
        self.vocab = vocab or cache.ctx.n_vocab
        self.follow = Follow(grammar) if grammar is not None else None
        self.failed = False
        self._notice: str | None = None
        cache.attach()  # the target's next decodes (the prompt's) hand their rows over

    def loaded(self) -> bool:
        return True

    def take_notice(self) -> str | None:
        notice, self._notice = self._notice, None
        return notice

    def begin(self, tokens: list[int]) -> int | None:
        self.cache.lazy = self.lazy
        need = self.cache.begin(tokens)
        return None if self.lazy else need  # (lazily, a window of what the target decodes will do)

    def prefill(self, tokens: list[int]) -> None:
        self.cache.prefill()
        if self.follow is not None:
            self.follow.prefill(tokens)

    def lag(self, committed: list[int], k: int = 1, size=None) -> int:
        return self.cache.lag(committed)

    def feed_seconds(self, costs, gap: int) -> float:
        """What feeding `gap` committed rows costs beyond the draft decode (auto's catch-up): its own figures (a
        row's feed is not a decode of its: time_one), the draft model's rule where it has none."""
        if gap <= 1 or costs.draft_catch_up is None or costs.draft_prefill is None or costs.draft is None:
            return costs.catch_up(gap)
        return costs.draft_catch_up - costs.draft + (gap - 2) * costs.draft_prefill

    def propose(self, committed, k, sampler, rng, policy: DraftPolicy = FIXED) -> Draft:
        if self.failed or k <= 0:
            return Draft([], None, source=self.name, k=k, notice=self.take_notice())
        self.cache.sync(committed)
        self.cache.lazy = self.lazy = False  # drafting now: the rows waiting are fed, and from now on as they come
        try:
            return self._draft(committed, k, sampler, rng, policy)
        except NonFiniteLogits as e:
            self.failed = True
            self._notice = (
                f"the {self.cache.ctx.file.label} draft produced non-finite logits ({e}): it no longer drafts; the "
                "output is unaffected"
            )
            return Draft([], None, source=self.name, k=k, notice=self.take_notice())
        finally:
            self.cache.ctx.forget(len(committed) - 1)  # the round's own cells go: the committed text's stay

    def _drafted(self, picks: Picks, k: int, decodes: int, fed: int, seconds: float | None) -> Draft:
        """The round's Draft: `decodes` draft decodes spent, `fed` rows fed first, `seconds` per decode of those
        that drafted alone (None: none did; auto learns a decode's cost from them)."""
        return Draft(
            picks.tokens,
            np.stack(picks.q) if picks.q else None,
            source=self.name,
            k=k,
            confidence=tuple(picks.confidence),
            entropy=sum(picks.entropies) / len(picks.entropies) if picks.entropies else None,
            decodes=decodes if picks.tokens else 0,
            fed=fed,
            decode_seconds=seconds,
        )

    def _draft(self, committed, k, sampler, rng, policy) -> Draft:
        raise NotImplementedError

    def _state(self, committed: list[int]) -> State | None:
        return self.follow.at(committed) if self.follow is not None else None

    def _row(self, logits: np.ndarray, state, sampler, rng):
        return pick(logits[: self.vocab], state, sampler, rng, self.p_min)

    def rollback(self, n: int, draft: Draft | None = None, winner: int = 0) -> None:
        self.cache.settle(n, winner)

    def check(self, committed: list[int]) -> None:
        self.cache.check(committed)

    def time_one(self) -> tuple[float, float, float]:
        """Auto's figures of it until it observes its own (Costs.use_draft): seconds a draft decode takes (an EAGLE-3
        step; DFlash: its block), a decode that also feeds one committed row (a round's catch-up after one token), and a
        row of a long feed (FEED_BATCH of them); the fastest of a few, on an empty cache (the cells start afresh)."""
        ctx, cache = self.cache.ctx, self.cache
        rows = np.zeros((FEED_BATCH, len(cache.tap.layers) * cache.tap.n_embd), np.float32)
        cache.restart(0)
        cache.text = [0] * (FEED_BATCH + 1)
        try:
            with ctx.alone():
                draft = _fastest(lambda: self._decode_once(), ctx)
                one = _fastest(lambda: cache._feed(0, rows[:1], "none"), ctx)
                many = _fastest(lambda: cache._feed(0, rows, "none"), ctx)
        finally:
            cache.restart(0)
            cache.text = []
        return draft, draft + one, many / FEED_BATCH

    def _decode_once(self) -> None:
        """One draft decode as a round makes it, on an empty cache."""
        raise NotImplementedError
