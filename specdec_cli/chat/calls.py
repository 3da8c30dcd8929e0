"""Tool calls in a model's answer: the format its template taught it, the grammar its calls must satisfy, and
the calls read back out of the text, as it streams.

Formats, as llama.cpp's chat parsers (common/chat.cpp) know them:
- hermes (Qwen2.5, Hermes, and any template without tool markup, which gets Hermes's instructions):
  `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one block per call, after optional text;
- mistral: `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`;
- llama3 (Llama 3.1+): the answer is `{"name": "f", "parameters": {...}}`.
The grammar: each call's arguments satisfy its tool's JSON schema. With tool_choice "auto" it is lazy: free text
until the call's opening marker (or, for Hermes and Llama, the call's JSON opening the answer), the call from there; "required" or a named tool constrain from the
first token. The reader (`Reader`) turns text into content and calls as it arrives: a stream sends each call's
name when its header is complete and its arguments as they are written, and what it sent joins to the final
`arguments`. A text that opens a call but does not hold a whole valid one is content, never an error.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from .messages import Tool, ToolCall, Tools, json_shape


_OPENING = re.compile(r"\s*(?:```(?:json)?\s*)?(?=\{)")  # an answer that opens with a call's JSON, fenced or not


@dataclass(frozen=True)
class Format:
    name: str
    tag: str | None  # the marker a call opens with, anywhere in the answer (the lazy grammar's trigger)
    args_key: str  # "arguments" or "parameters"
    bare: bool = False  # the answer may also open with a call's JSON itself, in a ```json fence or not

    def find(self, text: str) -> int:
        """Where `text` holds the call marker (-1: nowhere)."""
        return text.find(self.tag) if self.tag else -1

    def opens(self, text: str) -> int | bool | None:
        """Whether an answer that begins with `text` opens with a call's JSON: where its first character is
        (the fence's, where fenced), False where it does not, None while it cannot yet tell."""
        if not self.bare:
            return False
        m = _OPENING.match(text)
        if m is not None and re.match(r'\{\s*"name"', text[m.end() :]):
            return len(text) - len(text.lstrip())
        return None if _may_open(text.lstrip()) else False


def _may_open(s: str) -> bool:
    """Whether `s` is the start of an answer that opens with a call's JSON (`{"name"`, maybe in a fence)."""
    if s.startswith("```"):
        rest = s[3:]
        if "json".startswith(rest):
            return True
        s = rest[4:].lstrip() if rest.startswith("json") else rest.lstrip()
    elif "```".startswith(s):
        return True
    if not s:
        return True
    return s[0] == "{" and '"name"'.startswith(s[1:].lstrip())


FORMATS = {
    "hermes": Format("hermes", "<tool_call>", "arguments", bare=True),
    "mistral": Format("mistral", "[TOOL_CALLS]", "arguments"),
    "llama3": Format("llama3", None, "parameters", bare=True),
}


def format_of(template: str | None) -> Format:
    """The format a template teaches (what its tool markup writes); Hermes's where it has none (we write its
    instructions then: chat/template.py)."""
    source = template or ""
    if "[TOOL_CALLS]" in source:
        return FORMATS["mistral"]
    if "<tool_call>" in source or "tools" not in source:
        return FORMATS["hermes"]
    if "<|python_tag|>" in source or ("ipython" in source and "parameters" in source):
        return FORMATS["llama3"]
    return FORMATS["hermes"]


@dataclass(frozen=True)
class Constraint:
    """A grammar for the answer: its GBNF, and where it begins (`trigger`: the format, whose marker or opening
    JSON starts it; None: it applies from the first token)."""

    gbnf: str
    trigger: Format | None = None


def constraint(tools: Tools, fmt: Format, to_gbnf) -> Constraint | None:
    """What the answer must satisfy for these tools (None: tool_choice none). `to_gbnf`: a JSON schema (dict) to
    GBNF, the converter --json-schema uses."""
    if tools.choice == "none":
        return None
    chosen = [t for t in tools.tools if tools.choice in ("auto", "required") or t.name == tools.choice]
    one = _call_schemas(chosen, fmt)
    rules = re.sub(r"^root ::=", "call-json ::=", to_gbnf(one), count=1, flags=re.M).rstrip("\n") + "\n"
    rules = _loose(rules)
    many = tools.parallel
    more = " (nl call)*" if many else ""
    alternatives = []
    if fmt.name == "hermes":
        alternatives.append(f"call{more}")
        rules += 'call ::= "<tool_call>" nl call-json nl "</tool_call>"\n'
    elif fmt.name == "mistral":
        alternatives.append('"[TOOL_CALLS]" "[" call-json' + (' ("," nl call-json)*' if many else "") + ' "]"')
    if fmt.bare:  # the call's JSON opening the answer, in a ```json fence or not (how Qwen2.5 often writes it)
        alternatives += ['"```" "json"? nl call-json nl "```"', "call-json"]
    root = "root ::= " + " | ".join(f"( {a} )" for a in alternatives) + "\nnl ::= [ \\n]{0,2}\n"
    return Constraint(root + rules, fmt if tools.choice == "auto" else None)


_LITERALS = re.compile(r'^(\S+) ::= ("(?:[^"\\]|\\.)*"(?: \| "(?:[^"\\]|\\.)*")*)$', re.M)


def _loose(rules: str) -> str:
    """JSON as models write a call: on one line or pretty-printed, as llama.cpp's own converter allows. The one
    llama-cpp-python ships allows one space between tokens and none after a const or an enum's value, so a
    model that indents (Qwen2.5 in a ```json block) would be forced off its course."""
    rules = re.sub(r"^space ::= .*$", lambda m: 'space ::= | " " | "\\n" [ \\t]{0,20}', rules, count=1, flags=re.M)
    return _LITERALS.sub(lambda m: f"{m.group(1)} ::= ({m.group(2)}) space", rules)


def _call_schemas(chosen: list[Tool], fmt: Format) -> dict:
    """The schema of a call of any of the chosen tools. A tool's own definitions (`$defs`, `definitions`: what
    pydantic writes, as the OpenAI SDK's `pydantic_function_tool` does) move to the root, each tool's under its
    own prefix: the converter resolves `#/$defs/...` from the root, which is now the call, not the tool."""
    defs: dict = {}
    calls = []
    for i, tool in enumerate(chosen):
        params, own = _lift_defs(tool.parameters or {"type": "object"}, f"tool{i}-")
        defs |= own
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, fmt.args_key: params},
                "required": ["name", fmt.args_key],
                "additionalProperties": False,
            }
        )
    one = {"anyOf": calls} if len(calls) > 1 else calls[0]
    return {**one, "$defs": defs} if defs else one


