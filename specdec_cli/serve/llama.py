"""llama-server's own endpoints, as the editor plugins call them: `POST /infill` (fill in the middle: llama.vim,
llama.vscode) and `POST /completion` (Tabby, Continue with their own templates). Its request fields and its
response: `content`, `stop_type`, `tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `timings`, and
`completion_probabilities` for `n_probs`; streamed as `data:` lines with no `[DONE]`, an error after the start as
`data: {"error": ...}`, the stream's last line (as llama-server's server-context.cpp ends one).

As llama-server does, fields this server has no use for are ignored (the plugins send many); a field that would
change the answer in a way we cannot (penalties, mirostat, DRY, XTC, probabilities after sampling) is refused.
Where the request does not set a sampling field, the server's own setting applies (--temp defaults to greedy).
"""

from __future__ import annotations

import secrets
from typing import Any, Iterator

from .. import options
from ..backend import grammar
from ..batching.claim import Priority
from ..chat import fim
from ..errors import UsageError
from . import api
from .body import ApiError, number, schema_grammar, text, typed
from .items import Finished, Scored, Text
from .request import Request
from .stream import COMMENT, Event, Shape

SETTINGS = {"temperature": "temp", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed"}
NO_LIMIT = 2**31 - 1  # n_predict -1: until the end of the turn or of the context
NEUTRAL = {  # field: its value that changes nothing (the default); any other is refused
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "mirostat": 0,
    "dry_multiplier": 0.0,
    "xtc_probability": 0.0,
    "typical_p": 1.0,
    "post_sampling_probs": False,
    "logit_bias": [],
}
MAX_EXTRA = 1024  # input_extra chunks
MAX_N_CMPL = 8
ERRORS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 501: "not_supported_error"}
ERRORS |= {503: "unavailable_error"}


