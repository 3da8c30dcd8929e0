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
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

import llama_cpp.llama_cpp as L

from ..errors import SpecdecError
from .context import Context, Rows, Run, by_slot, direct
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
    every row of the batch, the layers side by side (n rows, len(layers) * n_embd), handed to the listener of the
    slot whose sequences they are in (`slots` share the target's context: slot i's sequences are i * per_slot ..),
    with its tokens, positions and sequences (the slot's own ids). A Context's `tap` while a slot listens."""

    def __init__(self, target: Context, layers: tuple[int, ...], slots: int = 1):
        self.target, self.layers = target, layers
        self.per_slot = target.n_seq // slots
        self.n_embd = int(L.llama_model_n_embd(target.model._ptr))
        self.width = len(layers) * self.n_embd
        self.listeners: dict[int, Callable] = {}
        self.seconds = 0.0  # reading the rows (host time the drafter adds to every target decode)

    def attach(self, listener, slot: int = 0) -> None:
        """From the next target decode on, the slot's rows go to `listener(tokens, pos, seqs, rows)`."""
        if self.target.tap is not self:
            if self.target.tap is not None and hasattr(self.target.tap, "detach"):
                self.target.tap.detach()
            for lid in sorted(set(self.layers)):
                _call("set_layer_inp")(self.target._ptr, lid, True)
            self.target.tap = self
        self.listeners[slot] = listener

    def detach(self, slot: int | None = None) -> None:
        """The slot stops listening (None: every slot); the last to stop lets the target stop handing rows out."""
        if slot is None:
            self.listeners.clear()
        else:
            self.listeners.pop(slot, None)
        if not self.listeners and self.target.tap is self:
            for lid in sorted(set(self.layers)):
                _call("set_layer_inp")(self.target._ptr, lid, False)
            self.target.tap = None

    def __call__(self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], out: list[bool]) -> None:
        t0 = time.perf_counter()
        n, e = len(tokens), self.n_embd
        rows = np.empty((n, self.width), np.float32)
        for j, lid in enumerate(self.layers):
            ptr = _call("get_layer_inp")(self.target._ptr, lid)
            if not ptr:
                raise SpecdecError(f"llama.cpp gave no input of layer {lid} for {self.target.model.name}")
            rows[:, j * e : (j + 1) * e] = np.ctypeslib.as_array(ptr, shape=(n, e))
        self.seconds += time.perf_counter() - t0
        for slot, mine in by_slot(seqs, self.per_slot).items():
            listener = self.listeners.get(slot)
            if listener is not None:
                base = slot * self.per_slot
                local = [tuple(s - base for s in seqs[i]) for i in mine]
                listener([tokens[i] for i in mine], [pos[i] for i in mine], local, rows[mine])


class TapSeqs:
    """A slot's view of a LayerTap: its rows go to its listener (on the decoding thread, while llama.cpp's buffers
    hold them: it keeps them), and `drain` runs after each of its target's decodes, on its own thread (a draft fed
    from there decodes through its slot's turn)."""

    def __init__(self, tap: LayerTap, target, slot: int = 0):
        self.tap, self.target, self.slot = tap, target, slot
        self.layers, self.n_embd = tap.layers, tap.n_embd

    @property
    def seconds(self) -> float:
        return self.tap.seconds

    def attach(self, listener, drain) -> None:
        self.tap.attach(listener, self.slot)
        self.target.after = drain

    def detach(self) -> None:
        self.tap.detach(self.slot)
        self.target.after = None


