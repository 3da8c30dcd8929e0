"""What a request's text may cost before the model reads it: its bytes are counted against the context before
anything is rendered or tokenized, tokenizing runs in bounded pieces (linear time, a stop checked between
pieces), and control-token text is found (so that it can be kept text: chat/__init__.py).

Why pieces: llama.cpp's SentencePiece tokenizer reserves its output vector one byte-fallback symbol at a time
(`output.reserve(output.size() + symbol.n)` in resegment), a copy of every token so far per symbol: one call is
quadratic in its tokens (the tiny byte vocabulary: 100 KB in 2.1 s, 200 KB in 19 s). In pieces of PIECE_CHARS it
is linear (400 KB in 0.15 s). A piece ends before a space between two other characters, or after a line break:
no pre-tokenizer joins text across either, so the tokens are those of the whole text. A run of PIECE_CHARS without
one is cut where the piece ends (its two tokens there may differ from the whole text's).
"""

from __future__ import annotations

import re
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, Protocol

PIECE_CHARS = 2048  # one tokenize call's text at most: 0.4 s per MB at worst (measured), 6 ms a piece
_SAFE = re.compile(r"(?<=\S) (?=\S)|(?<=\n)(?=\S)")  # where a piece may end: before a lone space, after a line break
_SAFE_SPACE = re.compile(r"(?<=\S) (?=\S)")  # ... where llama.cpp prefixes each call's text with a space


class Model(Protocol):
    def tokenize_text(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...
    def piece(self, token: int) -> bytes: ...
    def control_texts(self) -> frozenset[str]: ...


class TooLong(Exception):
    """A request's text has more bytes than the context could hold as tokens (`size`: how many)."""

    def __init__(self, size: int):
        super().__init__(f"{size:,} bytes")
        self.size = size


class Cancelled(Exception):
    """The server is stopping: a request's tokenizing or rendering ends where it is."""


_stop: ContextVar[Callable[[], bool]] = ContextVar("stop", default=lambda: False)


@contextmanager
def stopping(check: Callable[[], bool]) -> Iterator[None]:
    """Within the block, tokenizing and rendering on this thread raise Cancelled once `check()` is true (a
    connection's thread: the main thread gets its signals as exceptions already)."""
    token = _stop.set(check)
    try:
        yield
    finally:
        _stop.reset(token)


def check_stop() -> None:
    if _stop.get()():
        raise Cancelled("the server is stopping")


def tokenize(model: Model, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    """model.tokenize_text in pieces of at most PIECE_CHARS, cut where the tokens do not change (above)."""
    prefixed = _space_prefix(model)
    safe = _SAFE_SPACE if prefixed else _SAFE
    out: list[int] = []
    start = 0
    while True:
        check_stop()
        end = len(text) if len(text) - start <= PIECE_CHARS else _cut(text, start, safe)
        piece = text[start:end]
        if start and prefixed and piece.startswith(" "):  # llama.cpp writes the space itself: not twice
            piece = piece[1:]
        out += model.tokenize_text(piece, add_special=add_special and not start, parse_special=parse_special)
        if end == len(text):
            return out
        start = end


def _cut(text: str, start: int, safe: re.Pattern) -> int:
    """Where the piece that starts at `start` ends: the last safe place in its second half, else its end."""
    end = start + PIECE_CHARS
    found = [m.start() for m in safe.finditer(text, start + PIECE_CHARS // 2, end)]
    return found[-1] if found else end


_PREFIXED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PATTERNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _space_prefix(model: Model) -> bool:
    """Whether llama.cpp starts every call's text with a space (SentencePiece's add_space_prefix): "a" as "▁a"."""
    if model not in _PREFIXED:
        ids = model.tokenize_text("a", add_special=False, parse_special=False)
        _PREFIXED[model] = bool(ids) and model.piece(ids[0]).startswith(b" ")
    return _PREFIXED[model]


def control_pattern(model: Model) -> re.Pattern | None:
    """A pattern that finds the model's control-token texts (None: it has none), as a trie: one position costs
    the length of the longest text that starts there, however many texts there are (Gemma has thousands)."""
    if model not in _PATTERNS:
        texts = model.control_texts()
        _PATTERNS[model] = re.compile(_trie(sorted(texts))) if texts else None
    return _PATTERNS[model]


def _trie(texts: list[str]) -> str:
    root: dict = {}
    for text in texts:
        node = root
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}
    # iterative, deepest first: a text may be hundreds of characters long
    order, stack = [], [root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(child for ch, child in node.items() if ch)
    made: dict[int, str] = {}
    for node in reversed(order):
        alts = [re.escape(ch) + made[id(child)] for ch, child in sorted(node.items()) if ch]
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")" if alts else ""
        made[id(node)] = f"(?:{body})?" if "" in node and body else body  # longest first: a text may begin another
    return made[id(root)]


def text_bytes(texts: Iterator[str]) -> int:
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
