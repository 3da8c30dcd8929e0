"""OpenAI's request and response shapes: a request body checked into a `Request`, and the bodies we send.

Only the dialect's parts that change what is generated are read; other known fields (user, n=1, ...) are
accepted and ignored as OpenAI's own server ignores what does not apply, and a field that would ask for
something we cannot do (n > 1, penalties, logprobs) is refused rather than silently dropped. The values
are checked by the run options' own rules (options.OPTIONS), named by the API's field names.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Iterator

from .. import options
from ..backend import grammar
from ..batching.claim import Priority
from ..engine.stats import Stats
from . import body, chat, cuts
from .body import ApiError, decode, json_type, number, text, typed  # noqa: F401 (decode: re-exported, for batch)
from .items import Args, Call, Finished, Scored, Text
from ..run_inputs import UNCONSTRAINED
from .request import Request
from .stream import COMMENT, Event, Shape

MAX_STOPS = 4  # OpenAI's limit on `stop` sequences
MAX_SALT = 1024  # characters of a cache_salt: vLLM suggests 43 (256 random bits in base64)
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}  # what generates (serve and batch)
# API field -> run option, for the fields that set one (the extra body fields keep specdec's names).
SETTINGS = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "temperature": "temp",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "drafter": "drafter",
    "draft_tokens": "draft_tokens",
}
UNSUPPORTED = {  # field: the value we can honour (anything else is refused)
    "n": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "echo": False,
    "best_of": 1,
    "modalities": ["text"],
}


NOT_DONE = {  # fields whose request would change the answer's form, which we cannot honour: refused, not ignored
    "functions": "function calls (send tools)",
    "function_call": "function calls",
    "logit_bias": "logit biases",
    "audio": "audio output",
    "web_search_options": "web search",
}
# OpenAI's fields that change nothing here (who asks, what the service stores or bills): accepted, ignored.
IGNORED = {
    "model",
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "reasoning_effort",
    "verbosity",
}
# Every field a body may have; any other is refused as OpenAI refuses it (a typo such as `temprature`
# would otherwise run with the default, unnoticed).
READ = {"stream", "stream_options", "stop", "exact", "cache_prompt", "cache_salt", "response_format", "prediction",
        "logprobs"}  # fmt: skip
TOOLS = {"tools", "tool_choice", "parallel_tool_calls"}
OWN = {"chat": {"messages", "top_logprobs", *TOOLS}, "completion": {"prompt", "suffix"}}
FIELDS = {kind: {*own, *READ, *SETTINGS, *UNSUPPORTED, *NOT_DONE, *IGNORED} for kind, own in OWN.items()}


def parse(kind: str, body: Any) -> Request:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS[kind], key=str)
    if unknown:
        raise ApiError(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    model = typed(body, "model", str)
    req = Request(kind, model)
    if kind == "chat":
        req.messages = chat.messages(body.get("messages"))
        req.tools = chat.tools(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    else:
        req.prompt = prompt_text(body.get("prompt"))
        if body.get("suffix") is not None:  # insertion: the text between the prompt and the suffix (FIM)
            req.suffix = text(typed(body, "suffix", str), "suffix")
            req.priority = Priority.URGENT  # fill in the middle: an editor's, waited for at the keyboard
    req.logprobs = _logprobs(kind, body)
    req.stream = bool(typed(body, "stream", bool))
    stream_options = typed(body, "stream_options", dict) or {}
    req.include_usage = bool(typed(stream_options, "include_usage", bool, "stream_options.include_usage"))
    req.stop = _stop(body.get("stop"))
    for name, allowed in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and value != allowed:
            raise ApiError(400, f"{name} = {value!r} is not supported (only {allowed!r})", param=name)
    for name, what in NOT_DONE.items():
        value = body.get(name)
        if value not in (None, [], {}) and not (name == "response_format" and value == {"type": "text"}):
            raise ApiError(400, f"{name} is not supported: this server does not do {what}", param=name)
    for name, key in SETTINGS.items():
        value = body.get(name)
        if value is None:
            continue
        if key == "draft_tokens":
            value = _draft_tokens(value)
        elif key == "drafter":
            value = typed(body, name, str)
        else:
            value = number(value, name, integer=options.BY_KEY[key].type is int)
        req.settings[key] = value
    if body.get("response_format") is not None:  # its own: "text" is unconstrained, whatever the server's default
        req.grammar = _response_format(body["response_format"])
    req.exact = typed(body, "exact", bool)
    req.cache_prompt = typed(body, "cache_prompt", bool)
    req.cache_salt = cache_salt(body)
    req.prediction = _prediction(body.get("prediction"))
    if req.tools is not None and req.tools.choice != "none" and req.grammar:
        raise ApiError(
            400,
            "response_format with tools is not supported: the calls have their own grammar",
            param="response_format",
        )
    return req


def cache_salt(body: dict) -> str | None:
    """vLLM's cache_salt, in every API's body: a non-empty string of at most MAX_SALT characters."""
    salt = typed(body, "cache_salt", str)
    if salt is not None and not 0 < len(salt) <= MAX_SALT:
        raise ApiError(400, f"cache_salt must be a string of 1 to {MAX_SALT} characters", param="cache_salt")
    return salt


def _logprobs(kind: str, body: dict) -> int | None:
    """How many alternatives each token's log probability comes with (None: none asked). Chat: `logprobs` true,
    `top_logprobs` 0..20; a completion: `logprobs` 0..5 (OpenAI's legacy limit; 0: the token's alone)."""
    if kind == "chat":
        top = body.get("top_logprobs")
        if not typed(body, "logprobs", bool):
            if top is not None:
                raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
            return None
        n = 0 if top is None else number(top, "top_logprobs", integer=True)
        name, most = "top_logprobs", options.MAX_LOGPROBS
    else:
        if body.get("logprobs") is None:
            return None
        n, name, most = number(body["logprobs"], "logprobs", integer=True), "logprobs", 5
    if not 0 <= n <= most:
        raise ApiError(400, f"{name} must be 0..{most} (got {n})", param=name)
    return n


def _prediction(value: Any) -> str | None:
    """OpenAI's {"type": "content", "content": text or text parts}."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "content":
        raise ApiError(400, 'prediction must be {"type": "content", "content": ...}', param="prediction")
    return chat.parts(value.get("content"), "prediction.content") or None


