"""Prompt lookup: draft by copying what followed the longest earlier occurrence of the text's suffix,
and keep following that copy through the edits the answer makes to it.

No model, no decode: a draft costs a few numpy comparisons. It pays on input-grounded output
(editing code, quoting a passage, filling a template), where the answer repeats the prompt.

An edited copy is where a plain suffix match loses its way: after `total` became `subtotal`, the
suffix ` subtotal =` occurs nowhere, and the short ` =` that does most recently followed some other
name. So the drafter remembers where in the source the copy was (the anchor) and, once the answer
leaves it, looks for the re-entry just past that point first. The span it skipped and the text the
answer wrote instead are a substitution (` total` -> ` subtotal`), applied to later copies: a rename
is then drafted right, and the draft runs through it instead of stopping at every occurrence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .drafters import Draft, Drafter
from .sampling import Sampler

MAX_MATCH = 64  # longer matches predict no better, and cost more to confirm
MIN_MATCH = 2  # a fixed-k lookup drafts only after this many tokens agree: one token is mostly chance
REENTRY = 16  # after leaving the source, look for the re-entry this many tokens past the point it left
MIN_COPY = 4  # a departure is an edit (worth re-entering, and learning) only after a copy this long
PREFER_LONGER = 4  # a match elsewhere must be this much longer than the followed copy's own to win
MAX_OLD, MAX_NEW = 4, 8  # a substitution replaces at most 4 source tokens (an identifier) with 1..8


def longest_match(history: np.ndarray, max_match: int = MAX_MATCH) -> tuple[int, int]:
    """(L, start): the longest L such that history[-L:] also occurs earlier, and where the
    continuation after its most recent earlier occurrence starts. (0, -1) when the last token is new."""
    n = len(history)
    if n < 2:
        return 0, -1
    # ends[j]: an earlier position whose token equals history[n-1]; extend the match backwards from all at once.
    ends = np.flatnonzero(history[: n - 1] == history[n - 1])
    length = 1
    while ends.size and length < min(max_match, n - 1):
        room = ends[ends >= length]  # matches that reach the start of the text cannot grow
        longer = room[history[room - length] == history[n - 1 - length]]
        if not longer.size:
            break
        ends, length = longer, length + 1
    if not ends.size:
        return 0, -1
    return length, int(ends[-1]) + 1


def match_before(history: np.ndarray, start: int, max_match: int = MAX_MATCH) -> int:
    """How many tokens before `start` equal the text's last ones: the match that a continuation at
    `start` would extend."""
    n, j = len(history), 0
    while j < max_match and j < start and history[start - 1 - j] == history[n - 1 - j]:
        j += 1
    return j


class History:
    """The committed text as a growing numpy array (the engine's list only ever grows between rounds)."""

    def __init__(self) -> None:
        self.tokens = np.empty(1024, dtype=np.int64)
        self.n = 0

    def sync(self, committed: list[int]) -> np.ndarray:
        if len(committed) > self.tokens.size:
            grown = np.empty(2 * len(committed), dtype=np.int64)
            grown[: self.n] = self.tokens[: self.n]
            self.tokens = grown
        self.tokens[self.n : len(committed)] = committed[self.n :]
        self.n = len(committed)
        return self.tokens[: self.n]


@dataclass
class _Copied:
    """A proposed continuation, kept to see how far the answer followed it. Per token: the source
    position of its unit (one source token, or a substituted span), the draft index where that unit
    starts, its substitution's source span (None: a plain copy) and the source position after it
    (None inside a substituted span)."""

    n: int  # text length when proposed
    tokens: list[int]
    unit: list[tuple[int, int, tuple[int, ...] | None]]
    after: list[int | None]


class Copy:
    """Follows one copy of earlier text through the answer: where in the source it is, how long it has
    run, and the substitutions the answer has made to it."""

    def __init__(self) -> None:
        self.anchor: int | None = None  # source position of the answer's next token, while it copies
        self.left: tuple[int, int] | None = None  # (source, text) positions where the answer left the source
        self.run = 0  # tokens copied in this stretch, substitutions included
        self.subs: dict[int, dict[tuple[int, ...], tuple[int, ...]]] = {}  # first old token -> {old: new}
        self.last: _Copied | None = None

    def follow(self, h: np.ndarray) -> None:
        """Compare the tokens committed since the last proposal with it: advance the anchor over those
        the answer copied, and note where it left the source."""
        last, self.last = self.last, None
        if last is None or len(h) == last.n:
            return
        new, n = h[last.n :], len(last.tokens)
        a = 0
        while a < min(len(new), n) and new[a] == last.tokens[a]:
            a += 1
        if a == n and last.after[-1] is not None:  # took the whole proposal: follow the source past it
            p = last.after[-1]
            while a < len(new) and p < last.n + a and h[p] == new[a]:
                a, p = a + 1, p + 1
            if a == len(new):
                self.anchor, self.run = p, self.run + a
            else:
                self.anchor = None
                self._leave(p, last.n + a, a)
            return
        if a == len(new) and last.after[a - 1] is not None:  # still copying
            self.anchor, self.run = last.after[a - 1], self.run + a
            return
        source, first, old = last.unit[min(a, n - 1)]
        if a < n and old is not None and first == a:
            self._forget(old)  # the answer did not make this substitution here: stop assuming it
        self.anchor = None
        # A proposal the answer did not take at all (a chance match, often the new name's mention in the
        # prompt) leaves the point where the answer left its copy as it was.
        if first or self.left is None:
            self._leave(source, last.n + first, first)

    def _leave(self, source: int, text: int, copied: int) -> None:
        """The answer left the source at these positions, after `copied` more tokens of it. Only a copy
        of some length is worth finding again: a few tokens in common are mostly chance."""
        self.run += copied
        if self.run >= MIN_COPY:
            self.left = (source, text)
        else:
            self.left, self.run = None, 0

    def match(self, h: np.ndarray) -> tuple[int, int]:
        """(length, start) of the continuation to propose: the copy's own, unless a match elsewhere is
        clearly longer. The length counts the whole copied stretch: it predicts how reliable the copy is."""
        length, start = longest_match(h)
        mine, at = 0, -1
        if self.anchor is not None:  # (after a substitution no source token precedes the anchor's match)
            mine, at = max(match_before(h, self.anchor), 1), self.anchor
        elif self.left is not None:
            mine, at = self._reenter(h)
        if mine and (mine + PREFER_LONGER >= length or at == start):
            if self.anchor is None:
                self.left = None  # back in the copy
            return max(mine, min(self.run, MAX_MATCH)), at
        if length:
            self.run = length  # a new copy starts here
        return length, start

    def _reenter(self, h: np.ndarray) -> tuple[int, int]:
        """The longest match ending just past where the answer left the source. When both the source
        span it skipped and what the answer wrote instead are short, that was an edit: the copy goes on
        (and learns the substitution). Else the copy starts over here."""
        source, text = self.left
        n = len(h)
        if n - text > MAX_MATCH:
            self.left = None  # the answer has moved on
            return 0, -1
        best, at = 0, -1
        for c in range(source + 1, min(source + REENTRY, n - 1) + 1):
            j = match_before(h, c)
            if j > best:
                best, at = j, c
        if best:
            old, new = tuple(h[source : at - best].tolist()), tuple(h[text : n - best].tolist())
            edit = len(old) <= MAX_OLD and len(new) <= MAX_NEW
            self.run = self.run + best if edit else best
            if edit and old and new and old != new:
                self.subs.setdefault(old[0], {})[old] = new
        return best, at

    def _forget(self, old: tuple[int, ...]) -> None:
        self.subs.get(old[0], {}).pop(old, None)

    def propose(self, h: np.ndarray, start: int, k: int) -> list[int]:
        """Up to k tokens copied from `start`, substitutions applied; remembered for `follow`."""
        n = len(h)
        tokens, unit, after = [], [], []
        p = start
        while len(tokens) < k and p < n:
            subs = self.subs.get(int(h[p]), {})
            old = next((o for o in subs if tuple(h[p : p + len(o)].tolist()) == o), None)
            new = subs[old] if old else (int(h[p]),)
            first = len(tokens)
            for i, t in enumerate(new):
                tokens.append(t)
                unit.append((p, first, old))
                after.append(p + (len(old) if old else 1) if i == len(new) - 1 else None)
            p += len(old) if old else 1
        self.anchor = start
        self.last = _Copied(n, tokens[:k], unit[:k], after[:k]) if tokens else None
        return tokens[:k]


class LookupDrafter(Drafter):
    """Fixed draft length: whenever at least MIN_MATCH tokens match, propose up to k continuation tokens.
    Lossless like every drafter: the draft is a point mass (q = None) for the acceptance rule. No cache:
    the history is the committed text itself, so nothing to prefill, roll back or check."""

    name = "lookup"

    def __init__(self, min_match: int = MIN_MATCH):
        self.min_match = min_match
        self.history = History()
        self.copy = Copy()

    def continuation(self, committed: list[int], k: int) -> tuple[int, list[int]]:
        """(match length, up to k tokens that followed the match)."""
        h = self.history.sync(committed)
        self.copy.follow(h)
        length, start = self.copy.match(h)
        if not length:
            return 0, []
        return length, self.copy.propose(h, start, k)

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        length, tokens = self.continuation(committed, k)
        if length < self.min_match:
            return Draft([], None, source=self.name, k=k)
        return Draft(tokens, None, source=self.name, k=k, match=length)
