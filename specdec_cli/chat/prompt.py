"""A run's prompt as token ids, for a target model and its context: a chat in the model's template, a raw prompt,
or a fill-in-the-middle layout. Every text counts against the context before any is rendered or tokenized (limits.py:
tokenizing costs time, and a request may be hostile), and the tokens must leave the context room to answer."""

from __future__ import annotations

from typing import Protocol

from ..errors import UsageError
from . import ChatModel, Message, TemplateError, TooLong, Tools, fim, limits, texts, tokens


class PromptTooLong(UsageError):
    """The prompt does not fit the context (a server answers it with OpenAI's context_length_exceeded)."""


class PromptModel(ChatModel, fim.FimModel, Protocol):
    def max_token_bytes(self) -> int: ...


def uses_chat(model: PromptModel, chat: bool | None) -> bool:
    """Whether a prompt goes into the chat template: `chat` (--chat/--no-chat) where given, else where it has one."""
    has = model.chat_template() is not None
    if chat and not has:
        raise UsageError(f"--chat: {model.name} has no chat template", hint="use --no-chat")
    return has if chat is None else chat


def max_bytes(model: PromptModel, n_ctx: int) -> int:
    """The most bytes a prompt's text may have and fit the context: no token stands for more than max_token_bytes."""
    return n_ctx * max(1, model.max_token_bytes())


def check_bytes(model: PromptModel, n_ctx: int, size: int) -> None:
    """Refuse a text that cannot fit before tokenizing it."""
    if size > max_bytes(model, n_ctx):
        raise PromptTooLong(
            f"the prompt has {size:,} bytes, more than a context of {n_ctx:,} tokens can hold "
            f"(no token of {model.name} is longer than {model.max_token_bytes()} bytes)",
            hint="raise -c/--ctx-size or shorten the prompt",
        )


def fits(ids: list[int], n_ctx: int) -> list[int]:
    if not ids:
        raise UsageError("the prompt is empty")
    if len(ids) >= n_ctx:
        raise PromptTooLong(
            f"the prompt has {len(ids)} tokens but the context holds {n_ctx}",
            hint="raise -c/--ctx-size or shorten the prompt",
        )
    return ids


def prompt_tokens(
    model: PromptModel,
    n_ctx: int,
    prompt: str = "",
    *,
    messages: list[Message] | None = None,
    tools: Tools | None = None,
    chat: bool | None = None,
    configured_chat: bool | None = None,
    system: str | None = None,
) -> list[int]:
    """In chat mode the prompt (and `system`, --system) is text inside the template; without it, the raw prompt's
    control-token text is parsed (a raw prompt may want them). `messages`: a whole chat, in the template; `chat`:
    with or without the template whatever `configured_chat` (--chat/--no-chat) says (a server's two endpoints);
    `tools`: what the template shows the model (template.py)."""
    # Every text the template may write (tools, calls, results too) counts before any is rendered or tokenized,
    # and each message and tool is a token of markup at least: 100,000 empty ones do not pass for none.
    size = limits.text_bytes([prompt] if messages is None else texts(messages, tools))
    if messages is not None:
        size += model.max_token_bytes() * (len(messages) + (len(tools.shown) if tools is not None else 0))
    check_bytes(model, n_ctx, size)
    if messages is None and (uses_chat(model, configured_chat) if chat is None else chat):
        messages = ([Message("system", system)] if system else []) + [Message("user", prompt)]
    if messages is not None:
        try:
            ids = tokens(model, messages, tools, max_bytes(model, n_ctx))
        except TooLong as e:  # the template's text with the request's
            check_bytes(model, n_ctx, e.size)
            raise
        except TemplateError as e:
            raise UsageError(str(e), hint="use --no-chat and write the prompt in the model's format yourself") from None
    elif system and chat is None:
        why = "--no-chat turns it off" if configured_chat is False else f"{model.name} has none"
        raise UsageError(
            f"--system needs the chat template, and {why}", hint="put the instructions into the prompt itself"
        )
    else:
        ids = limits.tokenize(model, prompt, add_special=True, parse_special=True)
    return fits(ids, n_ctx)


def infill_tokens(
    model: PromptModel, n_ctx: int, prefix: str, suffix: str, extra: list[fim.Extra] = (), prompt: str = ""
) -> list[int]:
    """A fill-in-the-middle prompt (the code before and after the cursor, other files), as llama-server lays it out
    (fim.py); UsageError where the model has no FIM tokens or the prompt does not fit. The texts used whole (the
    prompt, the files' names) count before tokenizing; the others are cut first (fim.py)."""
    check_bytes(model, n_ctx, limits.text_bytes([prompt, *(e.filename for e in extra)]))
    try:
        return fits(fim.layout(model, prefix, suffix, extra, prompt, n_ctx), n_ctx)
    except fim.NoFim as e:
        raise UsageError(str(e), hint="use a model trained to fill in the middle (Qwen2.5-Coder, ...)") from None
