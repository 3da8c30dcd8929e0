"""Where a generation's text is cut, and what goes out with it, token by token (Cuts, of: stop strings, StopText;
llama-server's n_indent rule, Indent, where a completion ends as the code leaves the block it was in; its time limit;
and each token's log probabilities, Probs before the text that completes them, Ledger; in OpenAI's shapes:
openai_logprobs)."""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from typing import Callable

from ..engine.events import Token
from .items import Probs, Scored, Text


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


def scored(token: Token, piece: Callable[[int], bytes]) -> Scored:
    """An engine Token's figures with the texts of its ids (`piece`: the model's bytes for an id)."""

    def named(t: int) -> tuple[bytes, str]:
        raw = piece(t)
        return raw, raw.decode("utf-8", "replace")

    raw, text = named(token.id)
    return Scored(token.id, text, raw, token.logprob, tuple((t, *named(t)[::-1], lp) for t, lp in token.top))


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


class Cuts:
    """The per-token cuts of one generation, as one: each token's text through the stop strings, then n_indent;
    the time limit (llama-server's t_max_predict_ms: a line that ends past it ends the text); and the ledger that
    sends each token's count and log probabilities with the text that completes it. `piece`: the model's bytes
    for an id, where the request asked for log probabilities (None: not asked)."""

    def __init__(self, stops: list[str], indent: int, time_limit: float | None, piece: Callable[[int], bytes] | None):
        self.stop, self.indent, self.ledger = StopText(stops), Indent(indent), Ledger()
        self.time_limit, self.piece = time_limit, piece
        self.deadline = float("inf")
        self.late = False  # a line ended past the time limit
        self.scored: list[Scored] = []  # every token's figures that went out (Finished.probs)

    @property
    def ended(self) -> bool:
        """The text ended here: a stop string, a line indented less, or the time limit."""
        return self.stop.hit is not None or self.indent.hit or self.late

    @property
    def limit(self) -> bool:
        """The time or indentation limit ended it (llama-server's stop_type "limit")."""
        return self.indent.hit or self.late

    def prefilled(self) -> None:
        """The prompt is in: the time limit counts from here."""
        self.deadline = time.perf_counter() + (self.time_limit or 0.0)

    def token(self, token: Token) -> list[Probs | Text]:
        """What one token lets out (nothing while a stop string or a line's indentation might still cut it)."""
        self.ledger.add(len(token.text), scored(token, self.piece) if self.piece is not None else None)
        piece = self.indent.push(self.stop.push(token.text))
        self.late = self.time_limit is not None and "\n" in token.text and time.perf_counter() > self.deadline
        if self.late and not self.stop.hit:  # what a stop string might have become is text after all
            piece += self.indent.push(self.stop.flush())
        if self.stop.hit or self.late:  # (an indentation the line's next character would have judged: kept)
            piece += self.indent.flush()
        return self._release(piece)

    def stopped(self, tail: str) -> list[Probs | Text]:
        """The rest, at the end: the detokenizer's `tail`, and what the stop strings and n_indent held."""
        piece = self.stop.push(tail) + ("" if self.stop.hit else self.stop.flush())
        return self._release(self.indent.push(piece) + self.indent.flush())

    def _release(self, piece: str) -> list[Probs | Text]:
        """Text that goes out, after the probabilities of the tokens it completes (a stop string's, or a line's cut
        by n_indent, never go out), as Text that knows how many tokens it completes."""
        if not piece:
            return []
        count, probs = self.ledger.release(len(piece))
        self.scored.extend(probs)
        return [Probs(probs), Text.of(piece, count)] if probs else [Text.of(piece, count)]


def openai_logprobs(scored: list[Scored], chat: bool, offset: int = 0) -> dict:
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
