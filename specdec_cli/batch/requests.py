"""A batch file's requests: OpenAI's Batch API lines, or hand-written ones, each checked into a Line.

One JSON object a line, as OpenAI's Batch API takes them:
    {"custom_id": "t-1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
or hand-written, the body itself (with an optional custom_id): {"messages": [...]} as a chat, or {"prompt": ...}
read as `specdec generate PROMPT` reads it (in the chat template where the target has one).
A body is checked by serve's own parser (serve/api.py), so a line is refused with the message serve gives
its request; such a line becomes that line's error result and the batch goes on. What cannot go on is a
custom_id used twice (which result would be whose?): refused before any model loads.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecdecError, UsageError
from ..inputs import read_text
from ..serve import api

MAX_BYTES = 256 << 20  # OpenAI's own limit on a batch file is 200 MB
ENVELOPE = ("custom_id", "method", "url", "body")  # an OpenAI batch line's fields
LABELS = ("custom_id", "category")  # a hand-written line's besides its body (bench's prompt files have categories)


@dataclass(frozen=True)
class Line:
    """One request of the file: its line number, custom_id, and the checked request or why it was refused."""

    number: int
    custom_id: str
    request: api.Request | None
    error: api.ApiError | None = None


def read(path: Path) -> list[Line]:
    """Every request of the file, in order (blank lines skipped). UsageError for a file that cannot be a
    batch (not a file, not UTF-8 text, a custom_id used twice)."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise UsageError(f"REQUESTS: cannot read {path}: {e.strerror or e}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):  # a FIFO too: --requests <(make-requests)
        raise UsageError(f"REQUESTS: {path} is not a file")
    try:
        with path.open("rb") as f:
            text = read_text(f, f"REQUESTS {path}", MAX_BYTES)
    except OSError as e:
        raise SpecdecError(f"cannot read {path}: {e.strerror or e}") from None
    lines = [parse_line(n, raw) for n, raw in enumerate(text.splitlines(), 1) if raw.strip()]
    first: dict[str, int] = {}
    for line in lines:
        if line.custom_id in first:
            raise UsageError(
                f"{path}:{line.number}: custom_id {line.custom_id!r} is used again (first on line "
                f"{first[line.custom_id]})",
                hint="every request needs its own custom_id: results are matched, and resumed, by it",
            )
        first[line.custom_id] = line.number
    if not lines:
        raise UsageError(f"REQUESTS: {path} holds no requests")
    return lines


def parse_line(number: int, raw: str) -> Line:
    """One line: its custom_id (given, else `line-N`) and its request, or the error serve would answer."""
    custom_id = f"line-{number}"
    try:
        obj = api.decode(raw)
        if not isinstance(obj, dict):
            raise api.ApiError(400, "a request line must be a JSON object")
        given = obj.get("custom_id")
        if given is not None:
            if not isinstance(given, str) or not given:
                raise api.ApiError(400, "custom_id must be a non-empty string", param="custom_id")
            custom_id = given
        kind, body = _envelope(obj)
        request = api.parse("completion" if kind == "prompt" else kind, body)
    except api.ApiError as e:
        return Line(number, custom_id, None, e)
    if kind == "prompt":
        request.template = None  # as `specdec generate PROMPT` reads it: the chat template where there is one
    if request.cache_prompt is None:  # each answer as a cold run gives it, whatever ran before (or a resume)
        request.cache_prompt = False
    return Line(number, custom_id, request)


def _envelope(obj: dict) -> tuple[str, object]:
    """(endpoint kind, body) of an OpenAI batch line, or of a hand-written one (the line is the body)."""
    if not {"method", "url", "body"} & set(obj):
        body = {k: v for k, v in obj.items() if k not in LABELS}
        if ("messages" in body) == ("prompt" in body):
            raise api.ApiError(
                400,
                'a request line needs "messages" or "prompt", or OpenAI\'s batch form '
                '{"custom_id", "method", "url", "body"}',
            )
        return ("chat" if "messages" in body else "prompt"), body
    unknown = sorted(set(obj) - set(ENVELOPE), key=str)
    if unknown:
        raise api.ApiError(
            400, f"unknown field {unknown[0]!r} in a batch line (it has {', '.join(ENVELOPE)})", param=unknown[0]
        )
    method, url = obj.get("method", "POST"), obj.get("url")
    if method != "POST":
        raise api.ApiError(405, f"method must be POST (got {method!r})", param="method")
    if url not in api.ENDPOINTS:
        raise api.ApiError(
            404,
            f"no such endpoint: {url!r} (a batch runs {', '.join(api.ENDPOINTS)})",
            param="url",
            code="unknown_url",
        )
    return api.ENDPOINTS[url], obj.get("body")
