"""The predicted answer (OpenAI's `prediction`: the file an edit rewrites) as lookup's first source.

The prediction is aligned to the answer as the answer proceeds: a cursor points at the prediction's token the
answer should write next and advances over each token it does write. Where the answer writes another (an
edit), the cursor is lost, and found again where the answer's last tokens occur in the prediction: first just
past the point it left (an edited line rejoins the original a few tokens on), else wherever they match longest.
Once the answer ends a line away from the prediction, the line it left (lines were inserted before it) or the
next one (it rewrote this one) is where it likely goes on. The prompt may hold the same text: lookup's copy
finds that too, but the prediction comes with the user's word that the answer repeats it, from its first token.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .lookup import MAX_LINE, MAX_MATCH, MAX_NEW, MAX_OLD, PREFER_LONGER, REENTRY

LINE_WINS = 6  # at a line's end, a match elsewhere at least this long beats the line rule (a line is ~8 tokens)
FAR_MATCH = 4  # away from where the answer left, a match this long at least: the prose around the code shares
# two-token phrases with it by chance


class Prediction:
    """A cursor into the predicted tokens, kept in step with the committed text by `follow`."""

    def __init__(self, tokens: Sequence[int], newline: Callable[[int], bool] | None = None):
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.newline = newline
        # The substitutions the answer makes (first old token -> {old: new}), applied where the prediction is
        # drafted: a rename is then drafted right. LookupDrafter shares its copy's, so each learns from both.
        self.subs: dict[int, dict[tuple[int, ...], tuple[int, ...]]] = {}
        self.cursor: int | None = 0  # the prediction's position of the answer's next token, while aligned
        self.inside = 0  # of a substitution at the cursor, the tokens the answer has written already
        self.left: int | None = None  # where in the prediction the answer last left it
        self.left_at = 0  # and where in the text
        self.matched = 0  # the match that (re)anchored the cursor (and the stretch an edit interrupted)
        self.run = 0  # tokens the answer has followed since
        self.stretch = 0  # matched + run when the answer last left the prediction
        self.seen: int | None = None  # the committed text's length at the last `follow` (None: before the answer)

    def follow(self, h: np.ndarray) -> None:
        """Advance the cursor over the tokens committed since the last call; where the answer wrote another
        token than the prediction's, note where it left and lose the cursor."""
        if self.seen is None:  # the first round: the answer begins where the prediction does
            self.seen = len(h)
            return
        new, self.seen = h[self.seen :].tolist(), len(h)
        if self.cursor is None or not new:
            return
        units = self._units(self.cursor, self.inside + len(new))[self.inside :]
        same = 0
        while same < min(len(units), len(new)) and units[same][0] == new[same]:
            same += 1
        if same == len(new):
            _, start, end, _, i, last = units[same - 1]
            self.cursor, self.inside = (end, 0) if last else (start, i + 1)
            self.run += same
            return
        if same < len(units):
            _, start, _, old, i, _ = units[same]
        else:  # past the prediction's end
            start, old, i = len(self.tokens), None, 0
        if old is not None and i == 0:  # the answer did not make this substitution here: stop assuming it
            self.subs.get(old[0], {}).pop(old, None)
        # A re-anchoring the answer did not take at all (a chance match) leaves the point it left as it was.
        if same or self.run or self.left is None:
            self.left, self.left_at = start, self.seen - len(new) + same - i
            self.stretch = self.matched + self.run + same
        self.cursor, self.inside, self.matched, self.run = None, 0, 0, 0

    def _units(self, start: int, n: int) -> list[tuple[int, int, int, tuple[int, ...] | None, int, bool]]:
        """Up to n tokens of the prediction from `start` as the answer would write them, its substitutions made:
        per token (token, where its unit of the prediction starts and ends, the substitution's old tokens or
        None, its index in the unit's new tokens, whether it is the unit's last)."""
        out, p, tokens = [], start, self.tokens
        while len(out) < n and p < len(tokens):
            t = int(tokens[p])
            old = next((o for o in self.subs.get(t, ()) if tuple(tokens[p : p + len(o)].tolist()) == o), None)
            new, end = (self.subs[t][old], p + len(old)) if old else ((t,), p + 1)
            out += [(x, p, end, old, i, i == len(new) - 1) for i, x in enumerate(new)]
            p = end
        return out[:n]

    def continuation(self, h: np.ndarray, k: int) -> tuple[int, list[int]]:
        """(match, up to k predicted tokens to follow `h`): `match`, the aligned stretch it continues, predicts
        how reliable it is; (0, []) where the answer has left the prediction and not found it again."""
        self.follow(h)
        if self.cursor is None:
            self._rejoin(h)
        if self.cursor is None or k <= 0:
            return 0, []
        tokens = [u[0] for u in self._units(self.cursor, self.inside + k)[self.inside :]]
        return max(self.matched + self.run, 1), tokens

    def _rejoin(self, h: np.ndarray) -> None:
        """Anchor the cursor again: at the best match of the text's suffix, where one is found; at a line's end
        on the line rule's line, unless a match is clearly longer. Just past where the answer left, soon after it
        left, that was an edit: the stretch it interrupted counts on (a rename leaves the copy as reliable as it
        was), and a short one is a substitution to make again."""
        length, start, near = self._match(h)
        line = self._line(h)
        by_line = line is not None and length < LINE_WINS
        if by_line:
            length, start, near = 1, line, True
        edit = near and len(h) - self.left_at <= MAX_MATCH  # (past that, the answer wrote text of its own)
        if edit and not by_line:
            old = tuple(self.tokens[self.left : start - length].tolist())
            new = tuple(h[self.left_at : len(h) - length].tolist())
            if 0 < len(old) <= MAX_OLD and 0 < len(new) <= MAX_NEW and old != new:
                self.subs.setdefault(old[0], {})[old] = new
        if length:
            self.cursor, self.inside, self.run = start, 0, 0
            self.matched = min(length + self.stretch, MAX_MATCH) if edit else length

    def _match(self, h: np.ndarray) -> tuple[int, int, bool]:
        """(length, start, near) of the best earlier occurrence of the text's suffix in the prediction: just past
        where the answer left (within REENTRY) one matching token will do, and it wins unless another is
        PREFER_LONGER longer; elsewhere FAR_MATCH at least, the longest, then the nearest past where it left."""
        p, n = self.tokens, len(h)
        ends = np.flatnonzero(p[:-1] == h[-1])  # (the prediction's last token continues into nothing)
        if not ends.size or not n:
            return 0, -1, False
        lengths = np.ones(ends.size, dtype=np.int64)
        alive = np.arange(ends.size)
        for j in range(1, min(MAX_MATCH, n)):
            at = ends[alive] - j
            alive = alive[(at >= 0) & (p[np.maximum(at, 0)] == h[n - 1 - j])]
            if not alive.size:
                break
            lengths[alive] += 1
        starts, left = ends + 1, self.left or 0
        near = (starts >= left) & (starts <= left + REENTRY)
        score = np.where(near, lengths + PREFER_LONGER, np.where(lengths >= FAR_MATCH, lengths, 0))
        # the best score; among equals ahead of where it left before behind it, then the nearest
        best = np.lexsort((np.abs(starts - left), starts < left, -score))[0]
        return (int(lengths[best]), int(starts[best]), bool(near[best])) if score[best] else (0, -1, False)

    def _line(self, h: np.ndarray) -> int | None:
        """Once the answer ends a line away from the prediction: the line where it left, if it left at a line's
        start (it inserted lines), else the next one (it rewrote this one). None elsewhere."""
        if self.newline is None or self.left is None or not len(h) or not self.newline(int(h[-1])):
            return None
        p, left = self.tokens, self.left
        if left == 0 or (left < len(p) and self.newline(int(p[left - 1]))):
            return left if left < len(p) else None
        for q in range(left, min(left + MAX_LINE, len(p) - 1)):
            if self.newline(int(p[q])):
                return q + 1
        return None
