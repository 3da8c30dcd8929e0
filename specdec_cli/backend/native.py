"""Owners of llama.cpp's native handles: a model, a context, a reusable batch.

Only the low-level API (`llama_cpp.llama_cpp`) is used: the high-level `Llama` class cannot turn on
a unified multi-sequence KV cache and keeps an n_ctx x n_vocab scores buffer we do not want.
Freeing order: batch, then context, then model (a context borrows its model's weights).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import secrets
import sys
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

import llama_cpp.llama_cpp as L

from .. import signals
from ..errors import SpecdecError
from . import gguf_file, memory

# llama.cpp logs every load step to stderr; we keep the recent error lines to explain failures instead.
_LOG_LINES: deque[str] = deque(maxlen=40)
_LOG_ERROR = 4  # GGML_LOG_LEVEL_ERROR; 5 (CONT) continues any level, e.g. the load progress dots


@L.llama_log_callback
@signals.native_callback
def _log_to_buffer(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", "replace").strip() if level == _LOG_ERROR and text else ""
    if line:
        _LOG_LINES.append(line)


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
@signals.native_callback
def _on_abort(message: bytes | None) -> None:
    """ggml's last call before abort() (a failed GGML_ASSERT): one line and exit 1, instead of a
    debugger backtrace on stdout and a core dump. The message is "path/file.cpp:line: what"."""
    try:
        where, _, what = (message or b"").decode("utf-8", "replace").partition(": ")
        text = f"{os.path.basename(where)}: {what}" if what else where
        line = f"error: llama.cpp aborted: {' '.join(text.split())}\n"
        rpc = sys.modules.get(__package__ + ".rpc")  # a lost RPC server is llama.cpp's abort too
        explained = rpc.abort_message(" ".join(text.split())) if rpc else None
        if explained:
            line = f"error: {explained[0]}\nhint: {explained[1]}\n"
        os.write(2, line.encode())
    finally:
        os._exit(1)


def _set_abort_handler() -> None:
    """Hand _on_abort to ggml_set_abort_callback; a build without the hook is left as it is.

    The symbol is looked up through libllama, opened by the path llama_cpp opened it by (so the same
    handle): the wheel ships libggml-base.so and libggml-base.so.0 as separate copies, and opening
    one by name could load a second ggml whose callback nobody calls (see native_lib)."""
    setter = getattr(native_lib(), "ggml_set_abort_callback", None)
    if setter is not None:
        setter.argtypes, setter.restype = [type(_on_abort)], ctypes.c_void_p
        setter(_on_abort)  # the module keeps _on_abort alive for the process's lifetime


@functools.cache
def native_lib() -> ctypes.CDLL | None:
    """libllama, opened by the path llama_cpp opened it by (so the same handle): the wheel ships
    libggml-base.so and libggml-base.so.0 as separate copies, and opening one by name could load a
    second ggml that nobody else calls. A handle's lookup also searches the libraries it depends on,
    where the ggml that libllama uses is."""
    lib_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(L.__file__).parent / "lib")
    for name in ("libllama.so", "libllama.dylib", "llama.dll", "libllama.dll"):  # llama_cpp's names
        try:
            return ctypes.CDLL(str(lib_dir / name))
        except OSError:
            continue
    return None


class ReferenceKernels:
    """ggml's reference mode on a context's CPU backends, on or off (`ggml_backend_cpu_set_use_ref`).

    In reference mode each row of a batch is computed the way a batch of one computes it: no tiled
    matmul (>= 8 rows), no split-KV flash attention (a single query row over >= 512 cells), no tiled
    flash attention, no fused ops. llama.cpp's API does not reach a context's backends, so its
    scheduler is found through the C++ method llama_context::get_sched."""

    def __init__(self, ctx_ptr) -> None:
        lib = native_lib()
        try:
            get_sched = lib._ZNK13llama_context9get_schedEv
            n_backends, get_backend = lib.ggml_backend_sched_get_n_backends, lib.ggml_backend_sched_get_backend
            is_cpu, self._set = lib.ggml_backend_is_cpu, lib.ggml_backend_cpu_set_use_ref
        except AttributeError as e:  # lib is None, or a build without one of them
            raise SpecdecError(
                f"--exact needs ggml's reference CPU kernels, which this llama.cpp build does not expose ({e})",
                hint="reinstall llama-cpp-python (README, Install), or run without --exact",
            ) from None
        get_sched.argtypes, get_sched.restype = [ctypes.c_void_p], ctypes.c_void_p
        n_backends.argtypes, n_backends.restype = [ctypes.c_void_p], ctypes.c_int
        get_backend.argtypes, get_backend.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_void_p
        is_cpu.argtypes, is_cpu.restype = [ctypes.c_void_p], ctypes.c_bool
        self._set.argtypes, self._set.restype = [ctypes.c_void_p, ctypes.c_bool], None
        sched = get_sched(ctx_ptr)
        backends = [get_backend(sched, i) for i in range(n_backends(sched))]
        self.cpus = [b for b in backends if is_cpu(b)]
        self.others = len(backends) - len(self.cpus)  # GPU and other backends: their kernels are their own
        self.set(True)

    def set(self, on: bool) -> None:
        for backend in self.cpus:
            self._set(backend, on)


_backend_ready = False


def init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        # Quiet unless SPECDEC_LLAMA_LOG asks for llama.cpp's own output: its log, and the gdb backtrace
        # it prints on stdout for an uncaught C++ exception (std::terminate, which no callback sees).
        if not os.environ.get("SPECDEC_LLAMA_LOG"):
            L.llama_log_set(_log_to_buffer, ctypes.c_void_p(0))
            os.environ.setdefault("GGML_NO_BACKTRACE", "1")
        _set_abort_handler()
        L.llama_backend_init()
        _backend_ready = True


def _last_log_error() -> str:
    return _LOG_LINES[-1] if _LOG_LINES else ""


def _load_error() -> str:
    """llama.cpp's own reason for a failed load. It logs `llama_model_load: error loading model: <why>`,
    then a generic `failed to load model`; when <why> is only "failed to load model from PATH" (a GGUF
    it could not parse), the parser's first error line says why."""
    marker = "error loading model: "
    why = next((line.partition(marker)[2] for line in reversed(_LOG_LINES) if marker in line), "")
    if not why or "failed to load model from" in why:
        why = next((line for line in _LOG_LINES if line.startswith("gguf_")), why or _last_log_error())
    # Without the C function in front ("check_tensor_dims: tensor ...") and the column padding.
    return " ".join(re.sub(r"^\w+: ", "", why).split())


