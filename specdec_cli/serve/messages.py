"""Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens), what Claude Code speaks: a body
checked into the same `api.Request` OpenAI's chat completions make, and the answer in Anthropic's shapes.

As Anthropic's own server does, an unknown top-level field is refused ("Extra inputs are not permitted"): a typo
would otherwise run with the default, unnoticed. Fields that only concern Anthropic's service (metadata,
service_tier) or what we cannot show (extended thinking) are accepted and ignored; Anthropic's server-side tools
are left out with a warning, since a client such as Claude Code offers them alongside its own.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Iterator

from .. import ui
from ..chat import Message, ToolCall, Tools
from . import api, body, chat
from .body import STARTED, WAITING, ApiError, json_type, number, text, typed

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
PING = (
    "ping",
    {"type": "ping"},
)  # Anthropic's keep-alive event (a stream's start, and a long prefill's every few seconds)
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}  # Finished.reason -> stop_reason ("stop": below)


def parse(kind: str, body: Any) -> api.Request:
    """A Messages body (kind "messages") or a count_tokens body (the same without max_tokens and sampling)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS[kind], key=str)
    if unknown:
        raise ApiError(400, f"{unknown[0]}: Extra inputs are not permitted", param=unknown[0])
    for name, what in NOT_DONE.items():
        if body.get(name) not in (None, [], {}):
            raise ApiError(400, f"{name} is not supported: this server does not do {what}", param=name)
    req = api.Request("chat", typed(body, "model", str))
    system = _system(body.get("system"))
    req.messages = system + _messages(body.get("messages"))
    req.tools = _tools(body.get("tools"), body.get("tool_choice"))
    req.cache_salt = api.cache_salt(body)
    gbnf = _output_format(body.get("output_config"))
    if kind == "count_tokens":
        return req
    if gbnf:
        if req.tools is not None and req.tools.choice != "none":
            raise ApiError(400, "output_config.format with tools is not supported", param="output_config")
        req.settings["gbnf"] = gbnf
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


def _system(value: Any) -> list[Message]:
    """A string or text blocks (Claude Code sends blocks with cache_control: our prefix cache needs no hint)."""
    content = "" if value is None else _texts(value, "system")
    return [Message("system", content)] if content else []


def _texts(value: Any, where: str) -> str:
    """A string or a list of text blocks, joined (what system and a tool_result's content hold)."""
    if isinstance(value, str):
        return text(value, where)
    if not isinstance(value, list):
        raise ApiError(400, f"{where} must be a string or a list of text blocks (got {json_type(value)})", param=where)
    out = []
    for i, block in enumerate(value):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in ("image", "document"):
            raise ApiError(400, f"{where}[{i}]: only text is supported (not {kind})", param=where)
        if kind != "text" or not isinstance(block.get("text"), str):
            raise ApiError(400, f'{where}[{i}] must be {{"type": "text", "text": ...}}', param=where)
        out.append(block["text"])
    return text("\n".join(out), where)


