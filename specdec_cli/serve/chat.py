"""OpenAI's chat messages and tools, read into the conversation types (chat/messages.py), and tool calls written
back in its shapes. The Responses and Messages APIs build the same types from their own items (responses.py,
messages.py)."""

from __future__ import annotations

import json
import re
from typing import Any

from ..chat import Message, Tool, ToolCall, Tools
from .body import ApiError, json_type, text

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
NAME = re.compile(r"^[a-zA-Z0-9_.:-]{1,64}$")  # OpenAI's rule for a function's name (and '.', ':' as MCP names)


def messages(value: Any) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object (got {json_type(m)})", param=where)
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)} (got {role!r})", param=where)
        calls = tool_calls(m.get("tool_calls"), f"{where}.tool_calls") if role == "assistant" else ()
        content = m.get("content")
        if content is None and (calls or role == "assistant"):
            content = ""
        body = parts(content, f"{where}.content")
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ApiError(400, f"{where}.tool_call_id must be a string", param=where)
            out.append(Message("tool", body, tool_call_id=call_id, name=_optional_str(m, "name", where)))
        else:
            out.append(Message(ROLES[role], body, calls))
    return out


def parts(value: Any, where: str) -> str:
    """A string, or a list of text parts (how newer clients send it); anything else is refused."""
    if isinstance(value, str):
        return text(value, where)
    if isinstance(value, list):
        out = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
                raise ApiError(400, f"{where}: only text parts are supported", param=where)
            if not isinstance(part.get("text"), str):
                raise ApiError(400, f"{where}: a text part needs its text", param=where)
            out.append(part["text"])
        return text("".join(out), where)
    raise ApiError(400, f"{where} must be a string or a list of text parts (got {json_type(value)})", param=where)


def tool_calls(value: Any, where: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ApiError(400, f"{where} must be a list", param=where)
    out = []
    for i, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(
                400, f"{where}[{i}] must be {{id, type: function, function: {{name, arguments}}}}", param=where
            )
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):  # some clients send the object itself
            args = json.dumps(args, ensure_ascii=False)
        out.append(ToolCall(str(call.get("id") or f"call_{i}"), fn["name"], text(args, where)))
    return tuple(out)


def tools(value: Any, choice: Any, parallel: Any) -> Tools | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` (None: no tools)."""
    if value in (None, []):
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        return None
    if not isinstance(value, list):
        raise ApiError(400, "tools must be a list of function declarations", param="tools")
    declared = []
    for i, t in enumerate(value):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise ApiError(400, f"tools[{i}] must be {{type: function, function: {{name, parameters}}}}", param="tools")
        declared.append(tool(fn.get("name"), fn.get("description"), fn.get("parameters"), f"tools[{i}]"))
    return Tools(check_names(declared), choice_of(choice, declared), _parallel(parallel))


def tool(name: Any, description: Any, parameters: Any, where: str) -> Tool:
    if not isinstance(name, str) or not NAME.match(name):
        raise ApiError(
            400, f"{where}: a function's name is 1-64 letters, digits, _ . : or - (got {name!r})", param=where
        )
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"{where}.description must be a string", param=where)
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise ApiError(400, f"{where}.parameters must be a JSON Schema object", param=where)
    return Tool(name, text(description or "", where), parameters)


def check_names(declared: list[Tool]) -> tuple[Tool, ...]:
    names = [t.name for t in declared]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ApiError(400, f"tools: the function {dup!r} is declared twice", param="tools")
    return tuple(declared)


def choice_of(value: Any, declared: list[Tool], *, field: str = "tool_choice") -> str:
    """ "auto", "none", "required" or the name of a declared function."""
    if value is None:
        return "auto"
    if value in ("auto", "none", "required"):
        return value
    name = None
    if isinstance(value, dict):
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else value.get("name")
    if not isinstance(name, str):
        raise ApiError(400, f'{field} must be "auto", "none", "required" or a named function', param=field)
    if name not in {t.name for t in declared}:
        raise ApiError(400, f"{field} names {name!r}, which is not among the tools", param=field)
    return name


def _parallel(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, bool):
        raise ApiError(400, "parallel_tool_calls must be true or false", param="parallel_tool_calls")
    return value


def _optional_str(m: dict, key: str, where: str) -> str | None:
    value = m.get(key)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"{where}.{key} must be a string", param=where)
    return value


def call_json(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
