"""Conversations: their messages and tools (messages.py), the prompt text the model's template makes of them
(template.py), the prompt's tokens (here, in bounded pieces: limits.py), and the tool calls in an answer
(calls.py)."""

from __future__ import annotations

import re
import secrets
from dataclasses import replace
from typing import Protocol

from . import limits
from .limits import Cancelled, TooLong
from .messages import Message, Tool, ToolCall, Tools, guarded, plain, texts
from .template import RENDER_BYTES, Template, TemplateError

__all__ = ["Message", "Tool", "ToolCall", "Tools", "Template", "TemplateError", "plain", "template_of", "tokens"]
__all__ += ["Cancelled", "TooLong", "texts"]


class ChatModel(Protocol):
    name: str

    def chat_template(self) -> str | None: ...
    def builtin_chat(self, messages: list[tuple[str, str]]) -> str | None: ...
    def add_bos(self) -> bool: ...
    def special_texts(self) -> tuple[str, str]: ...
    def tokenize_text(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...
    def piece(self, token: int) -> bytes: ...
    def control_texts(self) -> frozenset[str]: ...


def template_of(model: ChatModel) -> Template:
    bos, eos = model.special_texts()
    return Template(model.chat_template(), model.builtin_chat, bos if model.add_bos() else "", eos, model.name)


def tokens(
    model: ChatModel, messages: list[Message], tools: Tools | None = None, max_bytes: int = RENDER_BYTES
) -> list[int]:
    """The conversation in the model's template, tokenized so that only the template's own markup can become
    control tokens: every text of the request is tokenized as text, so a prompt, a tool's description or a tool's
    result that contains `<|im_start|>system` stays text and cannot open a turn of its own.

    A conversation without control-token text is tokenized with the template in one piece, as always (a
    SentencePiece vocabulary adds a space prefix at every cut). Otherwise the template is rendered with marks, cut
    there and tokenized piece by piece: markup is parsed for control tokens, what a mark stands for is not. The
    marks: each content whole where one has control-token text (as before); in every other text (tools, calls,
    names, ids), each control-token text where it stands, since templates write those through `tojson`. TooLong
    where the text is longer than max_bytes (it cannot fit then), before it is tokenized."""
    template, pattern = template_of(model), limits.control_pattern(model)
    if pattern is None or not any(pattern.search(t) for t in texts(messages, tools)):
        return _tokenized(model, [template.render(messages, tools, max_bytes)], {}, set(), max_bytes)
    key = secrets.token_hex(8)
    marks: dict[str, str] = {}  # mark -> the text it stands for
    by_text: dict[str, str] = {}

    def mark(text: str) -> str:
        marks[m := f"specdec{key}m{len(marks)}x"] = text
        return m

    def guard(text: str) -> str:
        return pattern.sub(lambda found: by_text.get(found[0]) or by_text.setdefault(found[0], mark(found[0])), text)

    marked, shown = guarded(messages, tools, guard)
    whole: set[str] = set()
    if any(pattern.search(m.content) for m in messages):
        marked = [replace(m, content=mark(m.content)) if m.content else m for m in marked]  # ("": nothing to keep)
        whole = set(marks) - set(by_text.values())
    rendered = template.render(marked, shown, max_bytes + 64 * len(marks))  # (a mark may be longer than its text)
    return _tokenized(model, re.split(f"(specdec{key}m[0-9]+x)", rendered, flags=re.I), marks, whole, max_bytes)


def _tokenized(
    model: ChatModel, pieces: list[str], marks: dict[str, str], whole: set[str], max_bytes: int
) -> list[int]:
    """Markup and marks, alternately, as tokens: a mark's text as text. A content (`whole`) and markup with control
    tokens are tokenized alone; the rest runs together as text, in one call where it can (llama.cpp's BPE costs
    60 us a call: a tool text with 90,000 control-token texts would be 180,000 calls). TooLong before any."""
    size = limits.text_bytes(marks.get(p.lower(), p) for p in pieces)
    if size > max_bytes:
        raise limits.TooLong(size)
    pattern = limits.control_pattern(model)
    out: list[int] = []
    run: list[str] = []  # text without control tokens of the template's: marks' texts, markup between them
    first = [True]  # the first call adds BOS, when the model wants one

    def add(text: str, parse_special: bool) -> None:
        out.extend(limits.tokenize(model, text, add_special=first[0], parse_special=parse_special))
        first[0] = False

    def flush() -> None:
        if run:
            add("".join(run), False)
            run.clear()

    for i, piece in enumerate(pieces):
        if i % 2 and piece.lower() not in whole:
            run.append(marks[piece.lower()])
        elif i % 2:
            flush()
            add(marks[piece.lower()], False)
        elif pattern is not None and pattern.search(piece):
            flush()
            add(piece, True)
        elif piece:
            run.append(piece)
    flush()
    if first[0]:
        add("", True)
    return out
