"""Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens), what Claude Code speaks: a body
checked into the same Request OpenAI's chat completions make (its conversation: messages_turns.py), and the answer in
Anthropic's shapes.

As Anthropic's own server does, an unknown top-level field is refused ("Extra inputs are not permitted"): a typo
would otherwise run with the default, unnoticed. Fields that only concern Anthropic's service (metadata,
service_tier) or what we cannot show (extended thinking) are accepted and ignored; Anthropic's server-side tools
are left out with a warning, since a client such as Claude Code offers them alongside its own.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Iterator

from . import api, body, messages_turns
from .body import ApiError, number, text, typed
from .items import Args, Call, Finished, Scored, Text
from .request import Request
from .stream import Event, Shape

MAX_STOPS = 16  # Anthropic allows more than OpenAI's 4; each one is searched for after every token
SETTINGS = {"temperature": "temp", "top_p": "top_p", "top_k": "top_k"}  # API field -> run option
# Accepted and ignored, as they change nothing in the answer here: who asks and who pays (metadata.user_id,
# service_tier, billing_policy, inference_geo, speed, fallbacks), Anthropic's prompt-cache markers (our prefix
# cache needs none), extended thinking (a model without Claude's thinking blocks answers the same text without
# it), and context_management, which Claude Code sends to have old tool results cleared server-side: kept, the
# conversation is only longer (Anthropic's proxies that refuse it break Claude Code).
SERVICE = {"metadata", "service_tier", "billing_policy", "inference_geo", "speed", "fallbacks", "fallback_credit_token"}
HINTS = {"diagnostics", "cache_control", "thinking", "context_management", "container"}  # container: for server tools
IGNORED = SERVICE | HINTS
NOT_DONE = {  # fields that ask for something we cannot do: refused, not silently dropped
    "mcp_servers": "connections to MCP servers",
    "compaction": "server-side compaction",
    "thread": "server-held conversations",
}
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "output_config", "cache_salt", *IGNORED,
                *NOT_DONE}  # fmt: skip
FIELDS = {
    "messages": COUNT_FIELDS | {"max_tokens", "stop_sequences", "stream", *SETTINGS},
    "count_tokens": COUNT_FIELDS,
}
ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
ERRORS |= {413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
# Anthropic's keep-alive event (a stream's start, and a long prefill's every few seconds)
PING: Event = ("ping", {"type": "ping"})
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}  # Finished.reason -> stop_reason ("stop": below)


def parse(kind: str, body: Any) -> Request:
    """A Messages body (kind "messages") or a count_tokens body (the same without max_tokens and sampling)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS[kind], key=str)
    if unknown:
        raise ApiError(400, f"{unknown[0]}: Extra inputs are not permitted", param=unknown[0])
    for name, what in NOT_DONE.items():
        if body.get(name) not in (None, [], {}):
            raise ApiError(400, f"{name} is not supported: this server does not do {what}", param=name)
    req = Request("chat", typed(body, "model", str))
    system = messages_turns.system(body.get("system"))
    req.messages = system + messages_turns.messages(body.get("messages"))
    req.tools = messages_turns.tools(body.get("tools"), body.get("tool_choice"))
    req.cache_salt = api.cache_salt(body)
    gbnf = _output_format(body.get("output_config"))
    if kind == "count_tokens":
        return req
    if gbnf:
        if req.tools is not None and req.tools.choice != "none":
            raise ApiError(400, "output_config.format with tools is not supported", param="output_config")
        req.grammar = gbnf
    req.stream = bool(typed(body, "stream", bool))
    req.stop = _stops(body.get("stop_sequences"))
    req.settings["max_tokens"] = _max_tokens(body.get("max_tokens"))
    for name, key in SETTINGS.items():
        if body.get(name) is not None:
            req.settings[key] = number(body[name], name, integer=key == "top_k")
    return req


def _output_format(value: Any) -> str | None:
    """output_config: its format ({"type": "json_schema", "schema"}) as a grammar; its effort is Claude's own."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError(400, "output_config must be an object", param="output_config")
    fmt = value.get("format")
    if fmt is None:
        return None
    schema = fmt.get("schema") if isinstance(fmt, dict) and fmt.get("type") == "json_schema" else None
    if not isinstance(schema, dict):
        raise ApiError(
            400, 'output_config.format must be {"type": "json_schema", "schema": {...}}', param="output_config"
        )
    return body.schema_grammar(schema, "output_config.format")


def _max_tokens(value: Any) -> int:
    if value is None:
        raise ApiError(400, "max_tokens: Field required", param="max_tokens")
    n = number(value, "max_tokens", integer=True)
    if n < 1:
        raise ApiError(400, f"max_tokens must be at least 1 (got {n})", param="max_tokens")
    return n


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_STOPS or not all(isinstance(s, str) and s for s in value):
        raise ApiError(
            400, f"stop_sequences must be a list of at most {MAX_STOPS} non-empty strings", param="stop_sequences"
        )
    return [text(s, "stop_sequences") for s in value]


def new_id(kind: str) -> str:
    return "msg_" + secrets.token_hex(12)


def _tool_id(call_id: str) -> str:
    """Our call ids as Anthropic's (toolu_...); the same call gets the same id in a response and a stream."""
    return "toolu_" + call_id.removeprefix("call_")