def _messages(value: Any) -> list[Message]:
    """Anthropic's turns as the template's messages. Consecutive turns of one role are not merged: the
    template writes them as they come, as Anthropic's server would read them merged."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    out: list[Message] = []
    names: dict[str, str] = {}  # tool_use id -> name, for the results that answer them (templates may show it)
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        # "system" turns mid-conversation: Claude Code (2.1) sends its reminders so, and Anthropic's API takes them
        if role not in ("user", "assistant", "system"):
            raise ApiError(400, f'{where} must be {{"role": "user" | "assistant", "content": ...}}', param=where)
        if role == "system" and i == 0:
            raise ApiError(
                400,
                f"{where}: the conversation opens with a user turn; the system prompt goes in `system`",
                param=where,
            )
        content = m.get("content")
        if isinstance(content, str):
            out.append(Message(role, text(content, f"{where}.content")))
            continue
        if not isinstance(content, list):
            raise ApiError(
                400, f"{where}.content must be a string or a list of blocks (got {json_type(content)})", param=where
            )
        out.extend(_blocks(role, content, f"{where}.content", names))
    return out


def _blocks(role: str, blocks: list, where: str, names: dict[str, str]) -> list[Message]:
    """One turn's blocks: an assistant's text and tool_use; a user's tool_results (as tool messages, first,
    as the templates expect them to follow the calls) then its text."""
    texts, calls, results = [], [], []
    for i, block in enumerate(blocks):
        at = f"{where}[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(text(block["text"], at))
        elif kind in ("thinking", "redacted_thinking"):
            continue  # Claude's own reasoning, signed for Claude: nothing another model should read
        elif kind in ("image", "document"):
            raise ApiError(400, f"{at}: only text is supported (not {kind})", param=at)
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, at))
            names[calls[-1].id] = calls[-1].name
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, at, names))
        else:
            raise ApiError(400, f"{at}: a {role} turn cannot hold a block of type {kind!r}", param=at)
    content = "\n".join(texts)
    if role == "system":
        return [Message("system", content)]
    if role == "assistant":
        return [Message("assistant", content, tuple(calls))]
    return results + ([Message("user", content)] if content or not results else [])


def _tool_use(block: dict, at: str) -> ToolCall:
    ident, name, args = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(ident, str) or not ident or not isinstance(name, str) or not name:
        raise ApiError(400, f"{at}: a tool_use needs its id and name", param=at)
    if not isinstance(args, dict):
        raise ApiError(400, f"{at}.input must be an object (got {json_type(args)})", param=at)
    return ToolCall(ident, name, text(json.dumps(args, ensure_ascii=False), at))


def _tool_result(block: dict, at: str, names: dict[str, str]) -> Message:
    ident = block.get("tool_use_id")
    if not isinstance(ident, str) or not ident:
        raise ApiError(400, f"{at}: a tool_result needs its tool_use_id", param=at)
    content = block.get("content")
    body = "" if content is None else _texts(content, f"{at}.content")
    if block.get("is_error") is True:  # the model should know the call failed, not read it as the tool's answer
        body = "Error: " + body
    return Message("tool", body, tool_call_id=ident, name=names.get(ident))


def _tools(value: Any, choice: Any) -> Tools | None:
    """Client tools ({name, description, input_schema}); server tools (a type such as web_search_20250305) are
    Anthropic's to run, not ours: left out, with one warning line."""
    if value is not None and not isinstance(value, list):
        raise ApiError(400, "tools must be a list of tool declarations", param="tools")
    declared, skipped = [], []
    for i, t in enumerate(value or []):
        if not isinstance(t, dict):
            raise ApiError(400, f"tools[{i}] must be {{name, description, input_schema}}", param="tools")
        if t.get("type") not in (None, "custom"):
            skipped.append(str(t.get("name") or t.get("type")))
            continue
        if not isinstance(t.get("input_schema"), dict):
            raise ApiError(400, f"tools[{i}].input_schema must be a JSON Schema object", param="tools")
        declared.append(chat.tool(t.get("name"), t.get("description"), t["input_schema"], f"tools[{i}]"))
    if skipped:
        ui.warning(f"messages: left out Anthropic's server tools, which this server cannot run: {', '.join(skipped)}")
    picked, parallel = _choice(choice)
    if not declared:
        if picked not in ("auto", "none"):
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        return None
    name = chat.choice_of(picked, declared) if isinstance(picked, dict) else picked
    return Tools(chat.check_names(declared), name, parallel)


def _choice(value: Any) -> tuple[Any, bool]:
    """Anthropic's tool_choice as OpenAI's (a named tool as {"name"}, for chat.choice_of) and parallel calls."""
    if value is None:
        return "auto", True
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise ApiError(400, 'tool_choice.type must be "auto", "any", "tool" or "none"', param="tool_choice")
    serial = value.get("disable_parallel_tool_use")
    if serial is not None and not isinstance(serial, bool):
        raise ApiError(400, "tool_choice.disable_parallel_tool_use must be true or false", param="tool_choice")
    picked = {"any": "required", "tool": {"name": value.get("name")}}.get(kind, kind)
    return picked, not serial


def new_id(kind: str) -> str:
    return "msg_" + secrets.token_hex(12)


def _tool_id(call_id: str) -> str:
    """Our call ids as Anthropic's (toolu_...); the same call gets the same id in a response and a stream."""
    return "toolu_" + call_id.removeprefix("call_")