# --- the draft's side ----------------------------------------------------------------------------------------
class DraftContext:
    """A draft's llama.cpp context, linked to the target's (ctx_other: the draft borrows its embeddings and head),
    as long as the target's, a sequence per slot (slot i's: i). Batches are llama.cpp's plain ones, their arrays
    filled by numpy: a row carries a token, an embedding row, or both (EAGLE-3's pairs). Its decodes come in three
    kinds, each a decoder the steps may batch over slots (`by_kind`): an EAGLE-3 encode, rows fed without outputs,
    rows that draft (every row of a batch of them an output row: llama.cpp's eagle3 graph outputs a batch's first
    rows, whichever are asked for). A slot's view of it is a `DraftSeqs`."""

    def __init__(self, model: Model, file: DraftFile, target: Context, n_threads: int, slots: int = 1):
        problem_ = missing()
        if problem_:
            raise SpecdecError(f"this llama-cpp-python lacks {problem_}, which {file.label} drafts need")
        self.model, self.file, self.target, self.slots = model, file, target, slots
        self.dflash2 = file.variant == "dflash2"
        params = L.llama_context_default_params()
        params.n_ctx = target.n_ctx  # as llama.cpp's draft: as many positions as the target's (each slot its share)
        params.n_batch = SPLIT
        params.n_ubatch = SPLIT
        params.n_seq_max = slots
        params.kv_unified = False
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
        self.n_ctx = L.llama_n_ctx(self._ptr) // slots  # a slot's
        self.n_embd = int(L.llama_model_n_embd(model._ptr))
        self.n_vocab = model.n_vocab
        self.n_batch, self.max_outputs = SPLIT, SPLIT
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
        self.by_kind = {kind: _Kind(self, kind) for kind in ("encode", "feed", "draft")}
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

    def decode_parts(self, kind: str, parts: list[Rows]) -> list:
        """ONE llama_decode (llama_encode: kind "encode") of every part's rows, in its sequence: rows that carry
        tokens (part.tokens; None where they carry an embedding row alone), embedding rows (part.embd), or both.
        Each part's outputs, copies: "encode", its g rows; "draft", (logits, nextn rows) of its rows from first_out
        (DFlash2: its lattice, every row's); "feed", nothing."""
        n = sum(len(p.pos) for p in parts)
        if n > SPLIT:
            raise ValueError(f"batch of {n} rows exceeds {SPLIT}")
        b, tokens = self._batch, parts[0].tokens is not None
        b.n_tokens = n
        embd = [p.embd for p in parts if p.embd is not None]
        embd = np.ascontiguousarray(np.concatenate(embd), dtype=np.float32) if embd else None
        b.embd = (
            embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            if embd is not None
            else ctypes.POINTER(ctypes.c_float)()
        )
        if tokens:
            self._tokens[:n] = np.concatenate([p.tokens for p in parts])
            b.token = self._tokens.ctypes.data_as(ctypes.POINTER(L.llama_token))
        else:
            b.token = ctypes.POINTER(L.llama_token)()
        pos = np.concatenate([p.pos for p in parts]).astype(np.int32)
        if not tokens and self.mrope:  # embedding rows: section-major, p, p, p, 0 for each row
            self._pos[: 4 * n] = 0
            for j in range(3):
                self._pos[j * n : (j + 1) * n] = pos
        else:
            self._pos[:n] = pos
        b.pos = self._pos.ctypes.data_as(ctypes.POINTER(L.llama_pos))
        i = 0
        for p in parts:
            m = len(p.pos)
            self._out[i : i + m] = 1 if kind == "encode" else 0
            if kind == "draft":
                self._out[i + p.first_out : i + m] = 1
            for r in range(i, i + m):
                b.seq_id[r][0] = p.seqs[0][0]
            i += m
        t0 = time.perf_counter()
        rc = (L.llama_encode if kind == "encode" else L.llama_decode)(self._ptr, b)
        self.decode_seconds += time.perf_counter() - t0
        self.decodes += 1
        if rc != 0:
            what = "encode" if kind == "encode" else "decode"
            raise SpecdecError(f"llama_{what} failed on {self.file.label} draft {self.model.name} (code {rc})")
        if kind == "feed":
            return [None] * len(parts)
        return self._outputs(kind, parts)

    def _outputs(self, kind: str, parts: list[Rows]) -> list:
        """Each part's outputs of the decode just made (decode_parts)."""
        if kind == "encode" or self.dflash2:
            every = self._nextn_rows(sum(len(p.pos) for p in parts))  # (a row per batch row, in order)
            return np.split(every, np.cumsum([len(p.pos) for p in parts])[:-1])
        out, i = [], 0
        for p in parts:
            m = len(p.pos)
            rows = range(i + p.first_out, i + m)
            logits = np.stack([self._row(L.llama_get_logits_ith, r, self.n_vocab) for r in rows])
            nextn = np.stack([self._row(_call("get_nextn_ith"), r, self.n_embd) for r in rows])
            out.append((logits, nextn))
            i += m
        return out

    def _row(self, get, i: int, width: int) -> np.ndarray:
        ptr = get(self._ptr, i)
        if not ptr:
            raise SpecdecError(f"llama.cpp gave no output for {self.file.label} draft {self.model.name}")
        return np.ctypeslib.as_array(ptr, shape=(width,)).copy()

    def _nextn_rows(self, n: int) -> np.ndarray:
        ptr = _call("get_nextn")(self._ptr)
        if not ptr:
            raise SpecdecError(f"llama.cpp gave no hidden states for {self.file.label} draft {self.model.name}")
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()


