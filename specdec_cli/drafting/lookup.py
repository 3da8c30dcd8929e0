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

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..engine.drafter import Draft, Drafter
from ..engine.sampling import Sampler
from .hints import hints_in, renames_in
from .matches import MAX_MATCH, History, longest_match, match_before, occurrences

MIN_MATCH = 2  # a fixed-k lookup drafts only after this many tokens agree: one token is mostly chance
REENTRY = 16  # after leaving the source, look for the re-entry this many tokens past the point it left
MIN_COPY = 4  # a departure is an edit (worth re-entering, and learning) only after a copy this long
PREFER_LONGER = 4  # a match elsewhere must be this much longer than the followed copy's own to win
MAX_OLD, MAX_NEW = 4, 8  # a substitution replaces at most 4 source tokens (an identifier) with 1..8
MAX_ALTERNATIVES = 3  # other earlier occurrences offered beside the copy: a draft tree may carry them
MAX_LINE = 256  # an edited line's end is looked for this far into the source


def line_ends(piece: Callable[[int], bytes]) -> Callable[[int], bool]:
    """Whether a token of this vocabulary (`piece`: its bytes) ends a line."""
    return lambda token: b"\n" in piece(token)


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

    def match(self, h: np.ndarray, longest: tuple[int, int] | None = None) -> tuple[int, int]:
        """(length, start) of the continuation to propose: the copy's own, unless a match elsewhere is
        clearly longer (`longest`, the text's longest match, if already found). The length counts the
        whole copied stretch: it predicts how reliable the copy is."""
        length, start = longest if longest is not None else longest_match(h)
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


@dataclass(frozen=True, slots=True)
class Candidate:
    """One continuation lookup could draft. source: "copy" (the copy it follows, or the longest match;
    "line-copy" when that match covers the start of the answer's current line),
    "other" (another earlier occurrence that continues differently), "line" (after the answer ended a
    line it rewrote, the source's next line), "cache" (an earlier answer of this model, drafting/corpus.py).
    hot: the index of its first token at a likely edit point (a name the instruction mentions, or the
    context where the answer edited before), where it is likelier to be wrong; None if it passes none.
    at: per token, the bucket its chance is learned in (None: match + i, the match it would extend); a
    grammar's continuation (drafting/forced.py) says how sure each token is instead."""

    tokens: list[int]
    source: str
    match: int
    hot: int | None = None
    at: tuple[int, ...] | None = None

    def bucket(self, i: int) -> int:
        return self.match + i if self.at is None else self.at[i]


