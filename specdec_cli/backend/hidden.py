"""Drafts trained on a target's hidden states: EAGLE-3 and DFlash (DFlash2 where the file has its selector), on
llama.cpp's side: the target's layer inputs, read after each of its decodes (`LayerTap`), and the draft's own context
(`DraftContext`), linked to the target's (its embeddings and output head, where the draft borrows them). What a draft
file is, and whether it fits a target: draft_files.py. The calls that read layer inputs live in
llama.cpp's staging header (src/llama-ext.h), exported under C++-mangled names: bound here by ctypes.

The runtime conventions are llama.cpp's (common/speculative.cpp, the reference the drafters in drafting/ follow):
an EAGLE-3 draft encodes the target's features at position p into g[p] (`encode`), and its decoder takes
(token at p + 1, g[p]) at p; a DFlash draft has every committed position's features injected into its cache
(`inject`) and drafts a block [last, MASK, ...] in one non-causal decode (`decode`).
"""

from __future__ import annotations

import ctypes
import functools
import time

import numpy as np

import llama_cpp.llama_cpp as L

from ..errors import SpecdecError
from .context import Context
from .draft_files import DraftFile
from .native import Model, last_log_error, native_lib

SPLIT = 512  # rows of one draft decode or encode (llama.cpp's n_ubatch): longer batches go in pieces

# name: (C++-mangled symbol, argument types, result type)
_SYMBOLS = {
    "set_layer_inp": ("_Z30llama_set_embeddings_layer_inpP13llama_contextjb", [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None),
    "get_layer_inp": ("_Z30llama_get_embeddings_layer_inpP13llama_contextj", [ctypes.c_void_p, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float)),
    "set_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb", [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None),
    "get_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context", [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)),
    "get_nextn_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)),
    "selector_top_k": ("_Z33llama_model_dflash_selector_top_kPK11llama_model", [ctypes.c_void_p], ctypes.c_int32),
}  # fmt: skip


@functools.cache
def _calls() -> dict[str, ctypes._CFuncPtr] | str:
    """The staging calls, bound; or the first one this llama.cpp build lacks (its name)."""
    lib = native_lib()
    if lib is None:
        return "libllama (not found beside llama_cpp)"
    bound = {}
    for name, (symbol, args, result) in _SYMBOLS.items():
        try:
            f = getattr(lib, symbol)
        except AttributeError:
            return symbol
        f.argtypes, f.restype = args, result
        bound[name] = f
    return bound


def missing() -> str | None:
    """What this llama-cpp-python lacks to run these drafts (the first thing), or None."""
    calls = _calls()
    if isinstance(calls, str):
        return calls
    for name in ("llama_vocab_mask", "llama_set_causal_attn", "llama_encode"):
        if not hasattr(L, name):
            return f"llama_cpp.{name}"
    if "ctx_other" not in {f for f, _ in L.llama_context_params._fields_}:
        return "llama_cpp.llama_context_params.ctx_other"
    return None


def _call(name: str):
    calls = _calls()
    if isinstance(calls, str):
        raise SpecdecError(f"this llama-cpp-python lacks {calls}, which EAGLE-3 and DFlash drafts need")
    return calls[name]


# --- the target's side ---------------------------------------------------------------------------------------
class LayerTap:
    """The target's layer inputs at `layers` (a draft's order; a layer may repeat), read after each of its decodes:
    every row of the batch, the layers side by side (n rows, len(layers) * n_embd), handed to `listener` with the
    batch's tokens, positions and sequences. A Context's `tap` while attached."""

    def __init__(self, target: Context, layers: tuple[int, ...]):
        self.target, self.layers = target, layers
        self.n_embd = int(L.llama_model_n_embd(target.model._ptr))
        self.width = len(layers) * self.n_embd
        self.listener = None
        self.seconds = 0.0  # reading the rows (host time the drafter adds to every target decode)

    def attach(self, listener) -> None:
        """From the next target decode on, its rows go to `listener(tokens, pos, seqs, rows)`."""
        if self.target.tap is not self:
            if self.target.tap is not None and hasattr(self.target.tap, "detach"):
                self.target.tap.detach()
            for lid in sorted(set(self.layers)):
                _call("set_layer_inp")(self.target._ptr, lid, True)
            self.target.tap = self
        self.listener = listener

    def detach(self) -> None:
        if self.target.tap is self:
            for lid in sorted(set(self.layers)):
                _call("set_layer_inp")(self.target._ptr, lid, False)
            self.target.tap = None
        self.listener = None

    def __call__(self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], first_out: int) -> None:
        t0 = time.perf_counter()
        n, e = len(tokens), self.n_embd
        rows = np.empty((n, self.width), np.float32)
        for j, lid in enumerate(self.layers):  # (an exact-mode twin, if any, is the batch's last row: not read)
            ptr = _call("get_layer_inp")(self.target._ptr, lid)
            if not ptr:
                raise SpecdecError(f"llama.cpp gave no input of layer {lid} for {self.target.model.name}")
            rows[:, j * e : (j + 1) * e] = np.ctypeslib.as_array(ptr, shape=(n, e))
        self.seconds += time.perf_counter() - t0
        if self.listener is not None:
            self.listener(tokens, pos, seqs, rows)


