"""Anthropic's conversation, read into the conversation types (chat/messages.py) as OpenAI's chat messages are
(chat.py): the system prompt, the turns and their blocks (text, tool_use, tool_result), the tools and tool_choice."""

from __future__ import annotations

import json
from typing import Any

from .. import ui
from ..chat import Message, ToolCall, Tools
from . import chat
from .body import ApiError, json_type, text


def system(value: Any) -> list[Message]:
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


def messages(value: Any) -> list[Message]:
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


def tools(value: Any, choice: Any) -> Tools | None:
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
