"""A model's Jinja chat template, rendered in Hugging Face's sandbox, in a child process of its own.

The template is code from the model's file and its context is what HTTP clients sent: it runs here, in a child
Python that isolation.py starts, where the bounds hold whatever it runs (a C call that sorts or joins millions of
items, a string doubled past the machine's memory): the address space is MEMORY_BYTES past what the interpreter
mapped at start, and the parent kills the child at its deadline. This module imports only the standard library
and jinja2, so that the child starts in tens of milliseconds; it never imports the rest of specdec.

Cheap checks inside give a clear error before those bounds are reached: one operation's string at most
VALUE_CHARS, the output at most the caller's max_bytes.

Requests and replies are frames on the child's stdin and stdout: FRAME (the length), then that many bytes of JSON,
ASCII only (a lone surrogate in a message survives). A request is {"source", "context", "max_bytes", "seconds"};
a reply {"text"} or {"error": "TypeName: message"}. The child's first frame ({}) says it is ready.
"""

from __future__ import annotations

import json
import re
import signal
import struct
import sys
from datetime import datetime
from typing import IO, Any, Callable

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

VALUE_CHARS = 2**24  # the longest string one operation in a template may make ('x' * n, center(n), replace)
MEMORY_BYTES = 2**31  # the child's address space past its start: real templates take a few MB, tools and all
ORPHAN_SECONDS = 1.0  # past a request's own seconds the child ends itself: its parent is gone, or stuck
FRAME = struct.Struct(">Q")  # a frame's length in bytes, before its JSON
_MESSAGE_CHARS = 500  # an error's text at most: it goes to the server's log, and a template chooses its length


class TemplateError(Exception):
    """The model's template would not render this conversation (its own raise_exception, a sandbox refusal)."""


def render(source: str, context: dict, max_bytes: int) -> str:
    """The template's text: more than max_bytes (characters: never more than its bytes) is a TemplateError."""
    out, size = [], 0
    for piece in _compiled(source).generate(**context):
        size += len(piece)
        if size > max_bytes:
            raise TemplateError(f"it writes more than {max_bytes:,} bytes, more than the context can hold")
        out.append(piece)
    return "".join(out)


_COMPILED: dict[str, jinja2.Template] = {}


def _compiled(source: str) -> jinja2.Template:
    """The template compiled once per child (milliseconds each time otherwise), in Hugging Face's environment:
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
        template = _COMPILED[source] = env.from_string(source)
    return template


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise TemplateError(str(message))


_FORMAT_WIDTH = re.compile(r"[%:{][^a-zA-Z%}]*?(?:\d{8,}|\*)")  # a width or precision of 8+ digits, or one given
_WIDE_FILTERS = ("center", "indent", "wordwrap", "truncate", "format", "replace")
_WIDE_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs", "replace", "format", "format_map"}


def _check_size(name: str, obj: Any, args: tuple, kwargs: dict) -> None:
    """Refuse an operation whose string would pass VALUE_CHARS, before it is made (one C call: it would run to
    the deadline or the memory bound, and end as an error that says less)."""
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


# --- the child: one request at a time, until its parent closes stdin ---------------------------------------------
def main() -> None:
    _limit_memory()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the whole group: the parent decides
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the alarm ends the process, even inside one long C call
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    _write_frame(stdout, b"{}")
    while (body := _read_frame(stdin)) is not None:
        _write_frame(stdout, _answer(body))
        signal.setitimer(signal.ITIMER_REAL, 0)


def _answer(body: bytes) -> bytes:
    """The reply to one request, as a frame's JSON; every failure is an error reply (MemoryError too: what the
    rendering took is free again once it is answered, and the child goes on)."""
    try:
        request = json.loads(body)
        signal.setitimer(signal.ITIMER_REAL, request["seconds"] + ORPHAN_SECONDS)
        reply = {"text": render(request["source"], request["context"], request["max_bytes"])}
    except Exception as e:
        reply = {"error": _described(e)}
    try:
        return json.dumps(reply).encode("ascii")
    except MemoryError:  # the text was made, but not its JSON (six bytes a character at most)
        return json.dumps({"error": _described(MemoryError())}).encode("ascii")


def _described(e: Exception) -> str:
    if isinstance(e, TemplateError):
        text = str(e)
    elif isinstance(e, MemoryError):
        text = f"MemoryError: it takes more than the renderer's {MEMORY_BYTES / 2**30:g} GiB"
    else:
        text = f"{type(e).__name__}: {e}"
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def _limit_memory() -> None:
    """RLIMIT_AS: past it an allocation fails (MemoryError) instead of taking the machine's memory. Where it cannot
    be set (macOS refuses or ignores RLIMIT_AS; Windows has no resource module) the child runs without it: the
    parent's deadline still bounds its time, and so how much it can take."""
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = _mapped() + MEMORY_BYTES
        bound = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_AS, (bound, bound))
    except (ImportError, ValueError, OSError):
        pass


def _mapped() -> int:
    """The bytes the interpreter and its libraries have mapped (Linux's VmSize); 0 where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _read_frame(stream: IO[bytes]) -> bytes | None:
    """One frame's JSON from a blocking stream; None where it ends (the other side closed it)."""
    head = stream.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (size,) = FRAME.unpack(head)
    body = stream.read(size)
    return body if len(body) == size else None


def _write_frame(stream: IO[bytes], body: bytes) -> None:
    stream.write(FRAME.pack(len(body)) + body)
    stream.flush()


if __name__ == "__main__":
    main()