DEFS = ("definitions", "$defs")  # where a schema keeps its own definitions (the older name first)
LOCAL_DEFS = ("#/$defs/", "#/definitions/")


def _lift_defs(schema: dict, prefix: str) -> tuple[dict, dict]:
    """(the schema without its top-level definitions, those definitions renamed prefix + name), each local
    `$ref` to them renamed alike."""
    if not isinstance(schema, dict) or not any(isinstance(schema.get(k), dict) for k in DEFS):
        return schema, {}
    top = {k: v for k, v in schema.items() if k not in DEFS}
    found = {name: d for k in DEFS if isinstance(schema.get(k), dict) for name, d in schema[k].items()}
    return _renamed(top, prefix), _renamed({prefix + name: d for name, d in found.items()}, prefix)


def _renamed(value, prefix: str):
    """A copy of a JSON value with every local definition `$ref` renamed; walked on a list, not by recursion (a
    client's schema may be deep: the converter bounds that, after this)."""
    root: list = [None]
    stack = [(value, root, 0)]
    while stack:
        v, parent, key = stack.pop()
        if isinstance(v, dict):
            new: dict | list = dict.fromkeys(v)  # (the keys' order is the grammar's order of properties)
            for k, x in v.items():
                if k == "$ref" and isinstance(x, str) and x.startswith(LOCAL_DEFS):
                    new[k] = "#/$defs/" + prefix + x.split("/", 2)[2]
                else:
                    stack.append((x, new, k))
        elif isinstance(v, list):
            new = [None] * len(v)
            stack.extend((x, new, i) for i, x in enumerate(v))
        else:
            new = v
        parent[key] = new
    return root[0]