def parse(kind: str, body: Any) -> Request:
    """An /infill body (kind "infill") or a /completion body (kind "llama")."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    req = Request(kind, typed(body, "model", str))
    if kind == "infill":
        req.priority = Priority.URGENT  # an editor's, waited for at the keyboard (a /completion is anyone's)
        req.prompt = _text(body, "input_prefix", required=True)
        req.suffix = _text(body, "input_suffix", required=True)
        req.extra = _extra(body.get("input_extra"))
        req.continued = _text(body, "prompt")
    else:
        req.prompt = api.prompt_text(body.get("prompt"))
    for name, neutral in NEUTRAL.items():
        given = body.get(name)
        same = given == neutral and isinstance(given, bool) == isinstance(neutral, bool)  # (true is not 1.0 here)
        if given is not None and not same and not (name == "logit_bias" and given in ({}, [])):
            raise ApiError(400, f"{name} = {given!r} is not supported by this server", param=name)
    req.stream = bool(typed(body, "stream", bool))
    req.cache_prompt = typed(body, "cache_prompt", bool)
    req.cache_salt = api.cache_salt(body)
    req.stop = _stop(body.get("stop"))
    n_predict = body.get("n_predict", body.get("max_tokens"))
    if n_predict is not None:
        n = number(n_predict, "n_predict", integer=True)
        req.settings["max_tokens"] = NO_LIMIT if n < 0 else max(n, 1)  # 0: one token, as llama-server samples
    for name, key in SETTINGS.items():
        if body.get(name) is not None:
            req.settings[key] = number(body[name], name, integer=key in ("top_k", "seed"))
    if req.settings.get("seed") == -1:  # llama-server's "random"
        del req.settings["seed"]
    n_probs = _int(body, "n_probs", 0)
    if not 0 <= n_probs <= options.MAX_LOGPROBS:
        raise ApiError(400, f"n_probs must be 0..{options.MAX_LOGPROBS} (got {n_probs})", param="n_probs")
    req.logprobs = n_probs or None
    limit = body.get("t_max_predict_ms")  # (t_max_prompt_ms: llama-server reads it, and applies nothing)
    if limit is not None and number(limit, "t_max_predict_ms", integer=False) > 0:
        req.time_limit = float(limit) / 1000
    if body.get("n_indent") is not None:
        req.indent = max(0, number(body["n_indent"], "n_indent", integer=True))
    req.slot = _int(body, "id_slot", -1)
    req.fields = _fields(body.get("response_fields"))
    req.n = _int(body, "n_cmpl", _int(body, "n", 1))
    if not 1 <= req.n <= MAX_N_CMPL or (req.stream and req.n > 1):
        raise ApiError(400, f"n_cmpl must be 1..{MAX_N_CMPL} (1 when streaming)", param="n_cmpl")
    if body.get("grammar") is not None:
        req.grammar = text(typed(body, "grammar", str), "grammar")
        try:  # now, not after a stream's first line
            grammar.check(req.grammar)
        except UsageError as e:
            raise ApiError(400, f"grammar: {e.message}", param="grammar") from None
    elif body.get("json_schema") is not None:
        req.grammar = schema_grammar(typed(body, "json_schema", dict), "json_schema")
    return req


def _int(value: dict, name: str, default: int) -> int:
    """A whole-number field; null is the default, as llama-server reads it."""
    return default if value.get(name) is None else int(number(value[name], name, integer=True))


def _text(value: dict, name: str, required: bool = False) -> str:
    if value.get(name) is None:
        if required:
            raise ApiError(400, f'"{name}" is required', param=name)
        return ""
    return text(typed(value, name, str), name)


def _extra(value: Any) -> list[fim.Extra]:
    """input_extra: [{"filename", "text"}] (other keys, such as llama.vim's "time", are ignored)."""
    if value is None:
        return []
    shape = 'input_extra must be an array of {"filename": string, "text": string}'
    if not isinstance(value, list) or len(value) > MAX_EXTRA:
        raise ApiError(400, shape + f" (at most {MAX_EXTRA})", param="input_extra")
    out = []
    for i, chunk in enumerate(value):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(
                400, f'input_extra[{i}] must contain a "text" field with a string value', param="input_extra"
            )
        name = chunk.get("filename", "tmp")
        if not isinstance(name, str):
            raise ApiError(400, f'input_extra[{i}]\'s "filename" must be a string', param="input_extra")
        out.append(fim.Extra(text(name, "input_extra"), text(chunk["text"], "input_extra")))
    return out


def _stop(value: Any) -> list[str]:
    """A string or strings; empty ones are dropped (llama-server's rule)."""
    stops = [value] if isinstance(value, str) else [] if value is None else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "stop must be a string or an array of strings", param="stop")
    stops = [text(s, "stop") for s in stops if s]
    if len(stops) > 16:
        raise ApiError(400, "stop takes at most 16 strings", param="stop")
    return stops


