"""Grammar-aware drafts: where a constrained answer's grammar admits one continuation (the rest of a required
key, a closing quote, the rest of an enum value or a literal), that continuation, as the model's tokenizer
writes it, is offered to auto as a candidate like lookup's, with its acceptance learned per source.

The grammar is asked one character at a time, over the single-character tokens of the vocabulary (one
grammar pass over ~100 candidates). Optional whitespace is everywhere in JSON grammars: where the only
choice is whitespace or one other character, the answer's own habit decides (did it put whitespace after
this character the last time it wrote it?). Offers are only offers: the verification, masked by the
grammar, decides (engine/constraint.py), so a wrong guess costs speed, never the text.
"""

from __future__ import annotations

import string
from typing import Any, Callable

import numpy as np

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
        self.state = start  # the grammar's state after the generated text seen so far
        self.tokenize, self.piece = tokenize, piece
        self.prompt = self.seen = 0
        self.text = ""  # the generated text, for its whitespace habits
        probes = {c: tokenize(c) for c in string.printable if c not in "\r\x0b\x0c"}
        self.chars = [c for c, t in probes.items() if len(t) == 1]
        self.ids = np.array([probes[c][0] for c in self.chars], dtype=np.int32)

    def prefill(self, tokens: list[int]) -> None:
        """The prompt but its last token: the grammar applies from the token after the prompt."""
        self.prompt = self.seen = len(tokens) + 1

    def candidate(self, committed: list[int], k: int) -> Candidate | None:
        """What the grammar forces after the committed text, tokenized as the model would write it."""
        self._sync(committed)
        forced, kinds, stop = self._walk(self.state, self.text)
        tokens, at = self._tokens(committed, forced, kinds, stop, k)
        return Candidate(tokens, "grammar", 1, at=tuple(at)) if tokens else None

    def _sync(self, committed: list[int]) -> None:
        for t in committed[self.seen :]:  # generated under the constraint: each one the grammar allowed
            self.state = self.state.after(t)
            self.text += self.piece(t).decode("utf-8", "replace")
        self.seen = len(committed)

    def _walk(self, state: Any, text: str) -> tuple[str, list[int], int]:
        """(The characters the grammar forces from `state` on, how each was chosen, why it stopped: END, CHOICE,
        or 0 at free text)."""
        forced, kinds = "", []
        while len(forced) < MAX_CHARS:
            c, kind = self._next(state, text + forced)
            if c is None:
                return forced, kinds, kind
            forced, kinds = forced + c, kinds + [kind]
            state = state.after(int(self.ids[self.chars.index(c)]))
        return forced, kinds, 0

    def _tokens(self, committed: list[int], forced: str, kinds: list[int], stop: int, k: int):
        """(`forced` as the model's tokenizer writes it after `committed`, cut where the grammar disagrees, and
        each token's kind: its least sure character's); the end of generation after it where the grammar may end.
        Before a choice of closing characters the last token may merge with the one chosen (`"` + `}`: `"}`)."""
        tokens, at, state = [], [], self.state
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

    def _next(self, state: Any, text: str) -> tuple[str | None, int]:
        """(The one character the grammar leaves, or optional whitespace as the text's habit has it; how it
        was chosen). (None, END) where the grammar may end and allows nothing but whitespace besides; (None,
        CHOICE) at a choice of closing characters; (None, 0) where the text is free."""
        allowed = [c for c, ok in zip(self.chars, state.allowed(self.ids)) if ok]
        solid = [c for c in allowed if c not in WHITESPACE]
        if not solid and state.complete():
            return None, END
        if len(allowed) == 1 and not state.complete():
            return allowed[0], SURE
        habit, kind = self._habit(text)
        if habit and habit in allowed and len(solid) < FREE:  # e.g. after ':', a value next
            return habit, kind
        if len(solid) > 1 and set(solid) <= set(CLOSING):
            return None, CHOICE
        if len(solid) != 1 or not text or state.complete():
            return None, 0
        return solid[0], kind

    @staticmethod
    def _habit(text: str) -> tuple[str, int]:
        """(What the answer wrote after its last character the earlier times: one whitespace character or ""
        for none, the majority; how steadily)."""
        if not text:
            return "", GUESS
        last = text[-1]
        if last.isdigit():  # after a number: what followed the ends of the numbers before (any digit)
            ends = [
                i
                for i, c in enumerate(text[:-1])
                if c.isdigit() and not (text[i + 1].isdigit() or text[i + 1] in ".eE")
            ]
        else:
            ends = [i for i, c in enumerate(text[:-1]) if c == last]
        after = [text[i + 1] if text[i + 1] in WHITESPACE else "" for i in ends]
        if not after:
            return STYLE.get(last, ""), GUESS
        top = max(set(after), key=after.count)
        steady = after.count(top) == len(after)
        return top, (STEADY if len(after) > 1 else HABIT) if steady else GUESS