def _response_format(value: Any) -> str:
    """OpenAI's response_format as a grammar (GBNF): text (UNCONSTRAINED), json_object (any JSON object), or
    json_schema ({"json_schema": {"name", "schema", "strict"}}: that schema, by the converter --json-schema uses)."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return UNCONSTRAINED
    if kind == "json_object":
        return grammar.JSON_OBJECT
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(
                400, "response_format.json_schema.schema must be a JSON Schema object", param="response_format"
            )
        return body.schema_grammar(schema, "response_format")
    raise ApiError(400, 'response_format.type must be "text", "json_object" or "json_schema"', param="response_format")


def api_name(key: str) -> str:
    """The request field that sets run option `key` (the first of SETTINGS that does)."""
    return next((name for name, option in SETTINGS.items() if option == key), key)


def _draft_tokens(value: Any) -> int | None:
    """-k's one parser, for JSON's values: a number or "auto" (not a number written as a string)."""
    if value == "auto" or isinstance(value, int) and not isinstance(value, bool):
        return options.parse_draft_tokens(value)
    raise ApiError(400, f'draft_tokens must be a whole number or "auto" (got {value!r})', param="draft_tokens")


def prompt_text(value: Any) -> str:
    """A completion's prompt, as /v1/completions and llama-server's /completion take it: a string, or a list of one."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise ApiError(400, f"prompt must be a string (got {json_type(value)})", param="prompt")
    return text(value, "prompt")


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise ApiError(400, f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them", param="stop")
    return [text(stop, "stop") for stop in stops]


def finish_reason(stop_reason: str | None, hit_stop: str | None) -> str:
    """OpenAI's: "stop" (end of turn, a stop sequence) or "length" (max_tokens or the context)."""
    return "stop" if hit_stop or stop_reason == "eos" else "length"


def error(e: ApiError) -> dict:
    return e.body()


def response(req: Request, rid: str, model: str, text: str, finished: Finished) -> dict:
    return completion(req, rid, model, text, finished)


def shape(req: Request, rid: str, model: str) -> Shape:
    return _Chunks(req, rid, model)


class _Chunks(Shape):
    """The chunks of a streamed answer (server-sent events with no name), then "[DONE]". Chat: the first
    carries the role; the last, finish_reason (and, here, usage and the speculative statistics). A stream
    cut by an error (the server stopping) ends with the error object, then "[DONE]"."""

    def __init__(self, req: Request, rid: str, model: str):
        self.req, self.rid, self.model = req, rid, model
        self.offset = 0  # characters of the answer sent so far (a completion's logprobs.text_offset)

    def _chunk(self, text: str | None, reason: str | None = None, **kw) -> Event:
        return None, chunk(self.req, self.rid, self.model, text, reason, **kw)

    def start(self) -> Iterator[Event]:
        yield self._chunk("", first=True)

    def heartbeat(self) -> Iterator[Event]:  # a comment keeps the line alive (OpenRouter's habit)
        yield COMMENT, "keep-alive"

    def text(self, piece: Text, probs: list[Scored]) -> Iterator[Event]:
        yield self._chunk(piece, probs=probs, offset=self.offset)
        self.offset += len(piece)

    def call(self, piece: Call) -> Iterator[Event]:
        yield self._chunk(None, call=piece)

    def args(self, piece: Args) -> Iterator[Event]:
        yield self._chunk(None, call=piece)

    def end(self, finished: Finished) -> Iterator[Event]:
        usage_ = usage(finished.stats, finished.cached, self.req.prediction is not None)
        yield self._chunk(None, finished.reason, extra={"usage": usage_, "speculative": finished.stats.as_dict()})
        if self.req.include_usage:  # OpenAI's own shape for it: a last chunk with no choices
            yield None, {**chunk(self.req, self.rid, self.model, None), "choices": [], "usage": usage_}
        yield None, "[DONE]"

    def error(self, e: ApiError) -> Iterator[Event]:
        yield None, e.body()
        yield None, "[DONE]"


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def usage(stats: Stats, cached: int, predicted: bool = False) -> dict:
    """OpenAI's usage; with a prediction, how much of it the answer kept (its drafted tokens the target
    accepted) and did not, as completion_tokens_details."""
    out = {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_cached": cached,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if predicted:
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": stats.prediction_accepted,
            "rejected_prediction_tokens": stats.prediction_rejected,
        }
    return out


def logprobs(req: Request, scored: list[Scored], offset: int = 0) -> dict | None:
    """OpenAI's logprobs for these tokens in the request's shape (cuts.openai_logprobs); None where not asked."""
    return None if req.logprobs is None else cuts.openai_logprobs(scored, req.kind == "chat", offset)


def completion(req: Request, rid: str, model: str, text: str, finished: Finished) -> dict:
    """The whole response of a request that did not stream."""
    if req.kind == "chat":
        message: dict = {"role": "assistant", "content": text or (None if finished.calls else "")}
        if finished.calls:
            message["tool_calls"] = [chat.call_json(c) for c in finished.calls]
        choice = {"index": 0, "message": message, "logprobs": logprobs(req, finished.probs)}
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs(req, finished.probs)}
    choice["finish_reason"] = finished.reason
    return {
        "id": rid,
        "object": "chat.completion" if req.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(finished.stats, finished.cached, req.prediction is not None),
        "speculative": finished.stats.as_dict(),
    }


def call_delta(piece: Call | Args) -> dict:
    """A tool call's part in a chat chunk's delta: its id and name once (Call), then fragments of its arguments
    (Args) that join to function.arguments."""
    if isinstance(piece, Call):
        c = piece.call
        return {"index": piece.index, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
    return {"index": piece.index, "function": {"arguments": piece.text}}


def chunk(
    req: Request,
    rid: str,
    model: str,
    text: str | None,
    reason: str | None = None,
    *,
    first: bool = False,
    extra: dict | None = None,
    call: Call | Args | None = None,
    probs: list[Scored] | None = None,
    offset: int = 0,
) -> dict:
    """One server-sent event of a stream. Chat: the first carries the role; the last, finish_reason
    (and, here, usage and the speculative statistics)."""
    if req.kind == "chat":
        delta: dict = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        if call is not None:
            delta["tool_calls"] = [call_delta(call)]
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
    if probs:
        choice["logprobs"] = logprobs(req, probs, offset)
    out = {
        "id": rid,
        "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    return {**out, **(extra or {})}
