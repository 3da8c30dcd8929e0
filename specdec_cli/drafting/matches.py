"""Suffix matches over the text's token ids, in numpy: where the text's last tokens occurred earlier in it,
and how far a match reaches. Lookup (lookup.py) and earlier answers (corpus.py) draft from these."""

from __future__ import annotations

import numpy as np

MAX_MATCH = 64  # longer matches predict no better, and cost more to confirm


def occurrences(history: np.ndarray, max_match: int = MAX_MATCH, limit: int = 1) -> list[tuple[int, int]]:
    """Up to `limit` earlier occurrences of the text's suffix as (L, start): L how long the suffix matches
    there, start where the continuation begins. The first is the longest match (its most recent
    occurrence); the rest, by match length then recency, each continue with a token none before did:
    where one earlier occurrence is ambiguous, the others are the alternatives. [] when the last token is new."""
    n = len(history)
    if n < 2:
        return []
    # ends: earlier positions whose token equals history[n-1]; extend the match backwards from all at once.
    ends = np.flatnonzero(history[: n - 1] == history[n - 1])
    levels = [ends] if ends.size else []
    length = 1
    while ends.size and length < min(max_match, n - 1):
        grown = longer(history, ends, length, history)
        if not grown.size:
            break
        ends, length = grown, length + 1
        levels.append(ends)
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    for depth in range(len(levels) - 1, -1, -1):
        for end in levels[depth][::-1]:  # the most recent first
            nxt = int(history[end + 1])
            if nxt not in seen:
                seen.add(nxt)
                out.append((depth + 1, int(end) + 1))
                if len(out) == limit:
                    return out
        if limit == 1:
            break
    return out


def longer(text: np.ndarray, ends: np.ndarray, length: int, history: np.ndarray) -> np.ndarray:
    """Of the places in `text` ending at `ends` where history's last `length` tokens occur, those where its
    last length + 1 do (a match that reaches the start of the text cannot grow)."""
    room = ends[ends >= length]
    return room[text[room - length] == history[len(history) - 1 - length]]


def longest_match(history: np.ndarray, max_match: int = MAX_MATCH) -> tuple[int, int]:
    """(L, start): the longest L such that history[-L:] also occurs earlier, and where the
    continuation after its most recent earlier occurrence starts. (0, -1) when the last token is new."""
    found = occurrences(history, max_match)
    return found[0] if found else (0, -1)


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
