"""A request's tool calls on the server: the grammar its tools give the calls (constraint), and the calls read back
out of the answer's text as it streams (Calls), as the items the dialects read (Text, Call, Args)."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Iterator

from .. import ui
from ..backend import grammar
from ..backend.schema import schema_to_gbnf
from ..chat import ToolCall, Tools, calls
from ..errors import UsageError
from . import body
from .items import Args, Call, Item, Probs, Text


def constraint(tools: Tools, fmt: calls.Format) -> calls.Constraint:
    """The calls' grammar (each tool's arguments by its schema), lazy with tool_choice "auto". A tool whose
    schema the converter cannot express (or llama.cpp could not take) gets any JSON object for arguments,
    said in a warning: the request is still answered (tools come from third parties, MCP servers)."""

    def checked(tools: Tools) -> calls.Constraint:
        c = calls.constraint(tools, fmt, schema_to_gbnf)
        grammar.check(c.gbnf, schema=True)
        return c

    try:
        return checked(tools)
    except UsageError as e:
        refused = e
    kept, loosened = [], []
    for t in tools.tools:
        try:  # alone, as a call: its $refs resolve where they do among the others
            if tools.choice in ("auto", "required", t.name):
                checked(replace(tools, tools=(t,), choice="required"))
            kept.append(t)
        except UsageError as why:
            kept.append(replace(t, parameters={"type": "object"}))
            loosened.append(f"{t.name} ({why.message.removeprefix('--json-schema').lstrip(': ')})")
    if not loosened:  # each converts alone: together they are past a bound
        raise body.schema_refused(refused, "tools") from None
    ui.warning(f"tools: any JSON object stands for the arguments of {'; '.join(loosened)}")
    try:
        return checked(replace(tools, tools=tuple(kept)))
    except UsageError as e:
        raise body.schema_refused(e, "tools") from None


class Calls:
    """The calls' reader (chat/calls.Reader) between the cuts and the dialects, where the answer may make calls
    (`fmt`; None: its text is text): Text in; Text, Call and Args out; Probs pass as they are."""

    def __init__(self, fmt: calls.Format | None):
        self.reader = calls.Reader(fmt) if fmt is not None else None

    def read(self, items: Iterable[Probs | Text]) -> Iterator[Item]:
        for item in items:
            if self.reader is None or isinstance(item, Probs):
                yield item
            else:
                yield from map(_item, self.reader.push(item))

    def end(self) -> tuple[list[Item], list[ToolCall]]:
        """The pieces the reader still held, and the calls the whole answer made."""
        if self.reader is None:
            return [], []
        last, _, made = self.reader.end()
        return [_item(p) for p in last], made


def _item(p: calls.Piece) -> Text | Call | Args:
    if p.kind == "text":
        return Text(p.text)
    if p.kind == "call":
        return Call(p.index, p.call)
    return Args(p.index, p.text)
