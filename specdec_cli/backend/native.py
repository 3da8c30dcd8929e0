"""llama.cpp's library (loaded once, its log and aborts caught) and the owner of a model's handle.
Contexts are in context.py.

Only the low-level API (`llama_cpp.llama_cpp`) is used: the high-level `Llama` class cannot turn on
a unified multi-sequence KV cache and keeps an n_ctx x n_vocab scores buffer we do not want.
Freeing order: batch, then context, then model (a context borrows its model's weights).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Protocol

import llama_cpp.llama_cpp as L

from .. import signals
from ..errors import SpecdecError
from . import cpu, gguf_file, memory


class Placement(Protocol):
    """Where a model's layers go (devices.Offload: -ngl, -dev, -sm, -ts, -mg): it sets llama_model_params and returns
    the arrays the params then point at, which must live as long as the model."""

    def apply(self, params) -> tuple: ...


# Who can say more of an abort than ggml's own line (rpc.py: a lost RPC server): "file.cpp: what" -> (line, hint).
_ABORT_EXPLAINERS: list[Callable[[str], tuple[str, str] | None]] = []

# llama.cpp logs every load step to stderr; we keep the recent error lines to explain failures instead, and while
# a model or context is made (`capture`), the lines that say where its buffers went (devices.placement reads them).
_LOG_LINES: deque[str] = deque(maxlen=40)
_LOG_ERROR = 4  # GGML_LOG_LEVEL_ERROR; 5 (CONT) continues any level, e.g. the load progress dots
_PLACEMENT = (b"load_tensors:", b"llama_kv_cache:", b"llama_memory_recurrent:", b"sched_reserve:", b"llama_context:")
_captures: list[list[str]] = []  # the captures under way, innermost last
_forward = [False]  # SPECDEC_LLAMA_LOG: every line to stderr as well, as llama.cpp's own logger writes it


@L.llama_log_callback
@signals.native_callback
def _log_to_buffer(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # Called for every line llama.cpp and ggml log: a prefix test and an append at most, unless forwarding.
    if not text:
        return
    if _forward[0]:
        try:
            os.write(2, text)
        except OSError:  # stderr closed: nothing to tell
            pass
    if level == _LOG_ERROR:
        line = text.decode("utf-8", "replace").strip()
        if line:
            _LOG_LINES.append(line)
    elif _captures and text.startswith(_PLACEMENT):
        _captures[-1].append(text.decode("utf-8", "replace"))


@contextmanager
def capture() -> Iterator[list[str]]:
    """The placement lines llama.cpp logs inside the block (a model's load, a context's creation)."""
    lines: list[str] = []
    _captures.append(lines)
    try:
        yield lines
    finally:
        _captures.remove(lines)


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
@signals.native_callback
def _on_abort(message: bytes | None) -> None:
    """ggml's last call before abort() (a failed GGML_ASSERT): one line and exit 1, instead of a
    debugger backtrace on stdout and a core dump. The message is "path/file.cpp:line: what"."""
    try:
        where, _, what = (message or b"").decode("utf-8", "replace").partition(": ")
        text = f"{os.path.basename(where)}: {what}" if what else where
        line = f"error: llama.cpp aborted: {' '.join(text.split())}\n"
        explained = next(filter(None, (explain(" ".join(text.split())) for explain in _ABORT_EXPLAINERS)), None)
        if explained:
            line = f"error: {explained[0]}\nhint: {explained[1]}\n"
        os.write(2, line.encode())
    finally:
        os._exit(1)


def explain_aborts(explain: Callable[[str], tuple[str, str] | None]) -> None:
    """Have ggml's aborts explained by `explain` where it knows them (the one line and hint, else None)."""
    _ABORT_EXPLAINERS.append(explain)


def _set_abort_handler() -> None:
    """Hand _on_abort to ggml_set_abort_callback, looked up through libllama (native_lib says why); a build
    without the hook is left as it is."""
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


_backend_ready = False


def init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        # Quiet unless SPECDEC_LLAMA_LOG asks for llama.cpp's own output: its log (forwarded by our callback,
        # which reads the placement lines either way), and the gdb backtrace it prints on stdout for an uncaught
        # C++ exception (std::terminate, which no callback sees).
        _forward[0] = bool(os.environ.get("SPECDEC_LLAMA_LOG"))
        L.llama_log_set(_log_to_buffer, ctypes.c_void_p(0))
        if not _forward[0]:
            os.environ.setdefault("GGML_NO_BACKTRACE", "1")
        _set_abort_handler()
        L.llama_backend_init()
        _backend_ready = True


def last_log_error() -> str:
    return _LOG_LINES[-1] if _LOG_LINES else ""


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


def _load_error() -> str:
    """llama.cpp's own reason for a failed load. It logs `llama_model_load: error loading model: <why>`,
    then a generic `failed to load model`; when <why> is only "failed to load model from PATH" (a GGUF
    it could not parse), the parser's first error line says why."""
    marker = "error loading model: "
    why = next((line.partition(marker)[2] for line in reversed(_LOG_LINES) if marker in line), "")
    if not why or "failed to load model from" in why:
        why = next((line for line in _LOG_LINES if line.startswith("gguf_")), why or last_log_error())
    # Without the C function in front ("check_tensor_dims: tensor ...") and the column padding.
    return " ".join(re.sub(r"^\w+: ", "", why).split())


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
        _LOG_LINES.clear()
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
                f"cannot load model {self.path}: {_load_error() or 'llama.cpp could not load it'}",
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
