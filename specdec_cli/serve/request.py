"""A request as every API's body is checked into it (api.py, responses.py, messages.py, llama.py): what the service
generates from, whichever dialect asked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..batching.claim import Priority
from ..chat import Message, Tools


@dataclass
class Request:
    kind: str  # "chat" (OpenAI's chat, and the Responses and Messages bodies, read as one) | "completion" (OpenAI's)
    # | "infill" | "llama" (llama-server's /infill and /completion)
    model: str | None
    messages: list[Message] = field(default_factory=list)  # chat
    tools: Tools | None = None  # chat: the tools on offer and what the model may do with them
    prediction: str | None = None  # predicted output: text the answer is expected to repeat
    prompt_tokens: int = 0  # the prompt's length, once it is tokenized (a stream's first event may say it)
    prompt: str = ""  # completion
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: usage in a chunk of its own, as OpenAI does
    stop: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # run option -> value (RunConfig.override's keywords)
    grammar: str | None = None  # GBNF the answer follows (response_format, ...); None: the server's (--json-schema,
    # --grammar); run_inputs.UNCONSTRAINED: none, whatever the server's (response_format "text")
    exact: bool | None = None
    cache_prompt: bool | None = None  # llama-server's name: start from what the caches hold of this prompt (None:
    # not said; serve does, a batch does not: its answers do not then depend on the request before them)
    cache_salt: str | None = None  # vLLM's name: reuse cached prompt cells only of requests with the same salt
    template: bool | None = False  # a completion's prompt as it is; None: as `generate` reads it (a batch's
    # hand-written {"prompt"} line): in the chat template where the target has one and --chat says so
    # Fill in the middle (a completion's `suffix`, llama-server's /infill): `prompt` is the code before the
    # cursor, `suffix` after it, `extra` other files, `continued` text after the prefix (chat/fim.py).
    suffix: str | None = None
    extra: list = field(default_factory=list)
    continued: str = ""
    logprobs: int | None = None  # each token's log probability and this many alternatives (None: not asked)
    time_limit: float | None = None  # llama-server's t_max_predict_ms, in seconds: stop at a newline after it
    indent: int = 0  # llama-server's n_indent: stop at a line indented less, after the first line
    client: str | None = None  # who asks (an address and llama-server's id_slot): a newer request cancels its last
    slot: int = -1  # llama-server's id_slot, as sent
    fields: list[str] | None = None  # llama-server's response_fields: only these
    n: int = 1  # completions asked for (llama-server's n_cmpl)
    priority: Priority = Priority.NORMAL  # how soon its prompt goes beside others': the dialect that parsed it says

    @property
    def instruction(self) -> str:
        """What lookup reads for the names an edit will touch: the last user turn, or the prompt."""
        users = [m.content for m in self.messages if m.role == "user"]
        return users[-1] if users else self.prompt
