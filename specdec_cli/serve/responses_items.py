"""The Responses API's input items and tools, read into the conversation types (chat/messages.py) as OpenAI's chat
messages are (chat.py). What Codex CLI sends parses: hosted tools (web_search, the freeform apply_patch, ...) are left
out with a warning; items only OpenAI can read (reasoning, compactions) are skipped."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from .. import ui
from ..chat import Message, ToolCall, Tools
from . import chat
from .body import ApiError, json_type, quoted, text

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
            want = "message, function_call or function_call_output"
            raise ApiError(400, f"{where}.type must be {want} (got {kind!r})", param=where)
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