# --- the draft's side ----------------------------------------------------------------------------------------
class DraftContext:
    """A draft's llama.cpp context, linked to the target's (ctx_other: the draft borrows its embeddings and head),
    as long as the target's, one sequence. Batches are llama.cpp's plain ones, their arrays filled by numpy: a row
    carries a token, an embedding row, or both (EAGLE-3's pairs)."""

    def __init__(self, model: Model, file: DraftFile, target: Context, n_threads: int):
        problem_ = missing()
        if problem_:
            raise SpecdecError(f"this llama-cpp-python lacks {problem_}, which {file.label} drafts need")
        self.model, self.file, self.target = model, file, target
        self.dflash2 = file.variant == "dflash2"
        params = L.llama_context_default_params()
        params.n_ctx = target.n_ctx  # as llama.cpp's draft: as many positions as the target's
        params.n_batch = SPLIT
        params.n_ubatch = SPLIT
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = n_threads
        params.swa_full = True
        params.ctx_other = target._ptr
        self._ptr = L.llama_init_from_model(model._ptr, params)
        if not self._ptr:
            raise SpecdecError(
                f"llama.cpp cannot open a context for {file.label} draft {model.name}: {last_log_error() or 'no context'}"
            )
        # EAGLE-3: the encoder's g rows and the decoder's pre-norm state; DFlash2: its selector lattice (every row).
        _call("set_nextn")(self._ptr, True, not self.dflash2)
        if file.arch == "dflash":
            causal = model.meta("dflash.attention.causal") == "true"
            L.llama_set_causal_attn(self._ptr, causal)  # the block attends both ways unless the file says otherwise
        self.top_k = int(_call("selector_top_k")(model._ptr)) if self.dflash2 else 0
        self.memory = L.llama_get_memory(self._ptr)
        self.n_ctx = L.llama_n_ctx(self._ptr)
        self.n_embd = int(L.llama_model_n_embd(model._ptr))
        self.n_vocab = model.n_vocab
        self.mrope = L.llama_model_rope_type(model._ptr) == L.LLAMA_ROPE_TYPE_MROPE
        self._batch = L.llama_batch_init(SPLIT, 0, 1)
        b = self._batch  # llama_batch_free frees its own arrays: ours (numpy's) are set per decode, its own put back
        # (as addresses: a pointer read off a ctypes struct is a view of the field, and would follow our changes)
        self._own = [ctypes.cast(p, ctypes.c_void_p).value for p in (b.token, b.pos, b.logits)]
        self._tokens = np.zeros(SPLIT, np.int32)
        self._pos = np.zeros(4 * SPLIT, np.int32)  # M-RoPE embedding rows carry 4 positions each
        self._out = np.zeros(SPLIT, np.int8)
        b.logits = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        for i in range(SPLIT):
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
        self.decode_seconds = 0.0
        self.decodes = 0

    def close(self) -> None:
        if self._ptr:
            b = self._batch
            token, pos, logits = self._own
            b.token = ctypes.cast(token, ctypes.POINTER(L.llama_token))
            b.pos = ctypes.cast(pos, ctypes.POINTER(L.llama_pos))
            b.logits = ctypes.cast(logits, ctypes.POINTER(ctypes.c_int8))
            b.embd = ctypes.POINTER(ctypes.c_float)()
            L.llama_batch_free(b)
            L.llama_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> DraftContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, encode: bool, n: int, tokens, pos, embd: np.ndarray | None, out) -> None:
        """One llama_decode (llama_encode: EAGLE-3's encoder) of n rows, each a token (tokens), an embedding row
        (embd), or both, at `pos`; `out`: which rows give outputs."""
        b = self._batch
        b.n_tokens = n
        if tokens is not None:
            self._tokens[:n] = tokens
            b.token = self._tokens.ctypes.data_as(ctypes.POINTER(L.llama_token))
        else:
            b.token = ctypes.POINTER(L.llama_token)()
        if embd is not None:
            embd = np.ascontiguousarray(embd, dtype=np.float32)
            b.embd = embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        else:
            b.embd = ctypes.POINTER(ctypes.c_float)()
        if embd is not None and tokens is None and self.mrope:  # section-major: p, p, p, 0 for each row
            self._pos[: 4 * n] = 0
            for j in range(3):
                self._pos[j * n : (j + 1) * n] = pos
        else:
            self._pos[:n] = pos
        b.pos = self._pos.ctypes.data_as(ctypes.POINTER(L.llama_pos))
        self._out[:n] = out
        t0 = time.perf_counter()
        rc = (L.llama_encode if encode else L.llama_decode)(self._ptr, b)
        self.decode_seconds += time.perf_counter() - t0
        self.decodes += 1
        if rc != 0:
            what = "encode" if encode else "decode"
            raise SpecdecError(f"llama_{what} failed on {self.file.label} draft {self.model.name} (code {rc})")

    def encode(self, features: np.ndarray) -> np.ndarray:
        """EAGLE-3's encoder: g rows (n, n_embd) for the target's feature rows (n, 3 * target n_embd)."""
        out = np.empty((len(features), self.n_embd), np.float32)
        for start in range(0, len(features), SPLIT):
            chunk = features[start : start + SPLIT]
            n = len(chunk)
            # The encoder reads no positions: placeholders after the cache's last, as llama.cpp's.
            first = L.llama_memory_seq_pos_max(self.memory, 0) + 1
            self._run(True, n, None, np.arange(first, first + n), chunk, 1)
            out[start : start + n] = self._nextn_rows(n)
        return out

    def decode(self, tokens, pos, embd: np.ndarray | None = None, outputs: str = "last") -> None:
        """Rows at `pos` (tokens, embedding rows or both), in pieces of SPLIT; outputs for the last row ("last"),
        every row ("all") or none ("none", of the last piece alike)."""
        n = len(pos)
        for start in range(0, n, SPLIT):
            end = min(start + SPLIT, n)
            out = np.zeros(end - start, np.int8)
            if outputs == "all":
                out[:] = 1
            elif outputs == "last" and end == n:
                out[-1] = 1
            self._run(
                False,
                end - start,
                tokens[start:end] if tokens is not None else None,
                pos[start:end],
                embd[start:end] if embd is not None else None,
                out,
            )

    def logits(self, i: int) -> np.ndarray:
        """Output row i's logits (-1: the last output), a view valid until the next decode."""
        ptr = L.llama_get_logits_ith(self._ptr, i)
        if not ptr:
            raise SpecdecError(f"llama.cpp gave no logits for {self.file.label} draft {self.model.name}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def prenorm(self, i: int) -> np.ndarray:
        """EAGLE-3: the decoder's pre-norm state at output row i (-1: the last), a copy: the next step's g."""
        ptr = _call("get_nextn_ith")(self._ptr, i)
        if not ptr:
            raise SpecdecError(f"llama.cpp gave no hidden state for {self.file.label} draft {self.model.name}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def lattice(self, n: int) -> np.ndarray:
        """DFlash2: the selector's rows (n, n_embd) of the last decode, every row (a copy)."""
        return self._nextn_rows(n)

    def _nextn_rows(self, n: int) -> np.ndarray:
        ptr = _call("get_nextn")(self._ptr)
        if not ptr:
            raise SpecdecError(f"llama.cpp gave no hidden states for {self.file.label} draft {self.model.name}")
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()

    def forget(self, p0: int) -> None:
        """The cells from position p0 on (-1: all)."""
        L.llama_memory_seq_rm(self.memory, 0, p0, -1)

    def pos_range(self) -> tuple[int, int]:
        return L.llama_memory_seq_pos_min(self.memory, 0), L.llama_memory_seq_pos_max(self.memory, 0)