class _Kind:
    """One kind of a draft's decodes, as the steps take them (batching/rendezvous.py's Decodes)."""

    def __init__(self, ctx: DraftContext, kind: str):
        self.ctx, self.kind = ctx, kind
        self.n_batch, self.max_outputs = SPLIT, SPLIT

    def decode_parts(self, parts: list[Rows]) -> list:
        return self.ctx.decode_parts(self.kind, parts)


class DraftSeqs:
    """A slot's view of a draft's context (the drafters' `ctx`): its sequence, its decodes handed to `run` (`direct`:
    a command's; a server slot's: through its steps), their outputs kept until its next decode."""

    def __init__(self, ctx: DraftContext, slot: int = 0, run: Run | None = None):
        self.ctx, self.slot, self.run = ctx, slot, run or direct
        self.model, self.file, self.dflash2, self.top_k = ctx.model, ctx.file, ctx.dflash2, ctx.top_k
        self.n_ctx, self.n_embd, self.n_vocab = ctx.n_ctx, ctx.n_embd, ctx.n_vocab
        self._logits = self._nextn = None

    @property
    def decode_seconds(self) -> float:
        return self.ctx.decode_seconds

    @property
    def decodes(self) -> int:
        return self.ctx.decodes

    @contextmanager
    def alone(self) -> Iterator[None]:
        """Its decodes made at once, each by itself (a timing: a slot's thread holds the turn meanwhile)."""
        run, self.run = self.run, direct
        try:
            yield
        finally:
            self.run = run

    def encode(self, features: np.ndarray) -> np.ndarray:
        """EAGLE-3's encoder: g rows (n, n_embd) for the target's feature rows (n, 3 * target n_embd)."""
        out = np.empty((len(features), self.n_embd), np.float32)
        for start in range(0, len(features), SPLIT):
            chunk = features[start : start + SPLIT]
            n = len(chunk)
            # The encoder reads no positions: placeholders after the cache's last, as llama.cpp's.
            first = self.pos_range()[1] + 1
            rows = Rows(None, list(range(first, first + n)), [(self.slot,)] * n, 0, chunk)
            out[start : start + n] = self.run(self.ctx.by_kind["encode"], rows)
        return out

    def decode(self, tokens, pos, embd: np.ndarray | None = None, outputs: str = "last") -> None:
        """Rows at `pos` (tokens, embedding rows or both), in pieces of SPLIT; outputs for the last row ("last"),
        every row ("all"), none ("none", of the last piece alike), or DFlash2's lattice alone ("lattice")."""
        n = len(pos)
        for start in range(0, n, SPLIT):
            end = min(start + SPLIT, n)
            m = end - start
            first = 0 if outputs == "all" else m - 1 if outputs == "last" and end == n else m
            kind = "draft" if first < m or (outputs == "lattice" and end == n) else "feed"
            piece = list(tokens[start:end]) if tokens is not None else None
            rows = Rows(piece, [int(p) for p in pos[start:end]], [(self.slot,)] * m, first)
            rows.embd = embd[start:end] if embd is not None else None
            got = self.run(self.ctx.by_kind[kind], rows)
            if kind == "draft":
                self._logits, self._nextn = got if not self.dflash2 else (None, got)

    def logits(self, i: int) -> np.ndarray:
        """Output row i of the last decode that drafted (-1: the last)."""
        return self._logits[i]

    def prenorm(self, i: int) -> np.ndarray:
        """EAGLE-3: the decoder's pre-norm state at output row i (-1: the last): the next step's g."""
        return self._nextn[i]

    def lattice(self, n: int) -> np.ndarray:
        """DFlash2: the selector's rows (n, n_embd) of the last decode, every row."""
        return self._nextn[:n]

    def forget(self, p0: int) -> None:
        """The cells from position p0 on (-1: all)."""
        L.llama_memory_seq_rm(self.ctx.memory, self.slot, p0, -1)

    def pos_range(self) -> tuple[int, int]:
        return L.llama_memory_seq_pos_min(self.ctx.memory, self.slot), L.llama_memory_seq_pos_max(
            self.ctx.memory, self.slot
        )
