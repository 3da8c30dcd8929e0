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

MAX_CHARS = 48  # a key, its quotes and separators; free text stops a continuation long before
WHITESPACE = " \n\t"


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
        for t in committed[self.seen :]:  # generated under the constraint: each one the grammar allowed
            self.state = self.state.after(t)
            self.text += self.piece(t).decode("utf-8", "replace")
        self.seen = len(committed)
        forced, state = "", self.state
        while len(forced) < MAX_CHARS:
            c = self._next(state, self.text + forced)
            if c is None:
                break
            forced += c
            state = state.after(int(self.ids[self.chars.index(c)]))
        if not forced:
            return None
        tokens, state = [], self.state
        for t in self._in_context(committed, forced)[:k]:  # as the model writes it; cut where the grammar disagrees
            if not state.allows(t):
                break
            tokens.append(t)
            state = state.after(t)
        return Candidate(tokens, "grammar", 1) if tokens else None

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

    def _next(self, state: Any, text: str) -> str | None:
        """The one character the grammar leaves, or between whitespace and one other, the text's habit."""
        allowed = [c for c, ok in zip(self.chars, state.allowed(self.ids)) if ok]
        solid = [c for c in allowed if c not in WHITESPACE]
        if len(allowed) == 1:
            return allowed[0]
        if len(solid) != 1 or not text:
            return None
        before = text[:-1].rfind(text[-1])  # the last time the answer wrote this character
        after = text[before + 1] if before >= 0 else ""
        return after if after in WHITESPACE and after in allowed else solid[0]
