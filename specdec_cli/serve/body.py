"""What every API's body is checked with: the error a refusal raises (an HTTP status and the message; each API
writes it in its own shape) and the checks of JSON values."""

from __future__ import annotations

import json
from typing import Any

from ..backend import grammar
from ..errors import UsageError
from ..chat.messages import MAX_DEPTH, json_shape


class ApiError(Exception):
    """A request we refuse: an HTTP status and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after = retry_after

    def body(self) -> dict:
        kind = {401: "authentication_error", 404: "not_found_error", 503: "server_error"}.get(self.status)
        kind = kind or ("invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def decode(raw: bytes | str) -> Any:
    """A request's JSON: an HTTP body (serve), a line of a batch file (batch). Its shape is checked before it is
    parsed (chat.messages.json_shape): depth, values and containers bounded, so that no body makes millions of
    objects."""
    problem = json_shape(raw).problem()
    if problem:
        raise ApiError(400, f"the body is {problem}")
    try:
        return json.loads(raw)
    except ValueError as e:  # not JSON, not UTF-8/16/32, or a number past Python's 4,300-digit limit
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
    except RecursionError:  # (a shape that was not JSON's, past the depth all the same)
        raise ApiError(400, f"the body is nested too deeply (arrays and objects: {MAX_DEPTH} levels at most)") from None


def quoted(text: str, limit: int = 120) -> str:
    """What a client wrote, for the server's log: as it is where it is a short printable line, else quoted (no raw
    control characters, no forged lines) and cut."""
    if text.isprintable() and len(text) <= limit:
        return text
    return repr(text[:limit]) + (f" (+{len(text) - limit:,} characters)" if len(text) > limit else "")


def typed(body: dict, name: str, kind: type, shown: str | None = None) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        want = {str: "a string", bool: "true or false", dict: "an object"}[kind]
        raise ApiError(400, f"{shown or name} must be {want} (got {json_type(value)})", param=shown or name)
    return value


def number(value: Any, name: str, integer: bool) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"{name} must be a number (got {json_type(value)})", param=name)
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise ApiError(400, f"{name} must be a whole number (got {value})", param=name)
        return int(value)
    return float(value)


def text(value: str, where: str) -> str:
    """JSON may spell a lone UTF-16 surrogate (\\udc80), which is no text: the tokenizer could not take it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{where} is not valid Unicode text (a lone surrogate)", param=where) from None
    return value


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def schema_refused(e: UsageError, param: str) -> ApiError:
    """A schema the converter refused, as a 400 that names the request's field (not the CLI's option)."""
    return ApiError(400, f"{param}: " + e.message.removeprefix("--json-schema").lstrip(": "), param=param)


def schema_grammar(schema: dict, param: str) -> str:
    """A request's JSON schema as GBNF, or a 400 naming `param`: parsed now, as --json-schema is, so that what
    llama.cpp cannot take (grammar.bounded) or no value satisfies is refused before a stream's first line."""
    try:
        gbnf = grammar.from_schema(json.dumps(schema))
        grammar.check(gbnf, schema=True)
        return gbnf
    except UsageError as e:
        raise schema_refused(e, param) from None
