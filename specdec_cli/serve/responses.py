"""OpenAI's Responses API (POST /v1/responses), stateless as llama-server and Ollama serve it: the client sends
the whole conversation every time, nothing is stored. Its items become the chat's conversation types
(responses_items.py); the answer goes back as output items or named events."""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import replace
from typing import Any, Callable, Iterator

from .. import options
from ..backend import grammar
from ..chat import Tool, ToolCall
from . import api, body
from .body import ApiError, json_type, number, typed
from .items import Args, Call, Finished, Scored, Text
from ..run_inputs import UNCONSTRAINED
from .request import Request
from .responses_items import conversation, tools
from .stream import Event, Shape

# Request field -> run option. max_output_tokens, temperature and top_p are OpenAI's; the rest are the
# sampling extras the chat endpoint also takes (llama-server's names).
SETTINGS = {
    "max_output_tokens": "max_tokens", "temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "seed": "seed",
}  # fmt: skip
# Fields that would need state or work on OpenAI's side: refused, with what to do instead.
REFUSED = {
    "previous_response_id": "this server is stateless and stores no responses: send the whole conversation in `input`",
    "conversation": "this server is stateless and keeps no conversations: send the whole conversation in `input`",
    "prompt": "stored prompt templates are not supported: send the instructions and input themselves",
    "background": "background responses are not supported (nothing is stored to poll)",
}
# Who asks, what OpenAI stores or bills, reasoning controls for models that reason on OpenAI's side, and
# max_tool_calls (the calls' grammar already bounds them): accepted, ignored. client_metadata: Codex CLI's.
IGNORED = {
    "model", "store", "metadata", "user", "include", "reasoning", "prompt_cache_key", "prompt_cache_retention",
    "service_tier", "truncation", "safety_identifier", "stream_options", "max_tool_calls", "client_metadata",
}  # fmt: skip
READ = {"input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "stream", "top_logprobs"}
FIELDS = {*READ, *SETTINGS, *REFUSED, *IGNORED, "exact", "cache_prompt", "cache_salt"}


def parse(kind: str, body: Any) -> Request:
    """A Responses body checked into the chat Request the service runs."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS, key=str)
    if unknown:
        raise ApiError(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    for name, why in REFUSED.items():
        if body.get(name) not in (None, False):
            raise ApiError(400, f"{name} is not supported: {why}", param=name)
    if body.get("top_logprobs") not in (None, 0):
        raise ApiError(400, "top_logprobs is not supported: no log probabilities here", param="top_logprobs")
    req = Request("chat", typed(body, "model", str))
    req.messages = conversation(body.get("input"), typed(body, "instructions", str))
    req.tools = tools(body.get("tools"), body.get("tool_choice"), typed(body, "parallel_tool_calls", bool))
    req.stream = bool(typed(body, "stream", bool))
    for name, key in SETTINGS.items():
        if body.get(name) is not None:
            req.settings[key] = _setting(body[name], name, key)
    req.grammar = _text(body.get("text"))  # its own: "text" is unconstrained, whatever the server's default
    req.exact = typed(body, "exact", bool)
    req.cache_prompt = typed(body, "cache_prompt", bool)
    req.cache_salt = api.cache_salt(body)
    if req.tools is not None and req.tools.choice != "none" and req.grammar:
        raise ApiError(400, "text.format with tools is not supported: the calls have their own grammar", param="text")
    return req


def _setting(value: Any, name: str, key: str) -> int | float:
    """A number checked by its run option's own rule, named by the request's field (max_output_tokens, not -n)."""
    value = number(value, name, integer=options.BY_KEY[key].type is int)
    rule = options.BY_KEY[key].problem(value)
    if rule:
        raise ApiError(400, f"{name} {rule}", param=name)
    return value


def _text(value: Any) -> str | None:
    """text.format as a grammar: text (UNCONSTRAINED), json_object, or json_schema ({name, schema, strict}: that
    schema, by the converter --json-schema uses); None (the server's) where no format is given."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError(400, f"text must be an object (got {json_type(value)})", param="text")
    fmt = value.get("format")
    if fmt is None:  # {"verbosity": ...} alone (Codex CLI sends it): a hint for OpenAI's models
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return UNCONSTRAINED
    if kind == "json_object":
        return grammar.JSON_OBJECT
    if kind != "json_schema":
        raise ApiError(400, 'text.format.type must be "text", "json_object" or "json_schema"', param="text.format")
    if not isinstance(fmt.get("schema"), dict):
        raise ApiError(400, "text.format.schema must be a JSON Schema object", param="text.format")
    return body.schema_grammar(fmt["schema"], "text.format")


def new_id(kind: str) -> str:
    return "resp_" + secrets.token_hex(12)


def error(e: ApiError) -> dict:
    return e.body()


def response(req: Request, rid: str, model: str, text: str, finished: Finished) -> dict:
    """The whole Response of a request that did not stream."""
    output = [_message_item(_item_id("msg"), text, _status(finished))] if text else []
    output += [_call_item(_item_id("fc"), c, "completed") for c in finished.calls]
    return _response(req, rid, model, int(time.time()), output, finished)


def _status(finished: Finished) -> str:
    return "incomplete" if finished.reason == "length" else "completed"


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _message_item(item_id: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(item_id: str, call: ToolCall, status: str) -> dict:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def _response(
    req: Request, rid: str, model: str, created: int, output: list, finished: Finished | None = None, **extra
) -> dict:
    """The Response object: in progress (no `finished`), failed (`error` in `extra`), or ended."""
    status = extra.pop("status", "in_progress" if finished is None else _status(finished))
    t = req.tools
    choice = "auto" if t is None else t.choice  # Tools(choice="none") or no Tools at all
    out = {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True if t is None else t.parallel,
        "tool_choice": choice if choice in ("auto", "none", "required") else {"type": "function", "name": choice},
        "tools": [_tool_json(tool) for tool in (t.tools if t else ())],
        "temperature": req.settings.get("temp"),
        "top_p": req.settings.get("top_p"),
        "max_output_tokens": req.settings.get("max_tokens"),
        "store": False,
        **extra,
    }
    if finished is not None:
        out["usage"] = usage(finished)
        out["speculative"] = finished.stats.as_dict()
    return out


def _tool_json(tool: Tool) -> dict:
    description, schema = tool.description or None, tool.parameters
    return {"type": "function", "name": tool.name, "description": description, "parameters": schema, "strict": False}


def usage(finished: Finished) -> dict:
    """OpenAI's; no cache writes are billed here, and what a model thinks aloud is counted as its text."""
    s, details = finished.stats, {"cached_tokens": finished.cached, "cache_write_tokens": 0}
    return {
        "input_tokens": s.prompt_tokens,
        "input_tokens_details": details,
        "output_tokens": s.generated_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": s.prompt_tokens + s.generated_tokens,
    }


def shape(req: Request, rid: str, model: str) -> Shape:
    return _Events(req, rid, model)


class _Events(Shape):
    """Named events: the response created, in progress; each output item added, its text or arguments in deltas,
    done; the response completed (or incomplete: max_output_tokens), with usage and the speculative statistics.
    Cut by an error (the server stopping): an `error` event, the response failed. No "[DONE]" in this API."""

    def __init__(self, req: Request, rid: str, model: str):
        self.req, self.rid, self.model = req, rid, model
        self.created, self.numbers = int(time.time()), itertools.count()
        self.out = _Output(self.event)

    def event(self, name: str, **data) -> Event:
        return name, {"type": name, "sequence_number": next(self.numbers), **data}

    def _response(self, output: list, **kw) -> dict:
        return _response(self.req, self.rid, self.model, self.created, output, **kw)

    def start(self) -> Iterator[Event]:
        yield self.event("response.created", response=self._response([]))
        yield self.event("response.in_progress", response=self._response([]))

    def heartbeat(self) -> Iterator[Event]:  # an event the client counts (Codex's stream times out on silence)
        yield self.event("response.in_progress", response=self._response(self.out.items))

    def text(self, piece: Text, probs: list[Scored]) -> Iterator[Event]:
        return self.out.text(piece)

    def call(self, piece: Call) -> Iterator[Event]:
        return self.out.call(piece.call)

    def args(self, piece: Args) -> Iterator[Event]:
        return self.out.args(piece.text)

    def end(self, finished: Finished) -> Iterator[Event]:
        yield from self.out.close(_status(finished))
        name = "response.incomplete" if finished.reason == "length" else "response.completed"
        yield self.event(name, response=self._response(self.out.items, finished=finished))

    def error(self, e: ApiError) -> Iterator[Event]:
        yield self.event("error", code=e.code or "server_error", message=e.message, param=e.param)
        failed = {"code": "server_error", "message": e.message}
        yield self.event("response.failed", response=self._response(self.out.items, status="failed", error=failed))


class _Output:
    """A stream's output items as its events build them: one open at a time (a message's text, or a call's
    arguments), closed when the next begins or the answer ends; `items` holds them as they stand."""

    def __init__(self, event: Callable[..., Event]):
        self.event = event
        self.items: list[dict] = []
        self.open: dict | None = None
        self.pieces: list[str] = []  # the open item's text or arguments so far

    def _where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1}

    def _add(self, item: dict) -> Iterator[Event]:
        self.open, self.pieces = item, []
        self.items.append(item)
        yield self.event("response.output_item.added", output_index=len(self.items) - 1, item=item)

    def text(self, piece: str) -> Iterator[Event]:
        if not piece:
            return
        if self.open is None or self.open["type"] != "message":
            yield from self.close("completed")
            yield from self._add(_message_item(_item_id("msg"), None, "in_progress"))
            yield self.event("response.content_part.added", **self._where(), content_index=0, part=_part(""))
        self.pieces.append(piece)
        yield self.event("response.output_text.delta", **self._where(), content_index=0, delta=piece, logprobs=[])

    def call(self, call: ToolCall) -> Iterator[Event]:
        yield from self.close("completed")
        yield from self._add(_call_item(_item_id("fc"), replace(call, arguments=""), "in_progress"))

    def args(self, fragment: str) -> Iterator[Event]:
        if self.open is None or self.open["type"] != "function_call" or not fragment:
            return
        self.pieces.append(fragment)
        yield self.event("response.function_call_arguments.delta", **self._where(), delta=fragment)

    def close(self, status: str) -> Iterator[Event]:
        item, joined = self.open, "".join(self.pieces)
        if item is None:
            return
        where = self._where()
        if item["type"] == "message":
            yield self.event("response.output_text.done", **where, content_index=0, text=joined, logprobs=[])
            yield self.event("response.content_part.done", **where, content_index=0, part=_part(joined))
            done = {**item, "status": status, "content": [_part(joined)]}
        else:
            yield self.event("response.function_call_arguments.done", **where, arguments=joined)
            done = {**item, "status": "completed", "arguments": joined}
        self.items[-1], self.open = done, None
        yield self.event("response.output_item.done", output_index=where["output_index"], item=done)
