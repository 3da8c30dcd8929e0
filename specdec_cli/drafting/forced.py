"""Grammar-aware drafts: where a constrained answer's grammar admits one continuation (the rest of a required
key, a closing quote, the rest of an enum value or a literal), that continuation, as the model's tokenizer
writes it, is offered to auto as a candidate like lookup's, each token's chance learned by how it was chosen.

The grammar is asked one character at a time, over the single-character tokens of the vocabulary (one
grammar pass over ~100 candidates). Optional whitespace is everywhere in JSON grammars: the answer's own
habit decides (what did it write after this character before?), kept as a table as the text grows, so
asking costs the same on a long answer as on a short one. Offers are only offers: the verification, masked
by the grammar, decides (engine/constraint.py), so a wrong guess costs speed, never the text.
"""

from __future__ import annotations

import string
from collections import Counter
from typing import Any, Callable

import numpy as np

from ..engine.constraint import Follow
from .lookup import Candidate

MAX_CHARS = 96  # keys, quotes, separators, closings; free text stops a continuation long before
WHITESPACE = " \n\t"
STYLE = {":": " ", ",": " "}  # the first time: JSON's common style (json.dumps), no whitespace elsewhere
FREE = 32  # a grammar that allows this many characters is at free text (a string's): whitespace there is prose
# How each token of a continuation was chosen, the bucket auto learns its chance in (auto.GRAMMAR_KINDS):
SURE = 1  # the grammar allows only this (the model may still split it into other tokens)
STEADY = 2  # optional whitespace, or none, as the answer wrote it after every earlier same character (2+)
HABIT = 3  # ... as it wrote it after the one earlier same character
GUESS = 4  # ... the first time the answer meets the choice, or where its habit is mixed: left out, or the majority
END = 5  # the end of generation, where the grammar is complete and allows only whitespace besides
TAIL = 6  # the last token before a choice of closing characters, which the model may merge it with
CHOICE = -1  # (why a continuation stops: a choice of closing characters)
CLOSING = ",}]"


class Forced:
    def __init__(self, start: Any, tokenize: Callable[[str], list[int]], piece: Callable[[int], bytes]):
        self.follow = Follow(start)  # the grammar's state after the committed text
        self.tokenize, self.piece = tokenize, piece
        self.prompt = self.seen = 0
        self.last = ""  # the generated text's last character
        self.follows: dict[str, Counter] = {}  # per character: what the answer wrote after it (whitespace or "")
        probes = {c: tokenize(c) for c in string.printable if c not in "\r\x0b\x0c"}
        self.ids = {c: t[0] for c, t in probes.items() if len(t) == 1}  # the single-character tokens
        self.probe = np.array(list(self.ids.values()), dtype=np.int32)

    def prefill(self, tokens: list[int]) -> None:
        """The prompt but its last token: the grammar applies from the token after the prompt."""
        self.prompt = self.seen = len(tokens) + 1
        self.follow.prefill(tokens)

    def candidate(self, committed: list[int], k: int) -> Candidate | None:
        """What the grammar forces after the committed text, tokenized as the model would write it."""
        for t in committed[self.seen :]:
            for c in self.piece(t).decode("utf-8", "replace"):
                self._learn(c)
        self.seen = len(committed)
        state = self.follow.at(committed)
        forced, kinds, stop = self._walk(state, self.last)
        tokens, at = self._tokens(committed, state, forced, kinds, stop, k)
        return Candidate(tokens, "grammar", 1, at=tuple(at)) if tokens else None

    def _learn(self, c: str) -> None:
        """The answer wrote `c` after its last character: one more observation of that character's habit."""
        key = _habit_key(self.last, c) if self.last else None
        if key is not None:
            self.follows.setdefault(key, Counter())[c if c in WHITESPACE else ""] += 1
        self.last = c

    def _walk(self, state: Any, last: str) -> tuple[str, list[int], int]:
        """(The characters the grammar forces from `state` on, how each was chosen, why it stopped: END, CHOICE,
        or 0 at free text). `last`: the text's last character."""
        forced, kinds = "", []
        while len(forced) < MAX_CHARS:
            c, kind = self._next(state, last)
            if c is None:
                return forced, kinds, kind
            forced, kinds, last = forced + c, kinds + [kind], c
            state = state.after(self.ids[c])
        return forced, kinds, 0

    def _tokens(self, committed: list[int], state: Any, forced: str, kinds: list[int], stop: int, k: int):
        """(`forced` as the model's tokenizer writes it after `committed`, cut where the grammar disagrees, and
        each token's kind: its least sure character's); the end of generation after it where the grammar may end.
        Before a choice of closing characters the last token may merge with the one chosen (`"` + `}`: `"}`)."""
        tokens, at = [], []
        for t in self._in_context(committed, forced) if forced else []:
            if len(tokens) >= k or not state.allows(t):
                break
            span = len(self.piece(t))
            at.append(max(kinds[:span], default=GUESS))
            kinds = kinds[span:]
            tokens.append(t)
            state = state.after(t)
        if stop == CHOICE and at and not kinds:
            at[-1] = max(at[-1], TAIL)
        if stop == END and not kinds and len(tokens) < k and state.complete():
            tokens.append(state.eog)
            at.append(END)
        return tokens, at

    def _in_context(self, committed: list[int], forced: str) -> list[int]:
        """`forced` tokenized after the answer's last tokens, as the model's tokenizer would split the whole
        (a closing quote may merge with what precedes it); standalone where the context splits otherwise."""
        for back in (2, 1):
            last = committed[max(self.prompt, len(committed) - back) :]
            if len(last) < back:
                continue
            tokens = self.tokenize(b"".join(self.piece(t) for t in last).decode("utf-8", "replace") + forced)
            if tokens[: len(last)] == last and len(tokens) > len(last):
                return tokens[len(last) :]
        return self.tokenize(forced)

    def _next(self, state: Any, last: str) -> tuple[str | None, int]:
        """(The one character the grammar leaves, or optional whitespace as the text's habit has it; how it
        was chosen). (None, END) where the grammar may end and allows nothing but whitespace besides; (None,
        CHOICE) at a choice of closing characters; (None, 0) where the text is free."""
        allowed = [c for c, ok in zip(self.ids, state.allowed(self.probe)) if ok]
        solid = [c for c in allowed if c not in WHITESPACE]
        if not solid and state.complete():
            return None, END
        if len(allowed) == 1 and not state.complete():
            return allowed[0], SURE
        habit, kind = self._habit(last)
        if habit and habit in allowed and len(solid) < FREE:  # e.g. after ':', a value next
            return habit, kind
        if len(solid) > 1 and set(solid) <= set(CLOSING):
            return None, CHOICE
        if len(solid) != 1 or not last or state.complete():
            return None, 0
        return solid[0], kind

    def _habit(self, last: str) -> tuple[str, int]:
        """(What the answer wrote after `last` the earlier times: one whitespace character or "" for none, the
        majority; how steadily)."""
        seen = self.follows.get(_habit_key(last, "")) if last else None
        if not seen:
            return STYLE.get(last, ""), GUESS
        (top, n), total = seen.most_common(1)[0], seen.total()
        return top, (STEADY if total > 1 else HABIT) if n == total else GUESS


def _habit_key(c: str, after: str) -> str | None:
    """Whose habit `after` shows: `c`'s; after a digit, every number's, and only where a number ended there."""
    if not c.isdigit():
        return c
    return None if after.isdigit() or (after and after in ".eE") else "0"
