"""A llama.cpp context and its reusable batch: its own KV cache shared by forkable sequences, and exact
mode's kernel settings. It satisfies the engine's Context protocol (engine/context.py)."""

from __future__ import annotations

import ctypes
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import numpy as np

import llama_cpp.llama_cpp as L

from ..engine.context import ALONE, StepFigures
from ..errors import SpecdecError
from . import devices
from .native import Model, last_log_error, native_lib

# Mesa's software Vulkan drivers (lavapipe's device is "llvmpipe (LLVM ...)"): ggml-vulkan's flash attention crashes
# lavapipe 22.3 inside llama_decode once a sequence's tail has been removed and refilled a few times (SIGSEGV in the
# driver's own thread). llama.cpp alone does it too: scripts/vulkan_fa_replay.py.
SOFTWARE_VULKAN = ("llvmpipe", "SwiftShader")


def flash_attention_crashes(model: Model) -> bool:
    """Whether the model's layers run on a software Vulkan device, where flash attention must stay off."""
    offload = model.offload
    if offload is not None and offload.n_gpu_layers == 0:
        return False
    on = offload.devices if offload is not None else devices.default()
    return any(d.name.startswith("Vulkan") and d.description.startswith(SOFTWARE_VULKAN) for d in on)


def in_one_sequence(n: int, pos0: int, seq_id: int, outputs: str | int) -> tuple[list[int], list[tuple[int, ...]], int]:
    """`decode`'s n tokens as `decode_tree` takes them: their positions, their sequence, the first row out."""
    return list(range(pos0, pos0 + n)), [(seq_id,)] * n, {"all": 0, "last": n - 1}.get(outputs, outputs)


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


@dataclass(eq=False)
class Rows:
    """One generation's rows in a decode of several (batching/rendezvous.py's Part is one): tokens at their
    positions in their sequences (the context's own ids), outputs for tokens[first_out:]; for a companion of the
    target's (MTP heads, an EAGLE-3 or DFlash draft), an embedding row per token and what kind of decode."""

    tokens: list[int]
    pos: list[int]
    seqs: list[tuple[int, ...]]
    first_out: int
    embd: np.ndarray | None = None


class Decoder(Protocol):
    """A context that decodes several parts in one decode (a target's or a draft model's Context; a companion's
    decodes of one kind): what batching/rendezvous.py's steps hand parts to."""

    n_batch: int
    max_outputs: int

    def decode_parts(self, parts: list[Rows]) -> list: ...


# How a companion of the target's hands a decode over: `direct` (a command's), or a server slot's, through its steps.
Run = Callable[[Decoder, Rows], Any]


def direct(decoder: Decoder, rows: Rows):
    """One decode of `rows` alone, now."""
    return decoder.decode_parts([rows])[0]


def by_slot(seqs: list[tuple[int, ...]], per_slot: int) -> dict[int, list[int]]:
    """Row indices by the slot whose sequences they are in (slot i's are i * per_slot ..; a row is in one slot's)."""
    out: dict[int, list[int]] = {}
    for i, ss in enumerate(seqs):
        out.setdefault(ss[0] // per_slot, []).append(i)
    return out


class Tap(Protocol):
    """What listens to a context's decodes (mtp.Heads, hidden.LayerTap): called after each, with every row's token,
    position and sequences and whether it gave an output, while llama.cpp's buffers hold that decode's."""

    def __call__(self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], out: list[bool]) -> None: ...