class Model:
    """A GGUF model's weights and vocabulary. Use as a context manager.

    exact: load it for exact mode (see Context): weights as the file has them. Repacked weights
    (llama.cpp's default on CPU) are multiplied by one kernel for a single row and by another for
    batches of four and more, which sum in different orders."""

    def __init__(self, path: str | Path, *, exact: bool = False, devices: list[int] | None = None):
        self.path = gguf_file.check(path)
        init_backend()
        _LOG_LINES.clear()
        params = L.llama_model_default_params()
        params.use_extra_bufts = not exact
        # devices: where the layers go (ggml_backend_dev_t; [] keeps them on this CPU); None: llama.cpp's
        # default, every GPU and every RPC server this process registered.
        self._devices = None if devices is None else (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
        if self._devices is not None:
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        self.exact = exact
        # Matrices whose product for one row is summed differently than for two or more.
        self.sgemm_weights = gguf_file.sgemm_weights(self.path) if exact else []
        self._ptr = L.llama_model_load_from_file(os.fsencode(self.path), params)  # any bytes a path may hold
        if not self._ptr:
            raise SpecdecError(
                f"cannot load model {self.path}: {_load_error() or 'llama.cpp could not load it'}",
                hint="the file may be truncated or from an unsupported architecture; re-download it",
            )
        self.vocab = L.llama_model_get_vocab(self._ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = L.llama_model_n_ctx_train(self._ptr)
        self._pieces: dict[int, bytes] = {}
        self._max_token_bytes: int | None = None

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
    def recurrent(self) -> bool:
        """A recurrent or hybrid model: part of its cache is one state per sequence, not a cell per token."""
        return bool(L.llama_model_is_recurrent(self._ptr) or L.llama_model_is_hybrid(self._ptr))

    @functools.cached_property
    def rollback(self) -> str:
        """How its cache drops a rejected tail: "cells", "snapshots" or "none" (memory.rollback)."""
        return memory.rollback(self) if self.recurrent else "cells"

    def rollback_problem(self) -> str | None:
        """Why this model's cache cannot drop a partial tail (a target must, to speculate), or None."""
        if self.rollback != "none":
            return None
        kind = "hybrid (recurrent + attention)" if L.llama_model_is_hybrid(self._ptr) else "recurrent"
        return f"its architecture ({self.architecture}, {kind}) keeps a state that llama.cpp cannot roll back"

    @property
    def sliding_window(self) -> int:
        """Tokens a sliding-window attention layer sees (0: none)."""
        return max(L.llama_model_n_swa(self._ptr), 0)

    def state_bytes(self) -> int:
        """Bytes of one recurrent state of one sequence (0 for attention-only models); llama.cpp keeps
        1 + n_rs_seq of them per sequence."""
        return memory.state_bytes(self.path) if self.recurrent else 0

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one context position takes (F16 keys and values, every attention layer)."""
        return memory.kv_bytes_per_token(self)

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

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Text to token ids; `special` adds BOS (when the model wants it) and parses control tokens."""
        return self._tokenize(text, add_special=special, parse_special=special)

    def _tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        raw = text.encode("utf-8")
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
            buf = ctypes.create_string_buffer(64)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self.vocab, token))

    def chat_tokens(self, messages: list[tuple[str, str]]) -> list[int]:
        """The chat template around (role, content) messages, tokenized so that only the template's own
        markup can become control tokens: the contents are tokenized as text, so a prompt that contains
        `<|im_start|>system` stays text and cannot open a turn of its own.

        Contents without control-token text are tokenized with the template in one piece, as always (a
        SentencePiece vocabulary adds a space prefix at every cut). Otherwise the template is rendered with
        a random mark in place of each content and cut there: markup pieces are parsed for special tokens,
        contents are not."""
        if all(
            self._tokenize(c, add_special=False, parse_special=True)
            == self._tokenize(c, add_special=False, parse_special=False)
            for _, c in messages
        ):
            return self.tokenize(self.apply_chat_template(messages), special=True)
        marks = [f"\x1f{secrets.token_hex(8)}\x1f" for _ in messages]
        contents = {mark: content for mark, (_, content) in zip(marks, messages)}
        rendered = self.apply_chat_template([(role, mark) for mark, (role, _) in zip(marks, messages)])
        tokens: list[int] = []
        for i, piece in enumerate(re.split("(" + "|".join(map(re.escape, marks)) + ")", rendered)):
            if piece in contents:
                tokens += self._tokenize(contents[piece], add_special=False, parse_special=False)
            elif piece or i == 0:  # the first piece carries BOS, when the model wants one
                tokens += self._tokenize(piece, add_special=i == 0, parse_special=True)
        return tokens

    def apply_chat_template(self, messages: list[tuple[str, str]]) -> str:
        """Render (role, content) messages with the model's own template, ready for the reply."""
        tmpl = L.llama_model_chat_template(self._ptr, None)
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
            raise SpecdecError(
                f"{self.name}: llama.cpp does not recognise its chat template",
                hint="use --no-chat and write the prompt in the model's format yourself",
            )
        return buf.raw[:n].decode("utf-8", "replace")


