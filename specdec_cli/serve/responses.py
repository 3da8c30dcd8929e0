"""OpenAI's Responses API (POST /v1/responses), stateless as llama-server and Ollama serve it: the client sends
the whole conversation every time, nothing is stored. Its items become the chat's conversation types; the answer
goes back as output items or named events. What Codex CLI sends parses: hosted tools (web_search, the freeform
apply_patch, ...) are left out with a warning; items only OpenAI can read (reasoning, compactions) are skipped."""

from __future__ import annotations

import itertools
import json
import secrets
import time
from dataclasses import replace
from types import EllipsisType
from typing import Any, Iterator

from .. import options, ui
from ..backend import grammar
from ..chat import Message, ToolCall, Tools
from . import api, body, chat
from .body import STARTED, WAITING, ApiError, json_type, number, quoted, text, typed

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
# Tool types that OpenAI's servers run (or that need a client protocol other than function calls): the model
# here cannot use them, so they are left out rather than refused, or Codex CLI could not talk to us at all.
HOSTED = {
    "web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11", "file_search",
    "computer_use_preview", "computer", "code_interpreter", "image_generation", "local_shell", "shell", "mcp",
    "custom", "apply_patch", "namespace", "tool_search",
}  # fmt: skip
# History items that only OpenAI's servers can read (reasoning, encrypted compactions) or that record what a
# hosted tool did: skipped; the messages and calls around them carry the conversation.
SKIPPED = {
    "reasoning", "compaction", "compaction_summary", "web_search_call", "file_search_call", "image_generation_call",
    "code_interpreter_call", "computer_call", "computer_call_output", "tool_search_call", "tool_search_output",
    "mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response", "ghost_snapshot",
}  # fmt: skip
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
CALLS = {"function_call", "custom_tool_call", "local_shell_call"}
OUTPUTS = {"function_call_output", "custom_tool_call_output"}


def parse(kind: str, body: Any) -> api.Request:
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
    req = api.Request("chat", typed(body, "model", str))
    req.messages = conversation(body.get("input"), typed(body, "instructions", str))
    req.tools = tools(body.get("tools"), body.get("tool_choice"), typed(body, "parallel_tool_calls", bool))
    req.stream = bool(typed(body, "stream", bool))
    for name, key in SETTINGS.items():
        if body.get(name) is not None:
            req.settings[key] = _setting(body[name], name, key)
    fmt = _text(body.get("text"))
    if fmt is not ...:  # its own: "text" is unconstrained, whatever the server's default
        req.settings["gbnf"] = fmt
    req.exact = typed(body, "exact", bool)
    req.cache_prompt = typed(body, "cache_prompt", bool)
    req.cache_salt = api.cache_salt(body)
    if req.tools is not None and req.tools.choice != "none" and req.settings.get("gbnf"):
        raise ApiError(400, "text.format with tools is not supported: the calls have their own grammar", param="text")
    return req


def _setting(value: Any, name: str, key: str) -> int | float:
    """A number checked by its run option's own rule, named by the request's field (max_output_tokens, not -n)."""
    value = number(value, name, integer=options.BY_KEY[key].type is int)
    rule = options.BY_KEY[key].problem(value)
    if rule:
        raise ApiError(400, f"{name} {rule}", param=name)
    return value


def _text(value: Any) -> str | None | EllipsisType:
    """text.format as a grammar: text (None: unconstrained), json_object, or json_schema ({name, schema,
    strict}: that schema, by the converter --json-schema uses); ... where no format is given."""
    if value is None:
        return ...
    if not isinstance(value, dict):
        raise ApiError(400, f"text must be an object (got {json_type(value)})", param="text")
    fmt = value.get("format")
    if fmt is None:  # {"verbosity": ...} alone (Codex CLI sends it): a hint for OpenAI's models
        return ...
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return grammar.JSON_OBJECT
    if kind != "json_schema":
        raise ApiError(400, 'text.format.type must be "text", "json_object" or "json_schema"', param="text.format")
    if not isinstance(fmt.get("schema"), dict):
        raise ApiError(400, "text.format.schema must be a JSON Schema object", param="text.format")
    return body.schema_grammar(fmt["schema"], "text.format")


