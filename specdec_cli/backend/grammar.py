"""A GBNF grammar over a model's vocabulary, by llama.cpp's own grammar engine (`llama_sampler_init_grammar`):
which tokens may come next, and the state after one. JSON Schema becomes GBNF through the converter
llama-cpp-python ships, with what it gets wrong written by schema.py. The engine sees only `GrammarState`
(engine/constraint.py's State)."""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

import llama_cpp as L
import numpy as np
from llama_cpp.llama_grammar import JSON_GBNF

from ..errors import UsageError
from ..inputs import read_text
from . import native
from .gbnf_bounds import bounded
from .schema import schema_to_gbnf

ROOT = b"root"
JSON_OBJECT = JSON_GBNF  # OpenAI's json_object: llama.cpp's json.gbnf (as llama-cpp-python ships it), an object
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data, as numpy lays it out


def from_schema(schema: str) -> str:
    """--json-schema (a file, or the JSON itself) as GBNF; UsageError naming what is wrong."""
    text = _file_text(schema, "--json-schema") if not schema.lstrip().startswith("{") else schema
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--json-schema is not valid JSON: {e}") from None
    except RecursionError:
        raise UsageError("--json-schema is nested too deeply to read") from None
    if not isinstance(parsed, dict):
        raise UsageError("--json-schema must be a JSON object (a schema)")
    try:
        return schema_to_gbnf(parsed)
    except UsageError as e:
        raise UsageError(f"--json-schema: {e.message}", hint=e.hint) from None


def from_file(path: str) -> str:
    return _file_text(path, "--grammar")


def check(gbnf: str, schema: bool = False) -> None:
    """Parse the grammar now (no model needed: the vocabulary is used only when tokens are checked); `schema`:
    it is the converter's, from a --json-schema, and one that does not parse says what is wrong with that."""
    native.init_backend()
    try:
        bounded(gbnf)
    except UsageError as e:
        if not schema:
            raise
        raise UsageError(
            f"--json-schema converts to a grammar llama.cpp cannot take: {e.message}", hint=e.hint
        ) from None
    ptr, why = _init(None, gbnf)
    if not ptr and schema:  # the converter writes grammars that parse, but for a schema no value satisfies
        raise UsageError(
            f"--json-schema: no value satisfies it, or the converter cannot express it "
            f"(the grammar does not parse: {why})",
            hint="an empty enum, for one, leaves nothing to write",
        )
    if not ptr:
        raise UsageError(f"the grammar does not parse: {why}", hint="see llama.cpp's grammars/README.md for GBNF")
    L.llama_sampler_free(ptr)


class Grammar:
    """A parsed grammar for one model's vocabulary; `start()` is its state before any generated token."""

    def __init__(self, model: native.Model, gbnf: str, trigger: Trigger | None = None):
        """`gbnf` was parsed by `check` (or made by the converter): no stderr to catch here, where a server's
        other threads may be writing to it. `trigger`: the grammar applies from this text on (LazyState)."""
        self.model, self.trigger = model, trigger
        self._completers: list[int] | None = None
        bounded(gbnf)  # check() did, where it ran: this is the last door before llama.cpp
        ptr = L.llama_sampler_init_grammar(model.vocab, gbnf.encode(), ROOT)
        if not ptr:  # a schema no value satisfies (an empty enum) converts to a grammar that does not parse
            raise UsageError(
                f"the grammar does not parse ({native.last_log_error() or 'llama.cpp refused it'}): "
                "a JSON Schema that no value satisfies, such as an empty enum, converts to one"
            )
        # Any end-of-generation token is allowed exactly where the grammar is complete: one stands for them all.
        eog = next(t for t in (L.llama_vocab_eos(model.vocab), L.llama_vocab_eot(model.vocab), 0) if t >= 0)
        self._start = GrammarState(ptr, model.n_vocab, eog)

    def start(self) -> GrammarState | LazyState:
        return self._start.copy() if self.trigger is None else LazyState(self, "", None)

    def reads(self, text: str) -> GrammarState | None:
        """The strict grammar's state after `text` (None: it refuses it). The grammar reads characters, so
        any tokenization of the text reaches the same state: the model's own is used."""
        state = self._start
        for token in self.model.tokenize_text(text, add_special=False, parse_special=True):
            if not state.allows(token):
                return None
            state = state.after(token)
        return state if state is not self._start else state.copy()

    def completers(self) -> list[int]:
        """The tokens that may complete the trigger: those whose text holds the marker's last character or a
        quote (an opening `{"name"` ends with one); computed once."""
        if self._completers is None:
            marks = {b'"'} | ({self.trigger.tag[-1].encode()} if self.trigger.tag else set())
            self._completers = [t for t in range(self.model.n_vocab) if any(m in self.model.piece(t) for m in marks)]
        return self._completers


