"""Earlier answers as a draft source: the text's last tokens looked up in a sorted n-gram index.

The committed text is searched by scanning it (lookup.py); a corpus of thousands of earlier
answers is too long to scan every round, so it is indexed once: every trigram's key, sorted, with the
position it ends at. A round costs one binary search and a short backwards extension of the hits.
"""

from __future__ import annotations

import numpy as np

from .matches import MAX_MATCH, longer

NGRAM = 3  # a match must be at least this long: shorter ones in a large corpus are mostly chance
BITS = 21  # token ids below 2**21: any vocabulary (the largest are ~260k)
MAX_HITS = 256  # the most recent hits of a common trigram are enough to find the longest match
SEPARATOR = -1  # between answers: no match runs across two


class Corpus:
    def __init__(self, answers: list[np.ndarray]):
        parts = []
        for a in answers:
            parts += [np.asarray(a, dtype=np.int64), np.array([SEPARATOR])]
        t = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        self.tokens = t
        if len(t) < NGRAM:
            self.keys = self.ends = np.empty(0, dtype=np.int64)
            return
        windows = np.lib.stride_tricks.sliding_window_view(t, NGRAM)
        whole = (windows >= 0).all(axis=1)
        keys = _key(windows[whole])
        ends = np.flatnonzero(whole) + NGRAM - 1
        order = np.argsort(keys, kind="stable")  # stable: equal keys stay in text order, the latest last
        self.keys, self.ends = keys[order], ends[order]

    def add(self, answer) -> None:
        """One more answer, the newest: its trigrams merged into the sorted index (a copy of the arrays, not
        a re-sort), so a session that keeps answering (a batch, a server) learns from each at once."""
        a = np.asarray(answer, dtype=np.int64)
        base = len(self.tokens)
        self.tokens = np.concatenate([self.tokens, a, [SEPARATOR]])
        if len(a) < NGRAM or (a < 0).any():
            return
        keys = _key(np.lib.stride_tricks.sliding_window_view(a, NGRAM))
        order = np.argsort(keys, kind="stable")
        keys, ends = keys[order], base + order + NGRAM - 1
        at = np.searchsorted(self.keys, keys, "right")  # after equal keys: the newest stays last
        self.keys, self.ends = np.insert(self.keys, at, keys), np.insert(self.ends, at, ends)

    def __len__(self) -> int:
        return len(self.tokens)

    def match(self, history: np.ndarray, k: int) -> tuple[int, list[int]]:
        """(L, continuation): the longest L >= NGRAM such that history[-L:] occurs in the corpus (the
        latest such occurrence), and up to k tokens that followed it in its answer. (0, []) if none."""
        n = len(history)
        if n < NGRAM or not self.keys.size or k <= 0:
            return 0, []
        key = _key(history[-NGRAM:][None, :])[0]
        lo, hi = np.searchsorted(self.keys, key, "left"), np.searchsorted(self.keys, key, "right")
        if lo == hi:
            return 0, []
        t, ends, length = self.tokens, self.ends[max(lo, hi - MAX_HITS) : hi], NGRAM
        while length < min(MAX_MATCH, n):
            grown = longer(t, ends, length, history)
            if not grown.size:
                break
            ends, length = grown, length + 1
        end = int(ends.max()) + 1
        cont = t[end : end + k]
        stop = np.flatnonzero(cont == SEPARATOR)
        return length, cont[: stop[0] if stop.size else len(cont)].tolist()


def _key(windows: np.ndarray) -> np.ndarray:
    key = np.zeros(len(windows), dtype=np.int64)
    for j in range(NGRAM):
        key = (key << BITS) | windows[:, j]
    return key