def conversation(value: Any, instructions: str | None) -> list[Message]:
    """`input` (a string: one user turn; or items) after `instructions`, as chat messages."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input must be a string or a non-empty list of items", param="input")
    out = [Message("system", text(instructions, "instructions"))] if instructions is not None else []
    names: dict[str, str] = {}  # call_id -> function, for the results (some templates write the name)
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an object (got {json_type(item)})", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(item, where))
        elif kind in CALLS:
            call = _call(item, kind, where)
            names[call.id] = call.name
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":  # a turn's calls (and its text) are one message
                out[-1] = replace(last, tool_calls=(*last.tool_calls, call))
            else:
                out.append(Message("assistant", "", (call,)))
        elif kind in OUTPUTS:
            call_id = _string(item, "call_id", where)
            if call_id not in names:
                raise ApiError(400, f"{where}: no function_call with call_id {call_id!r} comes before it", param=where)
            result = chat.parts(item.get("output"), f"{where}.output")
            out.append(Message("tool", result, tool_call_id=call_id, name=names[call_id]))
        elif kind in SKIPPED:
            continue
        elif kind == "item_reference":
            raise ApiError(400, f"{where}: item references need stored items; this server is stateless", param=where)
        else:
            raise ApiError(400, f"{where}.type must be message, function_call or function_call_output (got {kind!r})",
                           param=where)  # fmt: skip
    return _one_system(out)


def _message(item: dict, where: str) -> Message:
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)} (got {role!r})", param=where)
    return Message(ROLES[role], chat.parts(item.get("content"), f"{where}.content"))


def _call(item: dict, kind: str, where: str) -> ToolCall:
    """A call the assistant made. Codex CLI's freeform (custom) and local shell calls are written as the
    function calls they would be: their input, or their action, as the arguments."""
    call_id = _string(item, "call_id", where)
    if kind == "local_shell_call":
        action = item.get("action")
        if not isinstance(action, dict):
            raise ApiError(400, f"{where}.action must be an object", param=where)
        return ToolCall(call_id, "local_shell", json.dumps(action, ensure_ascii=False))
    name = _string(item, "name", where)
    if kind == "custom_tool_call":
        return ToolCall(call_id, name, json.dumps({"input": _string(item, "input", where, empty=True)}))
    return ToolCall(call_id, name, _string(item, "arguments", where, empty=True))


def _string(item: dict, key: str, where: str, empty: bool = False) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not (value or empty):
        got = json_type(value) if not isinstance(value, str) else "an empty string"
        raise ApiError(400, f"{where}.{key} must be a{'' if empty else ' non-empty'} string (got {got})", param=where)
    return text(value, f"{where}.{key}")


def _one_system(messages: list[Message]) -> list[Message]:
    """The instructions and the developer messages that open a conversation (Codex CLI sends both), as one
    system message: many templates take only one, and only first."""
    n = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
    if n <= 1:
        return messages
    return [Message("system", "\n\n".join(m.content for m in messages[:n])), *messages[n:]]


def tools(value: Any, choice: Any, parallel: bool | None) -> Tools | None:
    """Responses' flat function tools ({type, name, description, parameters, strict}); hosted tools are left
    out, with one warning line. None: no function tools."""
    if value is None:
        value = []
    if not isinstance(value, list):
        raise ApiError(400, "tools must be a list of tools", param="tools")
    declared, left_out = [], []
    for i, t in enumerate(value):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "function":
            declared.append(chat.tool(t.get("name"), t.get("description"), t.get("parameters"), f"tools[{i}]"))
        elif kind in HOSTED:
            left_out.append(f"{kind} {quoted(t['name'], 60)}" if isinstance(t.get("name"), str) else str(kind))
        else:
            raise ApiError(400, f'tools[{i}] must be {{"type": "function", "name", "parameters"}}', param="tools")
    if left_out:
        ui.warning(f"/v1/responses: left out the tools this server cannot run: {', '.join(left_out)}")
    if not declared:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice needs function tools", param="tool_choice")
        return None
    return Tools(chat.check_names(declared), chat.choice_of(choice, declared), True if parallel is None else parallel)


def new_id(kind: str) -> str:
    return "resp_" + secrets.token_hex(12)


def error(e: ApiError) -> dict:
    return e.body()


def response(req: api.Request, rid: str, model: str, text: str, finished) -> dict:
    """The whole Response of a request that did not stream (`finished`: service.Finished)."""
    output = [_message_item(_item_id("msg"), text, _status(finished))] if text else []
    output += [_call_item(_item_id("fc"), c, "completed") for c in finished.calls]
    return _response(req, rid, model, int(time.time()), output, finished)


def _status(finished) -> str:
    return "incomplete" if finished.reason == "length" else "completed"


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _message_item(item_id: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(item_id: str, call: ToolCall, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}  # fmt: skip


def _response(req: api.Request, rid: str, model: str, created: int, output: list, finished=None, **extra) -> dict:
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


def _tool_json(tool) -> dict:
    description, schema = tool.description or None, tool.parameters
    return {"type": "function", "name": tool.name, "description": description, "parameters": schema, "strict": False}


def usage(finished) -> dict:
    """OpenAI's; no cache writes are billed here, and what a model thinks aloud is counted as its text."""
    s, details = finished.stats, {"cached_tokens": finished.cached, "cache_write_tokens": 0}
    return {"input_tokens": s.prompt_tokens, "input_tokens_details": details, "output_tokens": s.generated_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": s.prompt_tokens + s.generated_tokens}  # fmt: skip


def stream(req: api.Request, rid: str, model: str, items) -> Iterator[tuple[str, dict]]:
    """Named events: the response created, in progress; each output item added, its text or arguments in deltas,
    done; the response completed (or incomplete: max_output_tokens), with usage and the speculative statistics.
    Cut by an error (the server stopping): an `error` event, the response failed. No "[DONE]" in this API."""
    created, numbers = int(time.time()), itertools.count()

    def event(name: str, **data) -> tuple[str, dict]:
        return name, {"type": name, "sequence_number": next(numbers), **data}

    out = _Output(event)
    yield event("response.created", response=_response(req, rid, model, created, []))
    yield event("response.in_progress", response=_response(req, rid, model, created, []))
    finished = None
    try:
        for item in items:
            if item is WAITING:  # a long prefill: an event the client counts (Codex's stream times out on silence)
                yield event("response.in_progress", response=_response(req, rid, model, created, out.items))
            elif item is STARTED:
                continue
            elif isinstance(item, str) or getattr(item, "kind", None) == "text":
                yield from out.text(item if isinstance(item, str) else item.text)
            elif hasattr(item, "stats"):
                finished = item
            elif item.kind == "call":
                yield from out.call(item.call)
            else:
                yield from out.args(item.text)
    except Exception as e:
        if not isinstance(e, ApiError):  # a bug, after the headers
            ui.error(f"responses stream: unexpected {type(e).__name__}: {e}")
            e = ApiError(500, f"internal error: {type(e).__name__}")
        yield event("error", code=e.code or "server_error", message=e.message, param=e.param)
        failed = {"code": "server_error", "message": e.message}
        yield event("response.failed", response=_response(req, rid, model, created, out.items, status="failed",
                                                          error=failed))  # fmt: skip
        return
    if finished is None:  # the client left
        return
    yield from out.close(_status(finished))
    name = "response.incomplete" if finished.reason == "length" else "response.completed"
    yield event(name, response=_response(req, rid, model, created, out.items, finished))


class _Output:
    """A stream's output items as its events build them: one open at a time (a message's text, or a call's
    arguments), closed when the next begins or the answer ends; `items` holds them as they stand."""

    def __init__(self, event):
        self.event = event
        self.items: list[dict] = []
        self.open: dict | None = None
        self.pieces: list[str] = []  # the open item's text or arguments so far

    def _where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1}

    def _add(self, item: dict) -> Iterator[tuple[str, dict]]:
        self.open, self.pieces = item, []
        self.items.append(item)
        yield self.event("response.output_item.added", output_index=len(self.items) - 1, item=item)

    def text(self, piece: str) -> Iterator[tuple[str, dict]]:
        if not piece:
            return
        if self.open is None or self.open["type"] != "message":
            yield from self.close("completed")
            yield from self._add(_message_item(_item_id("msg"), None, "in_progress"))
            yield self.event("response.content_part.added", **self._where(), content_index=0, part=_part(""))
        self.pieces.append(piece)
        yield self.event("response.output_text.delta", **self._where(), content_index=0, delta=piece, logprobs=[])

    def call(self, call: ToolCall) -> Iterator[tuple[str, dict]]:
        yield from self.close("completed")
        yield from self._add(_call_item(_item_id("fc"), replace(call, arguments=""), "in_progress"))

    def args(self, fragment: str) -> Iterator[tuple[str, dict]]:
        if self.open is None or self.open["type"] != "function_call" or not fragment:
            return
        self.pieces.append(fragment)
        yield self.event("response.function_call_arguments.delta", **self._where(), delta=fragment)

    def close(self, status: str) -> Iterator[tuple[str, dict]]:
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
