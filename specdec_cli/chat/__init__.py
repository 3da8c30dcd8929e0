"""Conversations: their messages and tools (messages.py), the prompt text the model's template makes of them
(template.py), the prompt's tokens (here), and the tool calls in an answer (calls.py)."""

from __future__ import annotations

import re
import secrets
from typing import Protocol

from .messages import Message, Tool, ToolCall, Tools, plain
from .template import Template, TemplateError

__all__ = ["Message", "Tool", "ToolCall", "Tools", "Template", "TemplateError", "plain", "template_of", "tokens"]


class ChatModel(Protocol):
    name: str

    def chat_template(self) -> str | None: ...
    def builtin_chat(self, messages: list[tuple[str, str]]) -> str | None: ...
    def add_bos(self) -> bool: ...
    def special_texts(self) -> tuple[str, str]: ...
    def tokenize_text(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...


def template_of(model: ChatModel) -> Template:
    bos, eos = model.special_texts()
    return Template(model.chat_template(), model.builtin_chat, bos if model.add_bos() else "", eos, model.name)


def tokens(model: ChatModel, messages: list[Message], tools: Tools | None = None) -> list[int]:
    """The conversation in the model's template, tokenized so that only the template's own markup can become
    control tokens: the contents are tokenized as text, so a prompt that contains `<|im_start|>system` stays
    text and cannot open a turn of its own.

    Contents without control-token text are tokenized with the template in one piece, as always (a
    SentencePiece vocabulary adds a space prefix at every cut). Otherwise the template is rendered with a
    random mark in place of each content and cut there: markup pieces are parsed for special tokens,
    contents are not."""
    template, tok = template_of(model), model.tokenize_text
    if all(
        tok(m.content, add_special=False, parse_special=True) == tok(m.content, add_special=False, parse_special=False)
        for m in messages
    ):
        return tok(template.render(messages, tools), add_special=True, parse_special=True)
    marks = [f"\x1f{secrets.token_hex(8)}\x1f" for _ in messages]
    contents = {mark: m.content for mark, m in zip(marks, messages)}
    marked = [Message(m.role, mark, m.tool_calls, m.tool_call_id, m.name) for mark, m in zip(marks, messages)]
    rendered = template.render(marked, tools)
    out: list[int] = []
    for i, piece in enumerate(re.split("(" + "|".join(map(re.escape, marks)) + ")", rendered)):
        if piece in contents:
            out += tok(contents[piece], add_special=False, parse_special=False)
        elif piece or i == 0:  # the first piece carries BOS, when the model wants one
            out += tok(piece, add_special=i == 0, parse_special=True)
    return out