def new_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class Piece:
    """What the reader found: text of the content, a call's start (its name) or a fragment of its arguments."""

    kind: str  # "text" | "call" | "args"
    text: str = ""
    index: int = 0
    call: ToolCall | None = None  # for "call": its id and name (arguments empty)


@dataclass
class _Call:
    id: str
    name: str
    args: list[str] = field(default_factory=list)


_LOOK = 4096  # characters a step looks at where it waits for more: before an answer's first call, between calls
_HEADER = r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"KEY"\s*:\s*'


class Reader:
    """Content and calls out of an answer's text, piece by piece (`push`), then `end`. Text pieces joined are
    always the start of the answer's text: whitespace before a call is held, and the rest of an answer whose
    call fails to read follows as text."""

    def __init__(self, fmt: Format):
        self.fmt = fmt
        self.header = re.compile(_HEADER.replace("KEY", fmt.args_key))
        self._parts: list[str] = []  # the answer's text as pushed (`buf` joins it)
        self.rest = ""  # what is not yet read of it: each step looks at this, never at the whole (linear per answer)
        self.pos = 0  # what has been read of buf
        self.state = "text"  # text | header (after the marker) | args | after (a call's arguments) | failed
        self.calls: list[_Call] = []
        self.sent = 0  # characters of buf sent as content
        self._opening: int | bool | None = None  # whether the answer opens with a call's JSON (Format.opens)
        self._done = 0  # calls whose arguments are whole
        self._depth, self._in_str, self._esc, self._started = 0, False, False, False

    @property
    def buf(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def _read(self, n: int) -> None:
        self.pos += n
        self.rest = self.rest[n:]

    def push(self, text: str) -> list[Piece]:
        self._parts.append(text)
        self.rest += text
        out: list[Piece] = []
        while True:
            step = getattr(self, "_" + self.state)()
            if step is None:
                return out
            out += step

    def end(self) -> tuple[list[Piece], str, list[ToolCall]]:
        """The last pieces, then the whole answer: its content and its calls. An answer whose calls did not
        complete as JSON objects, or with text after them, is all content (and no calls); one cut mid-call
        after whole ones (max_tokens, a model that repeats its call) keeps the whole ones."""
        calls = [ToolCall(c.id, c.name, "".join(c.args)) for c in self.calls]
        rest = self.rest
        if self.state == "after" and self.fmt.tag and self.fmt.tag in rest:
            rest = rest[: rest.index(self.fmt.tag)]  # a next call opened, and the answer ended before its header
        if self.state in ("header", "args") and self._done:
            calls = calls[: self._done]  # the last one did not finish
        elif self.state != "after" or _junk(rest, self.fmt):
            calls = []
        if calls and all(_is_object(c.arguments) for c in calls):
            return [], self.buf[: self.sent], calls
        rest = self.buf[self.sent :]
        self.sent = len(self.buf)
        if self.calls:  # a stream has announced a call (cut by max_tokens): it is not sent again as text
            return [], self.buf, []
        return ([Piece("text", rest)] if rest else []), self.buf, []

    # --- states: each returns the pieces of one step, or None where it needs more text --------------------
    def _text(self) -> list[Piece] | None:
        rest = self.rest
        if not self.sent and self.pos == 0 and self._opening is not False:
            self._opening = self.fmt.opens(rest) if len(rest) <= _LOOK else False
            if self._opening is None:
                return None  # the answer may still open with a call's JSON: nothing is content yet
            if self._opening is not False:
                self.state = "header"
                return []
        hit = self.fmt.find(rest)
        if hit >= 0:
            self._read(hit + len(self.fmt.tag))
            self.state = "header"
            return self._send(rest[:hit].rstrip())
        keep = _held(rest, self.fmt.tag) if self.fmt.tag else 0
        text = rest[: len(rest) - keep]
        tail = text[-_LOOK:]  # whitespace before a call is not content: held until text follows (_LOOK of it)
        text = text[: len(text) - (len(tail) - len(tail.rstrip()))]
        self._read(len(text))
        return self._send(text) or None

    def _send(self, text: str) -> list[Piece]:
        self.sent += len(text)
        return [Piece("text", text)] if text else []

    def _header(self) -> list[Piece] | None:
        rest = self.rest
        m = self.header.search(rest)
        if m is None:
            if re.search(f'"{self.fmt.args_key}"\\s*:', rest) or len(rest) > (256 if self.state == "header" else _LOOK):
                self.state = "failed"  # the marker, then something other than a call (or too much between calls)
            return None
        if _junk(rest[: m.start()], self.fmt):
            self.state = "failed"
            return None
        try:
            name = json.loads('"' + m.group(1) + '"')
        except ValueError:
            self.state = "failed"
            return None
        call = _Call(new_id(), name)
        self.calls.append(call)
        self._read(m.end())
        self.state = "args"
        self._depth, self._in_str, self._esc, self._started = 0, False, False, False
        return [Piece("call", index=len(self.calls) - 1, call=ToolCall(call.id, name, ""))]

    def _args(self) -> list[Piece] | None:
        rest = self.rest
        if not rest:
            return None
        n, done = self._scan(rest)
        self._read(n)
        if done:
            self.state = "after"
            self._done = len(self.calls)
        fragment = rest[:n].lstrip() if not self.calls[-1].args else rest[:n]
        if not fragment:
            return [] if done else None
        self.calls[-1].args.append(fragment)
        return [Piece("args", fragment, index=len(self.calls) - 1)]

    _after = _header

    def _failed(self) -> None:
        return None

    def _scan(self, text: str) -> tuple[int, bool]:
        """How much of `text` belongs to the arguments' JSON value, and whether it ends there (string-aware
        bracket depth: the value is an object)."""
        for i, ch in enumerate(text):
            if not self._started:
                if ch in " \t\n\r":
                    continue
                self._started = True
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth <= 0:
                    return i + 1, True
            elif self._depth == 0:
                return i, True  # not an object: what was read is all (the JSON check at the end refuses it)
        return len(text), False


def _junk(gap: str, fmt: Format) -> bool:
    """Whether text between calls (or after the last) is more than their closing marks and separators."""
    for mark in ("</tool_call>", fmt.tag or "", "```json", "```"):
        if mark:
            gap = gap.replace(mark, "")
    gap = re.sub(r'"id"\s*:\s*"[^"]*"', "", gap)  # Mistral writes its own call ids after the arguments
    return bool(gap.strip(" \t\n\r[],;}"))


def _held(text: str, marker: str) -> int:
    """The length of text's longest end that begins `marker` (it may be the marker, once more arrives)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _is_object(text: str) -> bool:
    """Whether a call's arguments are one JSON object, within json_shape's bounds (a model told to copy a text
    can write arguments 1,000 deep: what reads them later recurses)."""
    if json_shape(text).problem():
        return False
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def read(fmt: Format, text: str) -> tuple[str, list[ToolCall]]:
    """A whole answer's content and calls."""
    reader = Reader(fmt)
    reader.push(text)
    _, content, calls = reader.end()
    return content, calls