def _stop(req: api.Request, finished) -> tuple[str, str | None]:
    """stop_reason and stop_sequence (Finished says "stop" for both an end of turn and a stop sequence)."""
    if finished.reason != "stop":
        return STOP_REASONS.get(finished.reason, "end_turn"), None
    if finished.stop_sequence is None:
        return "end_turn", None
    return "stop_sequence", finished.stop_sequence


def _usage(finished) -> dict:
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


def response(req: api.Request, rid: str, model: str, text: str, finished) -> dict:
    """The whole answer of a request that did not stream (`finished`: service.Finished)."""
    content: list[dict] = [{"type": "text", "text": text}] if text else []
    for c in finished.calls:
        content.append({"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": _input(c.arguments)})
    out = _message(rid, model, content, _stop(req, finished), _usage(finished))
    return {**out, "speculative": finished.stats.as_dict()}


def stream(req: api.Request, rid: str, model: str, items) -> Iterator[tuple[str, dict]]:
    """Anthropic's named events: message_start, each content block (start, deltas, stop), message_delta with
    stop_reason and usage, message_stop."""
    usage0 = {
        "input_tokens": req.prompt_tokens,
        "output_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    yield "message_start", {"type": "message_start", "message": _message(rid, model, [], (None, None), usage0)}
    yield PING
    blocks = _Blocks()
    finished = None
    try:
        for item in items:
            if item is WAITING:  # a long prefill: Claude Code's SDK skips pings, and its watchdog counts content
                yield PING
                yield from blocks.heartbeat()
            elif item is STARTED:
                continue
            elif isinstance(item, str):
                yield from blocks.text(item)
            elif hasattr(item, "stats"):
                finished = item
            else:
                yield from blocks.piece(item)
    except ApiError as e:  # the server stopping mid-answer
        yield "error", error(e)
        return
    except Exception as e:  # a bug, after the headers
        ui.error(f"messages stream: unexpected {type(e).__name__}: {e}")
        yield "error", error(ApiError(500, f"internal error: {type(e).__name__}"))
        return
    if finished is None:  # the client left
        return
    yield from blocks.close()
    reason, sequence = _stop(req, finished)
    delta = {"stop_reason": reason, "stop_sequence": sequence}
    extra = {"speculative": finished.stats.as_dict()}
    yield "message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(finished), **extra}
    yield "message_stop", {"type": "message_stop"}


class _Blocks:
    """The content blocks of a stream, numbered as they open: one is open at a time (text, or a tool_use whose
    input_json_delta fragments join to its arguments)."""

    def __init__(self):
        self.index = -1
        self.open: str | None = None  # "text" | "tool_use"

    def _start(self, block: dict) -> Iterator[tuple[str, dict]]:
        yield from self.close()
        self.index += 1
        self.open = block["type"]
        yield "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}

    def close(self) -> Iterator[tuple[str, dict]]:
        if self.open is not None:
            self.open = None
            yield "content_block_stop", {"type": "content_block_stop", "index": self.index}

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}

    def text(self, piece: str) -> Iterator[tuple[str, dict]]:
        if not piece:
            return
        if self.open != "text":
            yield from self._start({"type": "text", "text": ""})
        yield self._delta({"type": "text_delta", "text": piece})

    def heartbeat(self) -> Iterator[tuple[str, dict]]:
        """An empty text delta (a text block opened for it where none is): Claude Code gives up on a stream whose
        content has been still for 300 s (it retries the request), and a long prompt's prefill takes longer. The
        answer's text follows in the same block; a call that follows gets the next index."""
        if self.open is None:
            yield from self._start({"type": "text", "text": ""})
        if self.open == "text":
            yield self._delta({"type": "text_delta", "text": ""})

    def piece(self, p) -> Iterator[tuple[str, dict]]:
        """A calls.Piece: a call's start, or a fragment of the open call's arguments."""
        if p.kind == "text":
            yield from self.text(p.text)
        elif p.kind == "call":
            block = {"type": "tool_use", "id": _tool_id(p.call.id), "name": p.call.name, "input": {}}
            yield from self._start(block)
        elif p.text:
            yield self._delta({"type": "input_json_delta", "partial_json": p.text})


def error(e: ApiError) -> dict:
    """Anthropic's error body: {"type": "error", "error": {"type", "message"}}."""
    kind = ERRORS.get(e.status) or ("invalid_request_error" if e.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}
