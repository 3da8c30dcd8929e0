"""Where a generation's text is cut, and what goes out with it: stop strings (StopText), llama-server's n_indent rule
(a completion ends where the code leaves the block it was in), and each token's log probabilities (Probs, before the
text that completes them: Ledger; in OpenAI's shapes: openai_logprobs)."""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass


class StopText:
    """Cuts the text at the first stop sequence. Holds back the text that might still become one, so
    that a stream never sends a part of a stop sequence."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""  # not yet released
        self.hit: str | None = None  # the stop sequence that ended the text

    def push(self, piece: str) -> str:
        """What may be released now."""
        self.text += piece
        found = [(i, s) for i, s in ((self.text.find(s), s) for s in self.stops) if i >= 0]
        if found:
            cut, self.hit = min(found, key=lambda f: f[0])
            out, self.text = self.text[:cut], ""
            return out
        keep = len(self.text) - self.hold
        if keep <= 0:
            return ""
        out, self.text = self.text[:keep], self.text[keep:]
        return out

    def flush(self) -> str:
        out, self.text = self.text, ""
        return out


class Indent:
    """llama-server's n_indent: after the first line, a line that starts (at its first character that is not a space
    or a tab, a newline included) with less indentation than `n` ends the text there, its indentation kept. Holds back a line's
    indentation until its first character says whether the line stays: a stream never sends what is cut."""

    def __init__(self, n: int):
        self.n = n
        self.held = ""  # a line's start, whitespace only so far (after a newline)
        self.newline = False  # a newline has been released: the lines after it are checked
        self.hit = False

    def push(self, piece: str) -> str:
        if self.hit:
            return ""
        if self.n <= 0:
            return piece
        out = []
        for ch in piece:
            if self.newline:
                if ch in " \t":
                    self.held += ch
                    continue
                out.append(self.held)  # any other character decides, a newline too (as llama-server's check)
                self.held, self.newline = "", False
                if len(out[-1]) < self.n:
                    self.hit = True
                    break
            out.append(ch)
            self.newline = ch == "\n"
        return "".join(out)

    def flush(self) -> str:
        out, self.held = ("" if self.hit else self.held), ""
        return out


@dataclass(frozen=True, slots=True)
class Scored:
    """One generated token's log probability under the target, and its best alternatives (id, text, logprob)."""

    id: int
    text: str
    bytes: bytes
    logprob: float
    top: tuple[tuple[int, str, bytes, float], ...]


class Probs(tuple):
    """The Scored tokens whose text the next piece of a stream carries (a service item, like a text piece)."""


def scored(token, piece) -> Scored:
    """An engine Token's figures with the texts of its ids (`piece`: the model's bytes for an id)."""

    def named(t: int) -> tuple[bytes, str]:
        raw = piece(t)
        return raw, raw.decode("utf-8", "replace")

    raw, text = named(token.id)
    return Scored(token.id, text, raw, token.logprob, tuple((t, *named(t)[::-1], lp) for t, lp in token.top))


class Text(str):
    """A piece of the answer's text, and how many generated tokens it completes (a stream's tokens_predicted)."""

    tokens = 1

    @classmethod
    def of(cls, text: str, tokens: int) -> Text:
        out = cls(text)
        out.tokens = tokens
        return out


class Ledger:
    """Which generated tokens the text released so far covers: a token goes out (counted, its probabilities with
    it) with the piece that completes its text; a token whose text never goes out (a stop string's, a line cut by
    n_indent) is neither counted in a piece nor scored, as llama-server leaves a stop word's tokens out."""

    def __init__(self) -> None:
        self.ends: deque[tuple[int, Scored | None]] = deque()  # each token's text end, in characters, and figures
        self.made = 0
        self.released = 0

    def add(self, chars: int, scored: Scored | None) -> None:
        self.made += chars
        self.ends.append((self.made, scored))

    def release(self, chars: int) -> tuple[int, list[Scored]]:
        """(tokens, their figures where scored) that `chars` more characters of released text complete."""
        self.released += chars
        count, out = 0, []
        while self.ends and self.ends[0][0] <= self.released:
            _, scored = self.ends.popleft()
            count += 1
            if scored is not None:
                out.append(scored)
        return count, out


def openai_logprobs(scored: list, chat: bool, offset: int = 0) -> dict:
    """OpenAI's logprobs for these tokens (Scored). Chat: {"content": [{token, logprob, bytes, top_logprobs}]}; a
    completion, the legacy lists (text_offset: from the answer's start, `offset` being where these tokens start;
    top_logprobs by token text, where two alternatives that read alike keep the likelier). Alternatives the
    grammar rules out (probability 0, -inf: not JSON) are left out."""
    if chat:

        def one(token: str, raw: bytes, lp: float) -> dict:
            return {"token": token, "logprob": lp, "bytes": list(raw)}

        content = [
            {**one(s.text, s.bytes, s.logprob), "top_logprobs": [one(*t[1:]) for t in s.top if t[3] != -math.inf]}
            for s in scored
        ]
        return {"content": content}
    offsets = list(itertools.accumulate((len(s.text) for s in scored[:-1]), initial=offset)) if scored else []
    tops = []
    for s in scored:
        top: dict[str, float] = {}
        for _, token, _, lp in s.top:  # best first: setdefault keeps the likelier of two that read alike
            if lp != -math.inf:
                top.setdefault(token, lp)
        tops.append(top)
    return {
        "tokens": [s.text for s in scored],
        "token_logprobs": [s.logprob for s in scored],
        "top_logprobs": tops,
        "text_offset": offsets,
    }