class GrammarState:
    """Where the grammar is after some tokens. Immutable to its users: `after` returns a new state."""

    __slots__ = ("_ptr", "_n", "eog", "_one")

    def __init__(self, ptr, n_vocab: int, eog: int):
        self._ptr, self._n, self.eog = ptr, n_vocab, eog
        self._one = np.zeros(1, dtype=_TOKEN_DATA)

    def copy(self) -> GrammarState:
        return GrammarState(L.llama_sampler_clone(self._ptr), self._n, self.eog)

    def after(self, token: int) -> GrammarState:
        """The state after `token`, which must be allowed (llama.cpp aborts on a token its grammar rejects)."""
        state = self.copy()
        L.llama_sampler_accept(state._ptr, token)
        return state

    def allows(self, token: int) -> bool:
        """Whether `token` may come next: the grammar applied to a one-token candidate list (microseconds)."""
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """Which of these tokens may come next: one grammar pass over them as candidates."""
        data = np.zeros(len(ids), dtype=_TOKEN_DATA)
        data["id"] = ids
        self._apply(data)
        return np.isfinite(data["logit"])

    def complete(self) -> bool:
        """The text so far is a whole sentence of the grammar: it allows the end of generation."""
        return self.allows(self.eog)

    def mask(self, row: np.ndarray) -> np.ndarray:
        """The row of logits with every token the grammar rejects at -inf (milliseconds: the whole vocabulary)."""
        n = min(self._n, len(row))  # a draft's row may be shorter (llama.cpp pairs vocabularies within 128 ids)
        data = np.empty(n, dtype=_TOKEN_DATA)
        data["id"] = np.arange(n)
        data["logit"] = row[:n]
        self._apply(data)
        out = np.full(row.shape, -np.inf, dtype=row.dtype)
        out[:n] = data["logit"]
        return out

    def _apply(self, data: np.ndarray) -> None:
        arr = L.llama_token_data_array(data.ctypes.data_as(ctypes.POINTER(L.llama_token_data)), len(data), -1, False)
        L.llama_sampler_apply(self._ptr, ctypes.byref(arr))

    def __del__(self) -> None:
        if self._ptr:
            L.llama_sampler_free(self._ptr)
            self._ptr = None


class Trigger(Protocol):
    """Where a lazy grammar begins (chat/calls.py's Format)."""

    tag: str | None

    def find(self, text: str) -> int: ...  # where the text holds the marker (-1: nowhere)
    def opens(self, text: str) -> int | bool | None: ...  # the answer opens with the grammar: where (None: unknown)


class LazyState:
    """A grammar that applies from its trigger on (tool calls with tool_choice "auto": free text, then a call
    whose arguments satisfy the tool's schema): a marker anywhere (`<tool_call>`), or the grammar's own text
    opening the answer (a call's JSON). What llama.cpp's lazy grammar does, kept here so that a token
    completing the trigger with text the grammar refuses (`<tool_call>` then anything but a call) is refused,
    as the strict grammar refuses a token, rather than aborting the process in llama.cpp's accept. Until the
    trigger every token is allowed, so the end of generation too."""

    __slots__ = ("_g", "_tail", "_head", "_inner", "eog")

    def __init__(self, grammar: Grammar, tail: str, inner: GrammarState | None, head: str | None = ""):
        self._g, self._tail, self._inner = grammar, tail, inner
        self._head = head  # the answer so far while it may still open with the grammar (None: it does not)
        self.eog = grammar._start.eog

    def copy(self) -> LazyState:
        return LazyState(self._g, self._tail, self._inner.copy() if self._inner is not None else None, self._head)

    def _read(self, token: int) -> tuple[str, str | None, GrammarState | None, bool]:
        """(the tail of text kept, the head, the strict state once triggered, whether the grammar allows it)"""
        trigger = self._g.trigger
        piece = self._g.model.piece(token).decode("utf-8", "replace")
        text, head = self._tail + piece, None
        if self._head is not None:
            head = text = self._head + piece
            at = trigger.opens(head)
            if at is None:
                return "", head, None, True
            if at is not False:
                inner = self._g.reads(head[at:])
                return "", None, inner, inner is not None
            head = None
        hit = trigger.find(text)
        if hit < 0:
            keep = len(trigger.tag) - 1 if trigger.tag else 0
            return (text[-keep:] if keep else ""), None, None, True
        inner = self._g.reads(text[hit:])
        return "", None, inner, inner is not None

    def after(self, token: int) -> LazyState:
        if self._inner is not None:
            return LazyState(self._g, "", self._inner.after(token), None)
        tail, head, inner, _ = self._read(token)
        return LazyState(self._g, tail, inner, head)

    def allows(self, token: int) -> bool:
        if self._inner is not None:
            return self._inner.allows(token)
        return self._read(token)[3]

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        if self._inner is not None:
            return self._inner.allowed(ids)
        return np.array([self._read(int(t))[3] for t in ids], dtype=bool)

    def complete(self) -> bool:
        return self._inner.complete() if self._inner is not None else True

    def mask(self, row: np.ndarray) -> np.ndarray:
        if self._inner is not None:
            return self._inner.mask(row)
        out = row.copy()
        for t in self._g.completers():
            if t < len(out) and not self._read(t)[3]:
                out[t] = -np.inf
        return out


def _init(vocab: Any, gbnf: str):
    """(sampler or NULL, llama.cpp's reason when it would not parse). The parser writes its reason to the
    process's stderr itself, not to the log: caught there, so that it is said once, in our words."""
    with tempfile.TemporaryFile() as caught:
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            ptr = L.llama_sampler_init_grammar(vocab, gbnf.encode(), ROOT)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        lines = [line.strip() for line in caught.read().decode("utf-8", "replace").splitlines() if line.strip()]
    why = next(
        (line.split("error parsing grammar: ", 1)[1] for line in lines if "error parsing grammar: " in line),
        lines[0] if lines else native.last_log_error() or "llama.cpp could not parse it",
    )
    return ptr, why + (" the end of the grammar" if why.endswith(" at") else "")


def _file_text(path: str, option: str) -> str:
    p = Path(os.path.expanduser(path))
    if not p.is_file():
        raise UsageError(
            f"{option}: {path} is not a file" + (" nor a JSON object" if option == "--json-schema" else "")
        )
    with p.open("rb") as f:
        return read_text(f, f"{option} {path}", 1 << 20)
