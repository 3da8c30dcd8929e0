"""A conversation as the prompt text the model was trained on.

Two renderers: llama.cpp's built-in one (`llama_chat_apply_template`: a fixed list of known formats, plain text
turns only) and the model's own Jinja template (`tokenizer.chat_template`), rendered in a sandbox as Hugging
Face does. Plain chats go through the built-in renderer wherever it knows the template, so that their prompts
(and answers) are what they always were: the Jinja templates of Qwen2.5 and SmolLM2 add a default system
prompt the built-in one does not. Tools, tool calls and tool results need the template's own markup: the Jinja
template renders them. A template that cannot (it never mentions `tools`, or fails to render) gets them written
as text in the Hermes format (`<tool_call>`, `<tool_response>`), which the built-in renderer can carry.

A template is code from the model's file, its context what clients sent: it renders in a child process
(isolation.py, sandbox.py) under bounds that hold whatever it runs: RENDER_SECONDS (1 s) of wall clock, then the
child is killed; its output at most the caller's max_bytes (RENDER_BYTES, 64 MiB, where none is named); memory,
the child's address space (sandbox.MEMORY_BYTES: 2 GiB past its start); and one string made in one step at most
sandbox.VALUE_CHARS (16 Mi characters). Whatever it raises or runs into (its raise_exception, a sandbox refusal, a
division by zero, a range too big, one of these bounds, a child that died) is a TemplateError: the same fallback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from . import isolation, limits
from .messages import Message, Tools
from .sandbox import TemplateError

RENDER_BYTES = 2**26  # a rendering's text where the caller names no bound (the server's is the context's: session.py)

HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>{tools}\n</tools>\n\nFor each function call, "
    "return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@dataclass(frozen=True)
class Template:
    source: str | None  # the GGUF's tokenizer.chat_template
    builtin: Callable[[list[tuple[str, str]]], str | None]  # llama.cpp's renderer; None: it does not know it
    bos: str = ""  # the special tokens' texts, as templates name them
    eos: str = ""
    name: str = "the model"

    @property
    def knows_tools(self) -> bool:
        return self.source is not None and "tools" in self.source

    def render(self, messages: list[Message], tools: Tools | None = None, max_bytes: int = RENDER_BYTES) -> str:
        """The prompt text, ready for the assistant's answer; a Jinja rendering past max_bytes is a failure (the
        fallback's text is the caller's to measure)."""
        shown = tools.shown if tools is not None else ()
        if not shown and all(m.plain for m in messages):
            text = self.builtin([(m.role, m.content) for m in messages])
            if text is not None:
                return text
        why = ""
        if self.source is not None and (self.knows_tools or not shown):
            try:
                return self._jinja(messages, shown, max_bytes)
            except TemplateError as e:
                why = f" ({e})"
                _warn_once(f"{self.name}: its chat template did not render{why}; writing the chat in a plain form")
        lowered = as_text(messages, shown)
        text = self.builtin([(m.role, m.content) for m in lowered])
        if text is None:
            raise TemplateError(f"{self.name}'s chat template is not one llama.cpp knows, and it did not render{why}")
        return text

    def _jinja(self, messages: list[Message], tools, max_bytes: int) -> str:
        context: dict[str, Any] = {
            "messages": [_message(m) for m in messages],
            "add_generation_prompt": True,
            "bos_token": self.bos,
            "eos_token": self.eos,
        }
        if tools:
            context["tools"] = [t.for_template() for t in tools]
        try:
            text = isolation.render(self.source, context, max_bytes)
        except (TemplateError, limits.Cancelled):
            raise
        except Exception as e:  # the parent's side: a context JSON cannot write, a child that cannot start
            raise TemplateError(f"{type(e).__name__}: {e}") from None
        # The tokenizer adds BOS itself (as for the built-in renderer's text): a template's own would be a second.
        return text[len(self.bos) :] if self.bos and text.startswith(self.bos) else text


def as_text(messages: list[Message], tools) -> list[Message]:
    """The conversation in plain text turns, tools in the Hermes format: for a template without tool markup."""
    out = list(messages)
    if tools:
        listed = "".join("\n" + json.dumps(t.for_template(), ensure_ascii=False) for t in tools)
        block = HERMES_SYSTEM.format(tools=listed)
        if out and out[0].role == "system":
            out[0] = Message("system", out[0].content + "\n\n" + block)
        else:
            out.insert(0, Message("system", block))
    lowered: list[Message] = []
    for m in out:
        if m.tool_calls:
            calls = "".join(
                "\n<tool_call>\n"
                + json.dumps({"name": c.name, "arguments": c.for_template()["function"]["arguments"]})
                + "\n</tool_call>"
                for c in m.tool_calls
            )
            lowered.append(Message("assistant", (m.content + calls).lstrip("\n")))
        elif m.role == "tool":
            result = f"<tool_response>\n{m.content}\n</tool_response>"
            if lowered and lowered[-1].role == "user" and lowered[-1].content.startswith("<tool_response>"):
                lowered[-1] = Message("user", lowered[-1].content + "\n" + result)
            else:
                lowered.append(Message("user", result))
        else:
            lowered.append(m)
    return lowered


def _message(m: Message) -> dict:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [c.for_template() for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


_WARNED: set[str] = set()
_say: list[Callable[[str], None]] = [lambda message: None]  # where a fallback is said (warn_with)


def warn_with(say: Callable[[str], None]) -> None:
    """Where a template's fallback is said (the CLI: its warning line); each message once per process."""
    _say[0] = say


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        _say[0](message)
