"""OpenAI's request and response shapes: a request body checked into a `Request`, and the bodies we send.

Only the dialect's parts that change what is generated are read; other known fields (user, n=1, ...) are
accepted and ignored as OpenAI's own server ignores what does not apply, and a field that would ask for
something we cannot do (n > 1, penalties, logprobs) is refused rather than silently dropped. The values
are checked by the run options' own rules (options.OPTIONS), named by the API's field names.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from .. import options
from ..backend import grammar
from ..errors import UsageError
from ..engine.stats import Stats

MAX_STOPS = 4  # OpenAI's limit on `stop` sequences
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}  # what generates (serve and batch)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# API field -> run option, for the fields that set one (the extra body fields keep specdec's names).
SETTINGS = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "temperature": "temp",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "drafter": "drafter",
    "draft_tokens": "draft_tokens",
}
UNSUPPORTED = {  # field: the value we can honour (anything else is refused)
    "n": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logprobs": False,
    "echo": False,
    "best_of": 1,
    "modalities": ["text"],
}


NOT_DONE = {  # fields whose request would change the answer's form, which we cannot honour: refused, not ignored
    "tools": "tool calls",
    "tool_choice": "tool calls",
    "functions": "function calls",
    "function_call": "function calls",
    "logit_bias": "logit biases",
    "suffix": "insertion (suffix)",
    "audio": "audio output",
    "prediction": "predicted outputs",
    "web_search_options": "web search",
    "top_logprobs": "log probabilities",
}
# OpenAI's fields that change nothing here (who asks, what the service stores or bills): accepted, ignored.
IGNORED = {
    "model",
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "parallel_tool_calls",
    "reasoning_effort",
    "verbosity",
}
# Every field a body may have; any other is refused as OpenAI refuses it (a typo such as `temprature`
# would otherwise run with the default, unnoticed).
READ = {"stream", "stream_options", "stop", "exact", "cache_prompt", "response_format"}
FIELDS = {
    kind: {prompt, *READ, *SETTINGS, *UNSUPPORTED, *NOT_DONE, *IGNORED}
    for kind, prompt in (("chat", "messages"), ("completion", "prompt"))
}


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


@dataclass
class Request:
    kind: str  # "chat" | "completion"
    model: str | None
    messages: list[tuple[str, str]] = field(default_factory=list)  # (role, text), chat
    prompt: str = ""  # completion
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: usage in a chunk of its own, as OpenAI does
    stop: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # run option -> value
    exact: bool | None = None
    cache_prompt: bool | None = None  # llama-server's name: start from what the caches hold of this prompt (None:
    # not said; serve does, a batch does not: its answers do not then depend on the request before them)
    template: bool | None = False  # a completion's prompt as it is; None: as `generate` reads it (a batch's
    # hand-written {"prompt"} line): in the chat template where the target has one and --chat says so

    @property
    def instruction(self) -> str:
        """What lookup reads for the names an edit will touch: the last user turn, or the prompt."""
        users = [text for role, text in self.messages if role == "user"]
        return users[-1] if users else self.prompt


def decode(raw: bytes | str) -> Any:
    """A request's JSON: an HTTP body (serve), a line of a batch file (batch)."""
    try:
        return json.loads(raw)
    except ValueError as e:  # not JSON, not UTF-8/16/32, or a number past Python's 4,300-digit limit
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply") from None