def _fields(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
        raise ApiError(400, "response_fields must be an array of strings", param="response_fields")
    return value


def new_id(kind: str) -> str:
    return "cmpl-" + secrets.token_hex(12)


def stop_type(finished: Finished) -> str:
    """llama-server's: "eos" (the model ended), "word" (a stop string), "limit" (n_predict, the context, a time
    or indentation limit), "none" (a newer request from the same client superseded it)."""
    if finished.superseded:
        return "none"
    if finished.stop_sequence is not None:
        return "word"
    return "eos" if finished.stats.stop_reason == "eos" and not finished.limit else "limit"


def timings(finished: Finished) -> dict:
    s = finished.stats
    prompt_n, gen_n = max(s.prompt_tokens - finished.cached, 0), s.generated_tokens
    prompt_ms, gen_ms = s.prefill_seconds * 1000, s.generation_seconds * 1000
    out = {
        "cache_n": finished.cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms else 0.0,
        "predicted_n": gen_n,
        "predicted_ms": gen_ms,
        "predicted_per_token_ms": gen_ms / gen_n if gen_n else 0.0,
        "predicted_per_second": gen_n / gen_ms * 1000 if gen_ms else 0.0,
    }
    if s.drafted:
        out |= {"draft_n": s.drafted, "draft_n_accepted": s.accepted}
    return out


def probabilities(scored: list[Scored]) -> list[dict]:
    """completion_probabilities: each token's {id, token, bytes, logprob, top_logprobs}."""

    def one(t: int, token: str, raw: bytes, lp: float) -> dict:
        return {"id": t, "token": token, "bytes": list(raw), "logprob": _finite(lp)}

    return [{**one(s.id, s.text, s.bytes, s.logprob), "top_logprobs": [one(*t) for t in s.top]} for s in scored]


def _finite(lp: float) -> float:
    return lp if lp > -3.4028234663852886e38 else -3.4028234663852886e38  # llama-server's -inf (JSON has none)


def response(req: Request, rid: str, model: str, text: str, finished: Finished) -> dict:
    s = finished.stats
    out = {
        "index": 0,
        "content": text,
        "tokens": [],
        "id_slot": max(req.slot, 0),
        "stop": True,
        "model": model,
        "tokens_predicted": s.generated_tokens,
        "tokens_evaluated": s.prompt_tokens,
        "generation_settings": _settings(req),
        "has_new_line": "\n" in text,
        "truncated": s.stop_reason == "context",
        "stop_type": stop_type(finished),
        "stopping_word": finished.stop_sequence or "",
        "tokens_cached": s.prompt_tokens + s.generated_tokens,
        "timings": timings(finished),
        "speculative": s.as_dict(),
    }
    if req.logprobs is not None and not req.stream:
        out["completion_probabilities"] = probabilities(finished.probs)
    return _only(out, req.fields)


def _settings(req: Request) -> dict:
    """generation_settings: the request's, by llama-server's names (what it did not set: the server's)."""
    names = {"max_tokens": "n_predict", **{key: name for name, key in SETTINGS.items()}}
    out = {names[k]: v for k, v in req.settings.items() if k in names}
    return out | {"n_probs": req.logprobs or 0, "stop": req.stop, "n_indent": req.indent}


def _only(out: dict, fields: list[str] | None) -> dict:
    """response_fields: those paths, each a key of its own ("timings/prompt_n"), as llama-server flattens them."""
    if not fields:
        return out
    picked = {}
    for path in fields:
        value: Any = out
        for part in path.split("/"):
            value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING:
            picked[path] = value
    return picked


_MISSING = object()


def shape(req: Request, rid: str, model: str) -> Shape:
    return _Lines(req, rid, model)


class _Lines(Shape):
    """`data:` lines: one per piece ({content, stop: false, ...}, its tokens' probabilities where asked), then
    the whole response with empty content and stop: true. No [DONE]; an error after the start as {"error"}."""

    def __init__(self, req: Request, rid: str, model: str):
        self.req, self.rid, self.model = req, rid, model
        self.n = 0  # tokens the pieces sent complete
        self.newline = False  # a piece sent held a newline

    def heartbeat(self) -> Iterator[Event]:
        yield COMMENT, "ping"

    def text(self, piece: Text, probs: list[Scored]) -> Iterator[Event]:
        self.n, self.newline = self.n + piece.tokens, self.newline or "\n" in piece
        chunk = {"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": max(self.req.slot, 0)}
        chunk |= {"tokens_predicted": self.n, "tokens_evaluated": self.req.prompt_tokens}
        if probs:
            chunk["completion_probabilities"] = probabilities(probs)
        yield None, chunk

    def end(self, finished: Finished) -> Iterator[Event]:
        last = response(self.req, self.rid, self.model, "", finished)
        if "has_new_line" in last:  # (of what the stream sent: this line's content is empty)
            last["has_new_line"] = self.newline
        yield None, last

    def error(self, e: ApiError) -> Iterator[Event]:
        yield None, error(e)


def error(e: ApiError) -> dict:
    """llama-server's error body: {"error": {"code", "message", "type"}}."""
    kind = ERRORS.get(e.status) or ("invalid_request_error" if e.status < 500 else "server_error")
    return {"error": {"code": e.status, "message": e.message, "type": kind}}
