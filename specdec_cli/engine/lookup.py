"""Prompt lookup: draft by copying what followed the longest earlier occurrence of the text's suffix.

No model, no decode: a draft costs a few numpy comparisons. It pays on input-grounded output
(editing code, quoting a passage, filling a template), where the answer repeats the prompt.
"""

from __future__ import annotations

import numpy as np

from .drafters import Draft
from .sampling import Sampler

MAX_MATCH = 64  # longer matches predict no better, and cost more to confirm
MIN_MATCH = 2  # a fixed-k lookup drafts only after this many tokens agree: one token is mostly chance


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


class LookupDrafter:
    """Fixed draft length: whenever at least MIN_MATCH tokens match, propose up to k continuation tokens.
    Lossless like every drafter: the draft is a point mass (q = None) for the acceptance rule."""

    name = "lookup"

    def __init__(self, min_match: int = MIN_MATCH):
        self.min_match = min_match
        self.history = History()

    def continuation(self, committed: list[int], k: int) -> tuple[int, list[int]]:
        """(match length, up to k tokens that followed the match)."""
        h = self.history.sync(committed)
        length, start = longest_match(h)
        return length, h[start : start + k].tolist() if length else []

    def prefill(self, tokens: list[int]) -> None:
        pass

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        length, tokens = self.continuation(committed, k)
        if length < self.min_match:
            return Draft([], None, self.name, k)
        return Draft(tokens, None, self.name, k, match=length)

    def observe(
        self, draft: Draft, accepted: int, token: int, verify_seconds: float, draft_seconds: float, path: list[int]
    ) -> None:
        pass

    def rollback(self, n: int, winner: int = 0) -> None:
        pass  # no cache: the history is the committed text itself

    def check(self, committed: list[int]) -> None:
        pass