def parse(kind: str, body: Any) -> Request:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS[kind], key=str)
    if unknown:
        raise ApiError(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    model = _typed(body, "model", str)
    req = Request(kind, model)
    if kind == "chat":
        req.messages = _messages(body.get("messages"))
    else:
        req.prompt = _prompt(body.get("prompt"))
    req.stream = bool(_typed(body, "stream", bool))
    stream_options = _typed(body, "stream_options", dict) or {}
    req.include_usage = bool(_typed(stream_options, "include_usage", bool, "stream_options.include_usage"))
    req.stop = _stop(body.get("stop"))
    for name, allowed in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and value != allowed:
            raise ApiError(400, f"{name} = {value!r} is not supported (only {allowed!r})", param=name)
    for name, what in NOT_DONE.items():
        value = body.get(name)
        if value not in (None, [], {}) and not (name == "response_format" and value == {"type": "text"}):
            raise ApiError(400, f"{name} is not supported: this server does not do {what}", param=name)
    for name, key in SETTINGS.items():
        value = body.get(name)
        if value is None:
            continue
        if key == "draft_tokens":
            value = _draft_tokens(value)
        elif key == "drafter":
            value = _typed(body, name, str)
        else:
            value = _number(value, name, integer=options.BY_KEY[key].type is int)
        req.settings[key] = value
    if body.get("response_format") is not None:  # its own: "text" is unconstrained, whatever the server's default
        req.settings["gbnf"] = _response_format(body["response_format"])
    req.exact = _typed(body, "exact", bool)
    req.cache_prompt = _typed(body, "cache_prompt", bool)
    return req


def _response_format(value: Any) -> str | None:
    """OpenAI's response_format as a grammar (GBNF): text (none), json_object (any JSON object), or
    json_schema ({"json_schema": {"name", "schema", "strict"}}: that schema, by the converter --json-schema uses)."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return grammar.JSON_OBJECT
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(
                400, "response_format.json_schema.schema must be a JSON Schema object", param="response_format"
            )
        try:
            return grammar.from_schema(json.dumps(schema))
        except UsageError as e:
            raise ApiError(
                400, f"response_format: {e.message.removeprefix('--json-schema').lstrip(': ')}", param="response_format"
            ) from None
    raise ApiError(400, 'response_format.type must be "text", "json_object" or "json_schema"', param="response_format")


def api_name(key: str) -> str:
    """The request field that sets run option `key` (the first of SETTINGS that does)."""
    return next((name for name, option in SETTINGS.items() if option == key), key)


def _typed(body: dict, name: str, kind: type, shown: str | None = None) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        want = {str: "a string", bool: "true or false", dict: "an object"}[kind]
        raise ApiError(400, f"{shown or name} must be {want} (got {_json_type(value)})", param=shown or name)
    return value


def _number(value: Any, name: str, integer: bool) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"{name} must be a number (got {_json_type(value)})", param=name)
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise ApiError(400, f"{name} must be a whole number (got {value})", param=name)
        return int(value)
    return float(value)


def _draft_tokens(value: Any) -> int | None:
    """-k's one parser, for JSON's values: a number or "auto" (not a number written as a string)."""
    if value == "auto" or isinstance(value, int) and not isinstance(value, bool):
        return options.parse_draft_tokens(value)
    raise ApiError(400, f'draft_tokens must be a whole number or "auto" (got {value!r})', param="draft_tokens")


def _messages(value: Any) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object (got {_json_type(m)})", param=where)
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)} (got {role!r})", param=where)
        out.append((ROLES[role], _content(m.get("content"), f"{where}.content")))
    return out


def _text(value: str, where: str) -> str:
    """JSON may spell a lone UTF-16 surrogate (\\udc80), which is no text: the tokenizer could not take it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{where} is not valid Unicode text (a lone surrogate)", param=where) from None
    return value


def _content(value: Any, where: str) -> str:
    """A string, or a list of text parts (how newer clients send it); anything else is refused."""
    if isinstance(value, str):
        return _text(value, where)
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{where}: only text parts are supported", param=where)
            parts.append(part["text"])
        return _text("".join(parts), where)
    raise ApiError(400, f"{where} must be a string or a list of text parts (got {_json_type(value)})", param=where)


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise ApiError(400, f"prompt must be a string (got {_json_type(value)})", param="prompt")
    return _text(value, "prompt")


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise ApiError(400, f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them", param="stop")
    return [_text(stop, "stop") for stop in stops]


def _json_type(value: Any) -> str:
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


class StopText:
    """Cuts the text at the first stop sequence. Holds back the text that might still become one, so
    that a stream never sends a part of a stop sequence."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""  # not yet released
        self.hit = False

    def push(self, piece: str) -> str:
        """What may be released now."""
        self.text += piece
        cut = min((i for i in (self.text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.text, self.hit = self.text[:cut], "", True
            return out
        keep = len(self.text) - self.hold
        if keep <= 0:
            return ""
        out, self.text = self.text[:keep], self.text[keep:]
        return out

    def flush(self) -> str:
        out, self.text = self.text, ""
        return out


def finish_reason(stop_reason: str | None, hit_stop: bool) -> str:
    """OpenAI's: "stop" (end of turn, a stop sequence) or "length" (max_tokens or the context)."""
    return "stop" if hit_stop or stop_reason == "eos" else "length"


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def usage(stats: Stats, cached: int) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_cached": cached,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def completion(req: Request, rid: str, model: str, text: str, reason: str, stats: Stats, cached: int) -> dict:
    """The whole response of a request that did not stream."""
    if req.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": reason,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    return {
        "id": rid,
        "object": "chat.completion" if req.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(stats, cached),
        "speculative": stats.as_dict(),
    }


def chunk(
    req: Request,
    rid: str,
    model: str,
    text: str | None,
    reason: str | None = None,
    *,
    first: bool = False,
    extra: dict | None = None,
) -> dict:
    """One server-sent event of a stream. Chat: the first carries the role; the last, finish_reason
    (and, here, usage and the speculative statistics)."""
    if req.kind == "chat":
        delta: dict = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
    out = {
        "id": rid,
        "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    return {**out, **(extra or {})}