class Context:
    """One llama.cpp context: its own KV cache shared by up to `n_seq` forkable sequences.

    For a model loaded with exact=True every row a decode returns is the row a decode of that token
    alone returns, bit for bit, whatever the batch around it (on CPU backends): flash attention on
    (without it the attention matmuls are batch-shaped), ggml's reference kernels (ReferenceKernels;
    `prompt_kernels` lifts them for the prompt), and, when the model has sgemm weights
    (gguf_file.SGEMM_TYPES), no decode of a single row: a lone token gets a twin in a scratch
    sequence, so that every product goes through the same sgemm. Rows then differ only if their KV
    cells are visited in a different order: the engine keeps the target's cells in position order
    (speculative.Settings.ordered_cells)."""

    def __init__(
        self, model: Model, *, n_ctx: int, n_threads: int, n_seq: int = 2, max_outputs: int = 64, snapshots: int = 0
    ):  # fmt: skip
        """snapshots: recurrent-state snapshots per sequence (llama.cpp's n_rs_seq), so that a recurrent or
        hybrid cache can drop up to that many tokens of its last decode (`max_rollback`)."""
        self.model = model
        params = L.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = min(n_ctx, 2048)
        params.n_ubatch = min(n_ctx, 512)
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = n_threads
        # seq_cp between sequences needs one buffer for all of them.
        params.kv_unified = True
        # Sliding-window layers would evict cells that a rollback must be able to return to.
        params.swa_full = True
        params.n_rs_seq = snapshots if model.rollback == "snapshots" else 0
        # We read logits for at most a verify batch; the default (n_batch) reserves 1 GB+ of
        # output buffers with a 150k vocabulary.
        params.n_outputs_max = max_outputs
        # Exact mode's lone tokens get a twin in sequence n_seq (one more output row too).
        self._twin_seq = n_seq if model.exact and model.sgemm_weights else None
        if model.exact:
            params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
            # A GPU build sends batches of 32+ rows to the GPU even for weights in host memory; keep the
            # CPU's layers on the CPU's (reference) kernels.
            params.op_offload = False
            params.n_seq_max = n_seq + (self._twin_seq is not None)
            params.n_outputs_max = max_outputs + 1
        self._ptr = L.llama_init_from_model(model._ptr, params)
        if not self._ptr:
            raise SpecdecError(
                f"cannot create a llama.cpp context for {model.name} (n_ctx={n_ctx}): "
                f"{_last_log_error() or 'out of memory?'}",
                hint="try a smaller -c/--ctx-size",
            )
        self.n_ctx = L.llama_n_ctx(self._ptr)
        # A decode of n_batch tokens has no room for a twin: exact mode's batches are one token shorter.
        self.n_batch = L.llama_n_batch(self._ptr) - (self._twin_seq is not None)
        self.n_vocab = model.n_vocab
        self.n_seq = n_seq
        # Tokens of its last decode a sequence can drop: any number of KV cells, or as many as llama.cpp
        # keeps recurrent-state snapshots of (0: none; a deeper rollback clears the sequence: kv.Sequence).
        self.max_rollback = None if model.rollback == "cells" else L.llama_n_rs_seq(self._ptr)
        self.memory = L.llama_get_memory(self._ptr)
        self._batch = Batch(L.llama_n_batch(self._ptr), n_seq)
        self._reference = ReferenceKernels(self._ptr) if model.exact else None
        # Exact mode: backends that are not the CPU, whose kernels are their own (README: Exact output).
        self.other_backends = self._reference.others if self._reference else 0
        self.decode_seconds = 0.0  # time inside llama_decode, to tell model cost from our overhead

    def close(self) -> None:
        if self._ptr:
            self._batch.close()
            L.llama_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def prompt_kernels(self) -> Iterator[None]:
        """Exact mode: decodes inside use the fast kernels (tiled, about 3x faster on a long prompt). For
        the prompt, which every run of a prompt decodes alike; never for a token that a batch verifies."""
        if self._reference is None:
            yield
            return
        self._reference.set(False)
        try:
            yield
        finally:
            self._reference.set(True)

    def decode(self, tokens: list[int], pos0: int, seq_id: int, outputs: str | int) -> np.ndarray:
        """Decode `tokens` at positions pos0.. and return their logits rows, shape (n_out, n_vocab).

        outputs: "last" (one row), "all" (a row per token), or i: rows for tokens[i:]. The rows are a
        view into llama.cpp's buffer, valid until the next decode: read them, never keep them.
        """
        n = len(tokens)
        first = {"all": 0, "last": n - 1}.get(outputs, outputs)
        return self.decode_tree(tokens, list(range(pos0, pos0 + n)), [(seq_id,)] * n, first)

    def decode_tree(
        self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], first_out: int = 0
    ) -> np.ndarray:
        """Decode tokens at their own positions, each in one or more sequences (a token shared by several
        branches of a tree is computed once). Rows for tokens[first_out:], as in `decode`."""
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch {self.n_batch}")
        first_out = min(max(first_out, 0), n - 1)
        twin = self._twin_seq is not None and first_out == n - 1
        if twin:  # one output row: its twin makes the output matmul (and a lone token's every one) two wide
            tokens, pos, seqs = [*tokens, tokens[-1]], [*pos, pos[-1]], [*seqs, (self._twin_seq,)]
        self._batch.fill(tokens, pos, seqs, first_out)
        t0 = time.perf_counter()
        try:
            rc = L.llama_decode(self._ptr, self._batch.raw)
        finally:
            if twin:
                self.seq_rm(self._twin_seq, -1, -1)  # its cell is free again, for the next position
        self.decode_seconds += time.perf_counter() - t0
        if rc != 0:
            why = {1: "no free slot in the KV cache (context full)", 2: "aborted"}.get(rc, f"code {rc}")
            raise SpecdecError(f"llama_decode failed on {self.model.name}: {why}")
        ptr = L.llama_get_logits(self._ptr)
        return np.ctypeslib.as_array(ptr, shape=(n - first_out, self.n_vocab))

    # --- KV memory: used through kv.Sequence, which owns the bookkeeping ---------------------
    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        return bool(L.llama_memory_seq_rm(self.memory, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        L.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        L.llama_memory_seq_keep(self.memory, seq)

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(min, max) position the cache holds for `seq`; (-1, -1) when empty."""
        return (L.llama_memory_seq_pos_min(self.memory, seq), L.llama_memory_seq_pos_max(self.memory, seq))


class Batch:
    """A llama_batch allocated once and refilled for every decode (no per-round allocation)."""

    def __init__(self, capacity: int, n_seq: int):
        self.capacity = capacity
        self.raw = L.llama_batch_init(capacity, 0, n_seq)
        self._live = True

    def fill(self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], first_out: int) -> None:
        """tokens[i] at pos[i] in seqs[i]; logits for tokens[first_out:] (and always the last)."""
        b = self.raw
        n = len(tokens)
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = pos[i]
            b.n_seq_id[i] = len(seqs[i])
            for j, s in enumerate(seqs[i]):
                b.seq_id[i][j] = s
            b.logits[i] = i >= first_out
        b.logits[n - 1] = True

    def close(self) -> None:
        if self._live:
            L.llama_batch_free(self.raw)
            self._live = False