class Context:
    """One llama.cpp context: its own KV cache shared by up to `n_seq` forkable sequences.

    For a model loaded with exact=True every row a decode returns is the row a decode of that token
    alone returns, bit for bit, whatever the batch around it (on CPU backends): flash attention on
    (without it the attention matmuls are batch-shaped), ggml's reference kernels (ReferenceKernels;
    `prompt_kernels` lifts them for the prompt), and, when the model has sgemm weights
    (native.SGEMM_TYPES), no decode of a single row: a lone token gets a twin in a scratch
    sequence, so that every product goes through the same sgemm. Rows then differ only if their KV
    cells are visited in a different order: the engine keeps the target's cells in position order
    (speculative.Settings.ordered_cells)."""

    def __init__(
        self, model: Model, *, n_ctx: int, n_threads: int, n_seq: int = 2, max_outputs: int = 64, snapshots: int = 0
    ):
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
        self.max_outputs = max_outputs  # rows one decode may return (a step of several requests': batching/)
        # Exact mode's lone tokens get a twin in sequence n_seq (one more output row too).
        self._twin_seq = n_seq if model.exact and model.sgemm_weights else None
        if flash_attention_crashes(model):
            params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
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
                f"{last_log_error() or 'out of memory?'}",
                hint="try a smaller -c/--ctx-size",
            )
        # Exact mode's twin takes a cell of its own beside the lone token's: the text has one cell fewer.
        self.n_ctx = L.llama_n_ctx(self._ptr) - (self._twin_seq is not None)
        # A decode of n_batch tokens has no room for a twin: exact mode's batches are one token shorter.
        self.n_batch = L.llama_n_batch(self._ptr) - (self._twin_seq is not None)
        self.n_vocab = model.n_vocab
        self.n_seq = n_seq
        # Tokens of its last decode a sequence can drop: any number of KV cells, or as many as llama.cpp
        # keeps recurrent-state snapshots of (0: none; a deeper rollback clears the sequence: kv.Sequence).
        self.max_rollback = None if model.rollback == "cells" else L.llama_n_rs_seq(self._ptr)
        self.memory = L.llama_get_memory(self._ptr)
        # Whether cells may move to other positions: a draft's window slides this way (drafting/window.py). Not
        # where layers attend over a sliding window of their own: llama.cpp prunes those cells by position.
        shifts = self.max_rollback is None and model.sliding_window == 0
        self.can_shift = shifts and bool(L.llama_memory_can_shift(self.memory))
        self._batch = Batch(L.llama_n_batch(self._ptr), n_seq)
        self._reference = ReferenceKernels(self._ptr) if model.exact else None
        # Exact mode: backends that are not the CPU, whose kernels are their own (README: Exact output).
        self.other_backends = self._reference.others if self._reference else 0
        self.decode_seconds = 0.0  # time inside llama_decode, to tell model cost from our overhead
        self.last_step: StepFigures = ALONE
        self.tap: Tap | None = None  # reads what each decode leaves in llama.cpp's buffers (the MTP heads' rows...)
        self.after: Callable[[], None] | None = None  # runs after each decode_tree, on its caller's thread

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
        return self.decode_tree(tokens, *in_one_sequence(len(tokens), pos0, seq_id, outputs))

    def decode_tree(
        self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], first_out: int = 0
    ) -> np.ndarray:
        """Decode tokens at their own positions, each in one or more sequences (a token shared by several
        branches of a tree is computed once). Rows for tokens[first_out:], as in `decode`."""
        n = len(tokens)
        first_out = min(max(first_out, 0), n - 1)
        rows = self._decode(tokens, pos, seqs, [i >= first_out for i in range(n)])
        if self.after is not None:
            self.after()
        return rows

    def decode_parts(self, parts: list[Rows]) -> list[np.ndarray]:
        """ONE decode of several generations' parts (batching/rendezvous.py): each part's rows, views into llama.cpp's
        buffer as a lone decode's are. They hold until this context's next decode, which comes only once every running
        generation has handed over its next part: each has read its rows by then, as the engine reads a lone
        context's before its next decode (copying them cost a server's lone client about 1% of its rate)."""
        tokens, pos, seqs, out, sizes = [], [], [], [], []
        for p in parts:
            first = min(max(p.first_out, 0), len(p.tokens) - 1)
            tokens += p.tokens
            pos += p.pos
            seqs += p.seqs
            out += [i >= first for i in range(len(p.tokens))]
            sizes.append(len(p.tokens) - first)
        rows = self._decode(tokens, pos, seqs, out)
        return np.split(rows, np.cumsum(sizes)[:-1])

    def _decode(self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], out: list[bool]) -> np.ndarray:
        """One llama_decode; the logits rows of the tokens `out` marks, in order (a view into llama.cpp's buffer)."""
        n, n_out = len(tokens), sum(out)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch {self.n_batch}")
        given = (tokens, pos, seqs, out)
        twin = self._twin_seq is not None and n_out == 1
        if twin:  # one output row: its twin makes the output matmul (and a lone token's every one) two wide
            last = out.index(True)
            tokens, pos, seqs, out = (
                [*tokens, tokens[last]],
                [*pos, pos[last]],
                [*seqs, (self._twin_seq,)],
                [*out, True],
            )
        self._batch.fill(tokens, pos, seqs, out)
        t0 = time.perf_counter()
        try:
            rc = L.llama_decode(self._ptr, self._batch.raw)
        finally:
            if twin:
                self.seq_rm(self._twin_seq, -1, -1)  # its cell is free again, for the next position
        seconds = time.perf_counter() - t0
        self.decode_seconds += seconds
        self.last_step = StepFigures(n, n, seconds)
        if rc != 0:
            why = {1: "no free slot in the KV cache (context full)", 2: "aborted"}.get(rc, f"code {rc}")
            raise SpecdecError(f"llama_decode failed on {self.model.name}: {why}")
        if self.tap is not None:
            self.tap(*given)  # (an exact-mode twin is the batch's last row: not the tap's)
        ptr = L.llama_get_logits(self._ptr)
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))  # (a twin's row comes after them)

    def seq_state(self, seq: int) -> ctypes.Array:
        """llama.cpp's state of a sequence's cells (a prefix cache's block)."""
        size = L.llama_state_seq_get_size(self._ptr, seq)
        buf = (ctypes.c_uint8 * size)()
        if L.llama_state_seq_get_data(self._ptr, buf, size, seq) != size:
            raise OSError("llama.cpp could not copy the cells")
        return buf

    def set_seq_state(self, state: bytearray, seq: int) -> int:
        """Read a sequence's cells back from `state` (seq_state's); how many bytes llama.cpp read."""
        buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
        return L.llama_state_seq_set_data(self._ptr, buf, len(state), seq)

    # --- KV memory: used through kv.Sequence, which owns the bookkeeping ---------------------
    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        return bool(L.llama_memory_seq_rm(self.memory, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        L.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        L.llama_memory_seq_keep(self.memory, seq)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        L.llama_memory_seq_add(self.memory, seq, p0, p1, delta)

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(min, max) position the cache holds for `seq`; (-1, -1) when empty."""
        return (L.llama_memory_seq_pos_min(self.memory, seq), L.llama_memory_seq_pos_max(self.memory, seq))


class Batch:
    """A llama_batch allocated once and refilled for every decode (no per-round allocation)."""

    def __init__(self, capacity: int, n_seq: int):
        self.raw = L.llama_batch_init(capacity, 0, n_seq)
        self._live = True

    def fill(self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], out: list[bool]) -> None:
        """tokens[i] at pos[i] in seqs[i]; logits for the tokens `out` marks."""
        b = self.raw
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = pos[i]
            b.n_seq_id[i] = len(seqs[i])
            for j, s in enumerate(seqs[i]):
                b.seq_id[i][j] = s
            b.logits[i] = out[i]

    def close(self) -> None:
        if self._live:
            L.llama_batch_free(self.raw)
            self._live = False
