"""A conversation as the chat template reads it, whichever API it came through (OpenAI's chat completions and
Responses, Anthropic's Messages, a batch line, `generate`'s prompt): messages, the tool calls an assistant
made, the results that came back, and the tools on offer."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the arguments as JSON text (OpenAI's function.arguments), as the model wrote them

    def for_template(self) -> dict:
        """OpenAI's shape, with the arguments as an object where they are one: templates write them with
        `| tojson` (Qwen's, Llama's) and a string there would be written as a quoted string."""
        args = decoded(self.arguments)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}


@dataclass(frozen=True)
class Message:
    role: str  # system | user | assistant | tool
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # a tool result's call
    name: str | None = None  # a tool result's function

    @property
    def plain(self) -> bool:
        """A text turn any template (and llama.cpp's built-in renderer) can write."""
        return not self.tool_calls and self.role != "tool"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    def for_template(self) -> dict:
        """OpenAI's declaration, as Hugging Face's chat templates expect `tools` (what they render)."""
        function: dict = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class Tools:
    """The tools of a request and what the model may do with them: `choice` is "auto" (write text or call),
    "required" (call one or more), a function's name (call that one), or "none" (answer in text: the tools
    are not shown to the model, so that it does not write a call that would come back as text)."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    parallel: bool = True  # several calls in one answer

    def named(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    @property
    def shown(self) -> tuple[Tool, ...]:
        """The tools the model is told about (none with tool_choice "none")."""
        return self.tools if self.choice != "none" else ()


def texts(messages: list[Message], tools: Tools | None = None) -> Iterator[str]:
    """Every text of a conversation that the template may write: contents, tool calls (ids, names, arguments),
    tool results' ids and names, and the tools shown (names, descriptions, parameters as JSON)."""
    for m in messages:
        yield m.content
        yield from (x for x in (m.tool_call_id, m.name) if x)
        for c in m.tool_calls:
            yield from (c.id, c.name, _written(decoded(c.arguments)))
    for t in tools.shown if tools is not None else ():
        yield from (t.name, t.description, json.dumps(t.parameters, ensure_ascii=False))


def guarded(
    messages: list[Message], tools: Tools | None, guard: Callable[[str], str]
) -> tuple[list[Message], Tools | None]:
    """The conversation with `guard` applied to every text but the contents (chat.tokens marks those whole)."""
    out = [
        Message(
            m.role,
            m.content,
            tuple(
                ToolCall(guard(c.id), guard(c.name), _written(_json_guarded(decoded(c.arguments), guard)))
                for c in m.tool_calls
            ),
            guard(m.tool_call_id) if m.tool_call_id is not None else None,
            guard(m.name) if m.name is not None else None,
        )
        for m in messages
    ]
    if tools is None:
        return out, None
    shown = tuple(Tool(guard(t.name), guard(t.description), _json_guarded(t.parameters, guard)) for t in tools.tools)
    return out, Tools(shown, tools.choice, tools.parallel)


MAX_DEPTH = 200  # arrays and objects inside each other in a request's JSON (serve's bodies, a call's arguments): what
# reads it later (json.dumps, a template's tojson, _json_guarded) recurses once a level; Python allows ~1,000
MAX_VALUES = 2**20  # values in one JSON text: a 128k context's token ids many times over, and parsed at most ~40 MB
MAX_CONTAINERS = 2**17  # arrays and objects in it (an empty {} is 3 bytes of JSON, 64 of Python): ~8 MB of them
_KEPT = bytes(b for b in range(256) if b not in b'"[]{},')  # deleted: all but quotes, brackets and commas
_STEP = bytes.maketrans(b"[{]}", bytes([1, 1, 255, 255]))  # an open +1, a close -1 (as int8)
_QUOTE = ord('"')
_PIECE = 1 << 20  # bytes of structure looked at at once


@dataclass(frozen=True)
class Shape:
    """What a JSON text holds, counted before it is parsed: how deep its arrays and objects nest, how many values
    (about: each comma and each container is one) and how many arrays and objects."""

    depth: int
    values: int
    containers: int

    def problem(self) -> str | None:
        """Why it is refused (None: it is not): past MAX_DEPTH, MAX_VALUES or MAX_CONTAINERS."""
        if self.depth > MAX_DEPTH:
            return f"nested too deeply (arrays and objects: {MAX_DEPTH} levels at most)"
        if self.values > MAX_VALUES or self.containers > MAX_CONTAINERS:
            return f"too large ({MAX_VALUES:,} values and {MAX_CONTAINERS:,} arrays and objects at most)"
        return None


def json_shape(text: str | bytes) -> Shape:
    """A JSON text's Shape, from its UTF-8 bytes in a few linear passes of C, memory a few times the text's: a walk
    over the parsed value took 3 s and 280 MB on an 8 MiB body of 2.8 million empty objects, and parsing it would
    have made them. Escapes go first (pairs of backslashes, then escaped quotes: left to right, as JSON's lexer
    pairs them), so every quote left opens or closes a string; what lies outside strings is the structure. A text
    that is not JSON gets some Shape: its parse then fails, having made no more than the Shape counts before it."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else _utf8(text)
    marks = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _KEPT)
    inside, level, depth, commas, opens = 0, 0, 0, 0, 0  # (carried from one piece to the next)
    for start in range(0, len(marks), _PIECE):  # in pieces: a few MB of numpy's temporaries, whatever the text
        chars = np.frombuffer(marks, dtype=np.uint8, count=min(_PIECE, len(marks) - start), offset=start)
        quotes = (chars == _QUOTE).view(np.uint8)
        within = np.bitwise_xor.accumulate(quotes) ^ inside  # 1 from a string's opening quote to its closing one
        inside = int(within[-1])
        part = chars[(within | quotes) == 0].tobytes()  # (a closing quote's own 0 is not structure either)
        commas += part.count(b",")
        brackets = part.translate(None, b",")
        opens += brackets.count(b"[") + brackets.count(b"{")
        if brackets and opens <= MAX_CONTAINERS:  # the deepest running count of opens less closes (no byte of a
            # UTF-8 character is a bracket); past the bound the text is refused anyway
            levels = np.cumsum(np.frombuffer(brackets.translate(_STEP), dtype=np.int8), dtype=np.int32) + level
            depth, level = max(depth, int(levels.max())), int(levels[-1])
    return Shape(depth, commas + opens + 1, opens)


def _utf8(data: bytes) -> bytes:
    """A JSON body's bytes as UTF-8 (json.loads takes UTF-16 and UTF-32 too, whose bytes a bracket may hide in)."""
    encoding = json.detect_encoding(data)
    if encoding == "utf-8":
        return data
    try:
        return data.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    except UnicodeError:  # not that encoding after all: the parse says so
        return data


def decoded(arguments: str) -> Any:
    """A call's arguments as a template writes them: the JSON value they hold (its strings as the characters they
    stand for: `"\\u003c/s>"` is `</s>`), or the string itself where they hold none, or one past json_shape's
    bounds."""
    if json_shape(arguments).problem():
        return arguments
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments


def _written(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _json_guarded(value: Any, guard: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return guard(value)
    if isinstance(value, dict):
        return {guard(str(k)): _json_guarded(v, guard) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_guarded(v, guard) for v in value]
    return value


def plain(pairs: list[tuple[str, str]]) -> list[Message]:
    return [Message(role, content) for role, content in pairs]
