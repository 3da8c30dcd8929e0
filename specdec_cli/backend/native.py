"""The owner of a model's handle (the library itself, its log and aborts: library.py). Contexts are in context.py.

Only the low-level API (`llama_cpp.llama_cpp`) is used: the high-level `Llama` class cannot turn on
a unified multi-sequence KV cache and keeps an n_ctx x n_vocab scores buffer we do not want.
Freeing order: batch, then context, then model (a context borrows its model's weights).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Protocol

import llama_cpp.llama_cpp as L

from ..errors import SpecdecError
from . import cpu, gguf_file, memory
from .library import capture, clear_log, explain_aborts, init_backend, last_log_error, load_error, native_lib  # noqa: F401


class Placement(Protocol):
    """Where a model's layers go (devices.Offload: -ngl, -dev, -sm, -ts, -mg): it sets llama_model_params and returns
    the arrays the params then point at, which must live as long as the model."""

    def apply(self, params) -> tuple: ...


# ggml types that an x86 CPU build multiplies with llamafile's sgemm when a matmul has two or more
# columns (batch rows), and with ggml's own vec_dot when it has one: the two sum in different orders.
SGEMM_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 6: "Q5_0", 8: "Q8_0", 20: "IQ4_NL", 30: "BF16"}


def sgemm_weights(path: Path) -> list[str]:
    """The matrices of `path` whose products depend on a batch having one row or more (SGEMM_TYPES).
    token_embd is only looked up by row (get_rows) unless the model has no output matrix of its own."""
    tensors = gguf_file.header(path).tensors
    names = {t.name for t in tensors}
    return [
        t.name
        for t in tensors
        if sum(d > 1 for d in t.shape) >= 2
        and t.ggml_type in SGEMM_TYPES
        and not (t.name == "token_embd.weight" and "output.weight" in names)
    ]


class Model:
    """A GGUF model's weights and vocabulary. Use as a context manager.

    exact: load it for exact mode (see Context): weights as the file has them. Repacked weights
    (llama.cpp's default on CPU) are multiplied by one kernel for a single row and by another for
    batches of four and more, which sum in different orders."""

    def __init__(
        self,
        path: str | Path,
        *,
        exact: bool = False,
        offload: Placement | None = None,
        vocab_only: bool = False,
        heads: bool = False,
    ):
        """offload: where its layers go (devices.Offload: -ngl, -dev, -sm, -ts, -mg); None: llama.cpp's defaults.
        vocab_only: its vocabulary and hyperparameters, not its weights (milliseconds: what a model is, and
        whether it pairs, before deciding to load it); it tokenizes, but makes no context. heads: also load its
        MTP (NextN) heads, where it has them (llama.cpp skips their weights otherwise)."""
        self.path = gguf_file.check(path)
        init_backend()
        clear_log()
        params = L.llama_model_default_params()
        params.use_extra_bufts = not exact and not cpu.amx()  # cpu.amx says why
        params.vocab_only = vocab_only
        self.heads = heads  # (the caller checked that this llama-cpp-python can: backend/mtp.missing)
        if heads:
            params.load_mtp = True
        # The arrays llama_model_params points at (devices, tensor_split), alive as long as the model.
        self.offload = offload
        self._arrays = offload.apply(params) if offload is not None else ()
        self.exact = exact
        # Matrices whose product for one row is summed differently than for two or more.
        self.sgemm_weights = sgemm_weights(self.path) if exact else []
        with capture() as lines:
            self._ptr = L.llama_model_load_from_file(os.fsencode(self.path), params)  # any bytes a path may hold
        self.load_log = lines  # where llama.cpp put its buffers (devices.placement)
        if not self._ptr:
            raise SpecdecError(
                f"cannot load model {self.path}: {load_error() or 'llama.cpp could not load it'}",
                hint="the file may be truncated or from an unsupported architecture; re-download it",
            )
        self.vocab_only = vocab_only
        self.vocab = L.llama_model_get_vocab(self._ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        if vocab_only:  # llama.cpp reads no hyperparameters then: the header says
            meta = gguf_file.header(self.path).metadata
            self.n_ctx_train = gguf_file.int_value(meta, f"{meta.get('general.architecture')}.context_length") or 0
        else:
            self.n_ctx_train = L.llama_model_n_ctx_train(self._ptr)
        self._pieces: dict[int, bytes] = {}
        self._max_token_bytes: int | None = None
        self._control_texts: frozenset[str] | None = None

    def close(self) -> None:
        if self._ptr:
            L.llama_model_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- facts about the model -------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = L.llama_model_meta_val_str(self._ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def describe(self) -> str:
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self._ptr, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    @property
    def architecture(self) -> str:
        return self.meta("general.architecture") or "unknown"

    @property
    def weight_bytes(self) -> int:
        """Bytes of its tensors (a split model's parts together): what a one-token decode reads at most."""
        return L.llama_model_size(self._ptr)

    @property
    def n_layer(self) -> int:
        """Its repeating layers (llama.cpp offloads these and the output layer)."""
        return L.llama_model_n_layer(self._ptr)

    @property
    def recurrent(self) -> bool:
        """A recurrent or hybrid model: part of its cache is one state per sequence, not a cell per token."""
        return bool(L.llama_model_is_recurrent(self._ptr) or L.llama_model_is_hybrid(self._ptr))

    @functools.cached_property
    def rollback(self) -> str:
        """How its cache drops a rejected tail: "cells", "snapshots" or "none" (memory.rollback)."""
        return memory.rollback(self._ptr, self.name) if self.recurrent else "cells"

    def rollback_problem(self) -> str | None:
        """Why this model's cache cannot drop a partial tail (a target must, to speculate), or None."""
        if self.rollback != "none":
            return None
        kind = "hybrid (recurrent + attention)" if L.llama_model_is_hybrid(self._ptr) else "recurrent"
        return f"its architecture ({self.architecture}, {kind}) keeps a state that llama.cpp cannot roll back"

    @property
    def sliding_window(self) -> int:
        """Tokens a sliding-window attention layer sees (0: none)."""
        if self.vocab_only:  # no hyperparameters read: the header says
            meta = gguf_file.header(self.path).metadata
            return gguf_file.int_value(meta, f"{meta.get('general.architecture')}.attention.sliding_window") or 0
        return max(L.llama_model_n_swa(self._ptr), 0)

    def state_bytes(self) -> int:
        """Bytes of one recurrent state of one sequence (0 for attention-only models); llama.cpp keeps
        1 + n_rs_seq of them per sequence."""
        return memory.state_bytes(self.path) if self.recurrent else 0

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one context position takes (F16 keys and values, every attention layer)."""
        if self.vocab_only:
            return memory.kv_bytes_in_header(self.path)
        return memory.kv_bytes_per_token(self._ptr, self.meta, self.path if self.recurrent else None)

    def chat_template(self) -> str | None:
        tmpl = L.llama_model_chat_template(self._ptr, None)
        return tmpl.decode("utf-8", "replace") if tmpl else None

    # --- tokens ------------------------------------------------------------------------------
    def max_token_bytes(self) -> int:
        """An upper bound on the bytes one token stands for: the longest token text (byte-level BPE and
        SentencePiece spell a byte with one to six characters, never fewer bytes). Computed once, on demand."""
        if self._max_token_bytes is None:
            self._max_token_bytes = max(len(L.llama_vocab_get_text(self.vocab, i) or b"") for i in range(self.n_vocab))
        return self._max_token_bytes

    def control_texts(self) -> frozenset[str]:
        """The texts that tokenizing with parse_special reads as one token and without it as text: the control
        and unknown tokens' (llama.cpp's tokenizer_st_partition; user-defined ones are read either way)."""
        if self._control_texts is None:
            parsed = L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_UNKNOWN
            ids = (i for i in range(self.n_vocab) if L.llama_vocab_get_attr(self.vocab, i) & parsed)
            self._control_texts = frozenset(t for i in ids if (t := self.token_text(i)))
        return self._control_texts

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Text to token ids; `special` adds BOS (when the model wants it) and parses control tokens."""
        return self.tokenize_text(text, add_special=special, parse_special=special)

    def tokenize_text(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self.tokenize_bytes(text.encode("utf-8"), add_special=add_special, parse_special=parse_special)

    def tokenize_bytes(self, raw: bytes, *, add_special: bool, parse_special: bool) -> list[int]:
        """Bytes to token ids, as they are: llama.cpp reads an invalid UTF-8 sequence as U+FFFD (byte-level BPE)
        or as byte tokens (SentencePiece's byte fallback)."""
        cap = len(raw) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (control tokens render as nothing); cached."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self._pieces[token] = self._piece(token, special=False)
        return cached

    def render(self, tokens: list[int]) -> bytes:
        """Tokens as text, control tokens by their texts (`<|im_start|>`): a prompt as another vocabulary reads it."""
        return b"".join(self._piece(token, special=True) for token in tokens)

    def _piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:  # too long for the buffer: -n is the size needed
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self.vocab, token))

    def is_control(self, token: int) -> bool:
        """A control or unknown token: not text (its piece is empty, or a placeholder)."""
        return bool(
            L.llama_vocab_get_attr(self.vocab, token) & (L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_UNKNOWN)
        )

    def end_of_turn(self) -> int:
        """The token that ends an answer: end-of-turn where the vocabulary has one, else end-of-text (-1: neither)."""
        eot = L.llama_vocab_eot(self.vocab)
        return eot if eot >= 0 else L.llama_vocab_eos(self.vocab)

    @functools.cached_property
    def space_prefix(self) -> bool:
        """Whether tokenizing text adds a space before it (SentencePiece's dummy prefix: Llama 2, Mistral 7B v0.1)."""
        tokens = self.tokenize_bytes(b"a", add_special=False, parse_special=False)
        return b"".join(self.piece(t) for t in tokens) == b" a"

    def token_text(self, token: int) -> str:
        """A special token's text as templates write it (`bos_token`); "" for none."""
        if token < 0:
            return ""
        return (L.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", "replace")

    def fim_tokens(self) -> dict[str, int | None]:
        """The fill-in-the-middle tokens (pre, suf, mid, rep: the repository's name, sep: a file's), None
        for each the vocabulary lacks: llama.cpp's, read from the GGUF's ids or found by their texts."""
        get = {"pre": L.llama_vocab_fim_pre, "suf": L.llama_vocab_fim_suf, "mid": L.llama_vocab_fim_mid}
        get |= {"rep": L.llama_vocab_fim_rep, "sep": L.llama_vocab_fim_sep}
        return {name: (t if (t := f(self.vocab)) >= 0 else None) for name, f in get.items()}

    def bos(self) -> int:
        return L.llama_vocab_bos(self.vocab)

    def add_bos(self) -> bool:
        return bool(L.llama_vocab_get_add_bos(self.vocab))

    def special_texts(self) -> tuple[str, str]:
        """The BOS and EOS tokens' texts, as chat templates name them."""
        return self.token_text(L.llama_vocab_bos(self.vocab)), self.token_text(L.llama_vocab_eos(self.vocab))

    def builtin_chat(self, messages: list[tuple[str, str]]) -> str | None:
        """(role, content) messages by llama.cpp's built-in renderer, ready for the reply; None where it does
        not know the model's template."""
        tmpl = L.llama_model_chat_template(self._ptr, None)
        if tmpl is None:
            return None
        chat = (L.llama_chat_message * len(messages))()
        keep = []  # the C strings must outlive the call
        for i, (role, content) in enumerate(messages):
            r, c = role.encode(), content.encode()
            keep += [r, c]
            chat[i].role, chat[i].content = r, c
        size = sum(len(c) for c in keep) * 2 + 256
        buf = ctypes.create_string_buffer(size)
        n = L.llama_chat_apply_template(tmpl, chat, len(messages), True, buf, size)
        if n > size:
            buf = ctypes.create_string_buffer(n)
            n = L.llama_chat_apply_template(tmpl, chat, len(messages), True, buf, n)
        if n < 0:
            return None
        return buf.raw[:n].decode("utf-8", "replace")
