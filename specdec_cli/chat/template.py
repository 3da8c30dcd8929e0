"""A conversation as the prompt text the model was trained on.

Two renderers: llama.cpp's built-in one (`llama_chat_apply_template`: a fixed list of known formats, plain text
turns only) and the model's own Jinja template (`tokenizer.chat_template`), rendered in a sandbox as Hugging
Face does. Plain chats go through the built-in renderer wherever it knows the template, so that their prompts
(and answers) are what they always were: the Jinja templates of Qwen2.5 and SmolLM2 add a default system
prompt the built-in one does not. Tools, tool calls and tool results need the template's own markup: the Jinja
template renders them. A template that cannot (it never mentions `tools`, or fails to render) gets them written
as text in the Hermes format (`<tool_call>`, `<tool_response>`), which the built-in renderer can carry.

A template is code from the model's file: whatever it raises (its raise_exception, a sandbox refusal, a division
by zero, a range too big, memory) is a TemplateError, and so is a rendering that runs past RENDER_SECONDS or writes
more than the prompt could hold (the caller's max_bytes), or one value past VALUE_CHARS: the same fallback.
"""

from __future__ import annotations

import json
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .. import ui
from . import limits
from .messages import Message, Tools

RENDER_SECONDS = 1.0  # a template's whole rendering: real ones take milliseconds, tools and all
RENDER_BYTES = 2**26  # a rendering's text where the caller names no bound (the server's is the context's: session.py)
VALUE_CHARS = 2**24  # the longest string one operation in a template may make ('x' * n, center(n), replace)
_CHECK_EVERY = 256  # template lines between two looks at the clock

HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>{tools}\n</tools>\n\nFor each function call, "
    "return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


class TemplateError(Exception):
    """The model's template would not render this conversation (its own raise_exception, a sandbox refusal)."""


@dataclass(frozen=True)
class Template:
    source: str | None  # the GGUF's tokenizer.chat_template
    builtin: Callable[[list[tuple[str, str]]], str | None]  # llama.cpp's renderer; None: it does not know it
    bos: str = ""  # the special tokens' texts, as templates name them
    eos: str = ""
    name: str = "the model"

    @property
    def knows_tools(self) -> bool:
        return self.source is not None and "tools" in self.source

    def render(self, messages: list[Message], tools: Tools | None = None, max_bytes: int = RENDER_BYTES) -> str:
        """The prompt text, ready for the assistant's answer; a Jinja rendering past max_bytes is a failure (the
        fallback's text is the caller's to measure)."""
        shown = tools.shown if tools is not None else ()
        if not shown and all(m.plain for m in messages):
            text = self.builtin([(m.role, m.content) for m in messages])
            if text is not None:
                return text
        why = ""
        if self.source is not None and (self.knows_tools or not shown):
            try:
                return self._jinja(messages, shown, max_bytes)
            except TemplateError as e:
                why = f" ({e})"
                _warn_once(f"{self.name}: its chat template did not render{why}; writing the chat in a plain form")
        lowered = as_text(messages, shown)
        text = self.builtin([(m.role, m.content) for m in lowered])
        if text is None:
            raise TemplateError(f"{self.name}'s chat template is not one llama.cpp knows, and it did not render{why}")
        return text

    def _jinja(self, messages: list[Message], tools, max_bytes: int) -> str:
        context: dict[str, Any] = {
            "messages": [_message(m) for m in messages],
            "add_generation_prompt": True,
            "bos_token": self.bos,
            "eos_token": self.eos,
        }
        if tools:
            context["tools"] = [t.for_template() for t in tools]
        try:
            text = _bounded(_compiled(self.source), context, max_bytes)
        except (TemplateError, limits.Cancelled):
            raise
        except Exception as e:  # jinja2's (the sandbox's SecurityError), Python's (ZeroDivisionError, MemoryError...)
            raise TemplateError(f"{type(e).__name__}: {e}") from None
        # The tokenizer adds BOS itself (as for the built-in renderer's text): a template's own would be a second.
        return text[len(self.bos) :] if self.bos and text.startswith(self.bos) else text


def as_text(messages: list[Message], tools) -> list[Message]:
    """The conversation in plain text turns, tools in the Hermes format: for a template without tool markup."""
    out = list(messages)
    if tools:
        listed = "".join("\n" + json.dumps(t.for_template(), ensure_ascii=False) for t in tools)
        block = HERMES_SYSTEM.format(tools=listed)
        if out and out[0].role == "system":
            out[0] = Message("system", out[0].content + "\n\n" + block)
        else:
            out.insert(0, Message("system", block))
    lowered: list[Message] = []
    for m in out:
        if m.tool_calls:
            calls = "".join(
                "\n<tool_call>\n"
                + json.dumps({"name": c.name, "arguments": c.for_template()["function"]["arguments"]})
                + "\n</tool_call>"
                for c in m.tool_calls
            )
            lowered.append(Message("assistant", (m.content + calls).lstrip("\n")))
        elif m.role == "tool":
            result = f"<tool_response>\n{m.content}\n</tool_response>"
            if lowered and lowered[-1].role == "user" and lowered[-1].content.startswith("<tool_response>"):
                lowered[-1] = Message("user", lowered[-1].content + "\n" + result)
            else:
                lowered.append(Message("user", result))
        else:
            lowered.append(m)
    return lowered