def _stop(finished: Finished) -> tuple[str, str | None]:
    """stop_reason and stop_sequence (Finished says "stop" for both an end of turn and a stop sequence)."""
    if finished.reason != "stop":
        return STOP_REASONS.get(finished.reason, "end_turn"), None
    if finished.stop_sequence is None:
        return "end_turn", None
    return "stop_sequence", finished.stop_sequence


def _usage(finished: Finished) -> dict:
    s = finished.stats
    return {
        "input_tokens": s.prompt_tokens,
        "output_tokens": s.generated_tokens,
        "cache_read_input_tokens": finished.cached,
        "cache_creation_input_tokens": 0,
    }


def _input(arguments: str) -> dict:
    """A call's arguments as an object: the calls' grammar makes them one (the reader yields no other call)."""
    try:
        value = json.loads(arguments or "{}")
    except (ValueError, RecursionError):  # (the reader lets through only objects within json_shape's bounds)
        return {}
    return value if isinstance(value, dict) else {}


def _message(rid: str, model: str, content: list, stop: tuple[str | None, str | None], usage: dict) -> dict:
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage,
    }


def response(req: Request, rid: str, model: str, text: str, finished: Finished) -> dict:
    """The whole answer of a request that did not stream."""
    content: list[dict] = [{"type": "text", "text": text}] if text else []
    for c in finished.calls:
        content.append({"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": _input(c.arguments)})
    out = _message(rid, model, content, _stop(finished), _usage(finished))
    return {**out, "speculative": finished.stats.as_dict()}


def shape(req: Request, rid: str, model: str) -> Shape:
    return _Events(req, rid, model)


class _Events(Shape):
    """Anthropic's named events: message_start, each content block (start, deltas, stop), message_delta with
    stop_reason and usage, message_stop. The content blocks are numbered as they open; one is open at a time (text,
    or a tool_use whose input_json_delta fragments join to its arguments)."""

    def __init__(self, req: Request, rid: str, model: str):
        self.req, self.rid, self.model = req, rid, model
        self.index = -1
        self.open: str | None = None  # "text" | "tool_use"

    def start(self) -> Iterator[Event]:
        usage0 = {
            "input_tokens": self.req.prompt_tokens,
            "output_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        }
        message = _message(self.rid, self.model, [], (None, None), usage0)
        yield "message_start", {"type": "message_start", "message": message}
        yield PING

    def heartbeat(self) -> Iterator[Event]:
        """A ping, and an empty text delta (a text block opened for it where none is): Claude Code's SDK skips
        pings, and gives up on a stream whose content has been still for 300 s (it retries the request), and a long
        prompt's prefill takes longer. The answer's text follows in the same block; a call that follows gets the
        next index."""
        yield PING
        if self.open is None:
            yield from self._open({"type": "text", "text": ""})
        if self.open == "text":
            yield self._delta({"type": "text_delta", "text": ""})

    def text(self, piece: Text, probs: list[Scored]) -> Iterator[Event]:
        if not piece:
            return
        if self.open != "text":
            yield from self._open({"type": "text", "text": ""})
        yield self._delta({"type": "text_delta", "text": piece})

    def call(self, piece: Call) -> Iterator[Event]:
        yield from self._open({"type": "tool_use", "id": _tool_id(piece.call.id), "name": piece.call.name, "input": {}})

    def args(self, piece: Args) -> Iterator[Event]:
        if piece.text:
            yield self._delta({"type": "input_json_delta", "partial_json": piece.text})

    def end(self, finished: Finished) -> Iterator[Event]:
        yield from self._close()
        reason, sequence = _stop(finished)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        extra = {"speculative": finished.stats.as_dict()}
        yield "message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(finished), **extra}
        yield "message_stop", {"type": "message_stop"}

    def error(self, e: ApiError) -> Iterator[Event]:  # the server stopping mid-answer (or a bug)
        yield "error", error(e)

    def _open(self, block: dict) -> Iterator[Event]:
        yield from self._close()
        self.index += 1
        self.open = block["type"]
        yield "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}

    def _close(self) -> Iterator[Event]:
        if self.open is not None:
            self.open = None
            yield "content_block_stop", {"type": "content_block_stop", "index": self.index}

    def _delta(self, delta: dict) -> Event:
        return "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}


def error(e: ApiError) -> dict:
    """Anthropic's error body: {"type": "error", "error": {"type", "message"}}."""
    kind = ERRORS.get(e.status) or ("invalid_request_error" if e.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}