class LookupDrafter(Drafter):
    """Fixed draft length: whenever at least MIN_MATCH tokens match, propose up to k continuation tokens.
    Lossless like every drafter: the draft is a point mass (q = None) for the acceptance rule. No cache:
    the history is the committed text itself, so nothing to prefill, roll back or check.

    For auto (`candidates`) it offers every continuation worth a node in a draft tree, each with what
    predicts its acceptance. Signals, all free: `hints`, token sequences the instruction names (an
    identifier to change is where the answer leaves its source); where the answer left the source before
    (the two tokens before each departure); line structure (`newline(t)`: does token t end a line?);
    other earlier occurrences; and `corpus`, earlier answers of the same model."""

    name = "lookup"

    def __init__(
        self,
        min_match: int = MIN_MATCH,
        corpus=None,
        hints: tuple[tuple[int, ...], ...] = (),
        newline: Callable[[int], bool] | None = None,
        renames: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (),
        prediction=None,
    ):
        self.min_match = min_match
        self.history = History()
        self.copy = Copy()
        self.prediction = prediction  # a prediction.Prediction, the predicted answer: drafted from first
        if prediction is not None:
            prediction.subs = self.copy.subs  # one set of the answer's substitutions, learned from either
        for old, new in renames:  # "rename X to Y": the substitution the answer will make, known before it does
            if old and new and old != new:
                self.copy.subs.setdefault(old[0], {})[old] = new
        self.corpus = corpus
        self.hints = {hint[0]: [] for hint in hints if hint}
        for hint in hints:
            if hint:
                self.hints[hint[0]].append(hint)
        self.newline = newline
        self.departures: set[tuple[int, int]] = set()  # (two source tokens) the answer left the source after

    @classmethod
    def for_instruction(
        cls,
        instruction: str,
        corpus,
        tokenize: Callable[[str], list[int]],
        piece: Callable[[int], bytes],
        prediction=None,
    ) -> LookupDrafter:
        """Lookup with all it knows of a run: the names the user's instruction mentions (where the answer
        edits) and the renames it asks for, as tokens with and without a leading space; earlier answers
        (`corpus`); the target's vocabulary (`piece`: which tokens end a line); the predicted answer."""
        hints = tuple(tuple(tokenize(space + name)) for name in hints_in(instruction) for space in ("", " "))
        renames = tuple(
            (tuple(tokenize(space + old)), tuple(tokenize(space + new)))
            for old, new in renames_in(instruction)
            for space in ("", " ")
        )
        return cls(corpus=corpus, hints=hints, newline=line_ends(piece), renames=renames, prediction=prediction)

    def continuation(self, committed: list[int], k: int) -> tuple[int, list[int]]:
        """(match length, up to k tokens that followed the match)."""
        h = self.history.sync(committed)
        self.copy.follow(h)
        length, start = self.copy.match(h)
        if not length:
            return 0, []
        return length, self.copy.propose(h, start, k)

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        length, tokens = self.continuation(committed, k)  # (the copy follows the text, drafted or not)
        if self.prediction is not None:  # first, with no match needed: the user's word is that the answer repeats it
            match, predicted = self.prediction.continuation(self.history.sync(committed), k)
            if predicted:
                mine = tuple(range(len(predicted)))
                return Draft(predicted, None, source=self.name, k=k, match=match, from_prediction=mine)
        if length < self.min_match:
            return Draft([], None, source=self.name, k=k)
        return Draft(tokens, None, source=self.name, k=k, match=length)

    def candidates(self, committed: list[int], k: int) -> list[Candidate]:
        """Every continuation worth drafting after `committed`, up to k tokens each, the prediction's and the copy first."""
        h = self.history.sync(committed)
        self.copy.follow(h)
        left = self.copy.left
        if left is not None and left[0] >= 2:
            self.departures.add((int(h[left[0] - 2]), int(h[left[0] - 1])))
        # The predicted answer first: the user's word is that the answer repeats it.
        length, tokens = self.prediction.continuation(h, k) if self.prediction is not None else (0, [])
        out = [Candidate(tokens, "prediction", length)] if tokens else []
        found = occurrences(h, limit=MAX_ALTERNATIVES + 1)  # one scan of the text for the copy and the others
        length, start = self.copy.match(h, found[0] if found else (0, -1))
        if length:
            # A copy whose match reaches back over the start of the answer's line copies whole lines: in code
            # that is what the answer does next far more often than a match inside a line of prose.
            aligned = self.newline is not None and any(self.newline(int(t)) for t in h[max(len(h) - length, 0) :])
            out.append(Candidate(self.copy.propose(h, start, k), "line-copy" if aligned else "copy", length))
        firsts = {c.tokens[0] for c in out if c.tokens}
        for length, begin in found:
            if begin != start and int(h[begin]) not in firsts and length >= MIN_MATCH:
                firsts.add(int(h[begin]))
                out.append(Candidate(h[begin : begin + k].tolist(), "other", length))
        for begin in self._line_starts(h, left):
            if int(h[begin]) not in firsts:
                firsts.add(int(h[begin]))
                out.append(Candidate(h[begin : begin + k].tolist(), "line", 1))
        if self.corpus is not None:
            length, cont = self.corpus.match(h, k)
            if cont:
                out.append(Candidate(cont, "cache", length))
        hot = [(c, self._hot(h, c.tokens)) for c in out if c.tokens]
        return [c if at is None else replace(c, hot=at) for c, at in hot]  # (a replace per round adds up: ~3 us each)

    def _line_starts(self, h: np.ndarray, left: tuple[int, int] | None) -> list[int]:
        """An edited line tends to be edited whole: once the answer ends a line after leaving the source
        (at source position left[0]), it goes on where the source's line goes on: at the line it left
        if it left at a line's start (it inserted lines), else at the next line (it rewrote this one)."""
        if self.newline is None or left is None or not self.newline(int(h[-1])):
            return []
        source, _ = left
        out = [source] if source > 0 and self.newline(int(h[source - 1])) else []
        for p in range(source, min(source + MAX_LINE, len(h) - 1)):
            if self.newline(int(h[p])):
                out.append(p + 1)
                break
        return [p for p in out if p < len(h) - 1]

    def _hot(self, h: np.ndarray, tokens: list[int]) -> int | None:
        """The index of the first token that starts a hint or follows a departure's context."""
        if not self.hints and not self.departures:
            return None
        before = [int(h[-2]) if len(h) > 1 else -1, int(h[-1])]
        seq = before + tokens
        for i, t in enumerate(tokens):
            if (seq[i], seq[i + 1]) in self.departures:
                return i
            for hint in self.hints.get(t, ()):
                if tuple(tokens[i : i + len(hint)]) == hint[: len(tokens) - i]:  # (a draft may end inside it)
                    return i
        return None