def _message(m: Message) -> dict:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [c.for_template() for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


_COMPILED: dict[str, jinja2.Template] = {}
_WARNED: set[str] = set()


def _compiled(source: str) -> jinja2.Template:
    """The template compiled once per process (milliseconds each time otherwise), in Hugging Face's environment:
    sandboxed (no attribute of Python's own objects, no mutation of what it is given), trimmed blocks, loop
    controls, its tojson (not Jinja's HTML-escaping one), raise_exception and strftime_now."""
    template = _COMPILED.get(source)
    if template is None:
        env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols], autoescape=False)
        env.filters |= {name: _sized(name, env.filters[name]) for name in _WIDE_FILTERS}
        env.globals.pop("lipsum", None)  # paragraphs of lorem ipsum, as many as asked
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)
        try:
            template = _COMPILED[source] = env.from_string(source)
        except Exception as e:  # a syntax error; a nesting too deep for the compiler (RecursionError)
            raise TemplateError(f"{type(e).__name__}: {e}") from None
    return template


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise TemplateError(str(message))


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        ui.warning(message)


def _bounded(template: jinja2.Template, context: dict, max_bytes: int) -> str:
    """The template's text, piece by piece: more than max_bytes, or a rendering past RENDER_SECONDS (its lines are
    counted: a loop that writes nothing is still seen), is a TemplateError; a stopping server, Cancelled."""
    deadline, out, size = time.monotonic() + RENDER_SECONDS, [], 0
    with _watched(deadline):
        for piece in template.generate(**context):
            size += len(piece)  # characters: never more than its bytes
            if size > max_bytes:
                raise TemplateError(f"it writes more than {max_bytes:,} bytes, more than the context can hold")
            out.append(piece)
    return "".join(out)


@contextmanager
def _watched(deadline: float):
    """Every _CHECK_EVERY lines of the template's own code (its compiled Python) on this thread: the clock and the
    server's stop. A trace function's exception is raised in the traced frame (and ends the tracing)."""
    count = [0]

    def line(frame, event, arg):
        count[0] += 1
        if count[0] % _CHECK_EVERY == 0:
            if time.monotonic() > deadline:
                raise TemplateError(f"it renders for more than {RENDER_SECONDS:g} s")
            limits.check_stop()
        return line

    def call(frame, event, arg):
        return line if frame.f_code.co_filename == "<template>" else None

    before = sys.gettrace()
    sys.settrace(call)
    try:
        yield
    finally:
        sys.settrace(before)


_FORMAT_WIDTH = re.compile(r"[%:{][^a-zA-Z%}]*?(?:\d{8,}|\*)")  # a width or precision of 8+ digits, or one given
_WIDE_FILTERS = ("center", "indent", "wordwrap", "truncate", "format", "replace")
_WIDE_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs", "replace", "format", "format_map"}


def _check_size(name: str, obj: Any, args: tuple, kwargs: dict) -> None:
    """Refuse an operation whose string would pass VALUE_CHARS, before it is made (it is one C call: no line of
    the template runs meanwhile, and its memory is taken at once)."""
    values = [*args, *kwargs.values()]
    if name == "replace" and isinstance(obj, str) and len(values) >= 2:
        old, new = str(values[0]), str(values[1])
        n = len(obj) + 1 if not old else obj.count(old)
        big = len(obj) + n * len(new) > VALUE_CHARS
    elif name in ("format", "format_map") and isinstance(obj, str):
        big = _FORMAT_WIDTH.search(obj) is not None
    elif name == "expandtabs" and isinstance(obj, str):
        big = any(isinstance(v, int) and v * obj.count("\t") > VALUE_CHARS for v in values)
    else:
        big = any(isinstance(v, int) and abs(v) > VALUE_CHARS for v in values)
    if big:
        raise TemplateError(f"its {name} would make a string longer than {VALUE_CHARS:,} characters")


def _sized(name: str, fn: Callable) -> Callable:
    def filter_(value, *args, **kwargs):
        _check_size(name, value, args, kwargs)
        return fn(value, *args, **kwargs)

    return filter_


class _Sandbox(ImmutableSandboxedEnvironment):
    """Hugging Face's sandbox, with the operations that make one huge value in one step bounded."""

    intercepted_binops = frozenset(["*", "**", "%"])

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*" and isinstance(right, (str, list, tuple)):
            left, right = right, left
        if operator == "*" and isinstance(left, (str, list, tuple)) and isinstance(right, int):
            if len(left) * right > VALUE_CHARS:
                raise TemplateError(f"it repeats a value to more than {VALUE_CHARS:,} items")
        elif (
            operator == "**" and isinstance(left, int) and isinstance(right, int) and left.bit_length() * right > 2**16
        ):
            raise TemplateError(f"it raises a number to the power {right}")  # (a float overflows by itself)
        elif operator == "%" and isinstance(left, str):
            _check_size("format", left, (), {})
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's own names)
        name = getattr(__obj, "__name__", "")
        if name in _WIDE_METHODS and isinstance(getattr(__obj, "__self__", None), str):
            _check_size(name, __obj.__self__, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)
