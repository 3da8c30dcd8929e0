"""The model's own draft heads (multi-token prediction, NextN blocks), through llama.cpp's experimental calls.

llama.cpp keeps the calls that read a target's hidden states and run its NextN blocks out of its public header
(src/llama-ext.h); llama-cpp-python binds them in `llama_cpp.llama_cpp_ext`, which it calls experimental. This
is the one module that touches them: `missing` says what a build lacks, `Heads` is the heads' own context
(llama.cpp's MTP context type, linked to the target's) with the tap that reads the target's hidden states.

A head at position p reads (the token at p, the target's hidden state at p - 1: what came out of its last
layer, before the output head) and predicts the token at p + 1. Its one block attends over its own cells of the
earlier positions, so it is fed every committed position it is to remember, as the target is.
"""

from __future__ import annotations

import ctypes
import importlib
import time
from pathlib import Path

import numpy as np

import llama_cpp.llama_cpp as L

from ..errors import SpecdecError
from . import gguf_file, memory
from .context import Context, Rows, Run, by_slot, direct
from .native import last_log_error

CALLS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith")
CHAIN_CALL = "llama_set_nextn_layer_offset"  # chained heads only
FIELDS = (
    ("llama_model_params", "load_mtp"),
    ("llama_context_params", "ctx_type"),
    ("llama_context_params", "ctx_other"),
)
# The architectures whose NextN heads llama.cpp (0.3.36's) runs: they build an MTP graph (LLM_GRAPH_TYPE_DECODER_MTP).
# Others may carry the tensors (glm4, exaone4 load them and never run them).
ARCHITECTURES = frozenset(
    "bailingmoe3 cohere2moe deepseek2 deepseek32 deepseek4 glm-dsa glm4moe glm5-next hy_v3 mimo2 nemotron_h_moe "
    "qwen35 qwen35moe qwen3next step35".split()
)
BATCH = 512  # rows of one heads decode: a round's pairs; a longer catch-up goes in pieces


def missing() -> str | None:
    """What this llama-cpp-python lacks to draft with MTP heads (the first thing), or None."""
    for struct, name in FIELDS:
        if name not in {f for f, _ in getattr(L, struct)._fields_}:
            return f"llama_cpp.{struct}.{name}"
    for name in ("llama_model_n_layer_nextn", "llama_model_n_embd_out", "LLAMA_CONTEXT_TYPE_MTP"):
        if not hasattr(L, name):
            return f"llama_cpp.{name}"
    try:
        ext = _ext()
    except (ImportError, AttributeError) as e:  # its bindings resolve their symbols at import: a missing one raises
        return f"llama_cpp.llama_cpp_ext ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    for name in (*CALLS, CHAIN_CALL):
        if not hasattr(ext, name):
            return f"llama_cpp.llama_cpp_ext.{name}"
    return None


def _ext():
    return importlib.import_module("llama_cpp.llama_cpp_ext")


def heads_in_header(path: Path) -> int:
    """The NextN heads a GGUF carries, from its header alone: {arch}.nextn_predict_layers, where the last that many
    blocks have their heads' tensors (a file may keep the count and leave the heads out: llama.cpp loads it, and
    its heads' graph would abort); 0: none."""
    try:
        h = gguf_file.header(gguf_file.check(path))  # (check first: a FIFO is refused, not read)
    except (SpecdecError, OSError, gguf_file.Malformed):  # not a GGUF it can read: loading it says why
        return 0
    arch = h.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        return 0
    n = gguf_file.int_value(h.metadata, f"{arch}.nextn_predict_layers") or 0
    blocks = gguf_file.int_value(h.metadata, f"{arch}.block_count") or 0
    if not 0 < n <= blocks:
        return 0
    names = {t.name for t in h.tensors}
    parts = ("eh_proj", "enorm", "hnorm")
    whole = all(f"blk.{b}.nextn.{part}.weight" in names for b in range(blocks - n, blocks) for part in parts)
    return n if whole else 0


def unusable(name: str, layers: int, loaded: bool = True) -> tuple[str, str] | None:
    """Why a target's heads cannot draft, and a hint (model `name`, with `layers` heads, `loaded` with them or
    not); None: they can."""
    if not layers:
        return (
            f"{name} has no MTP (NextN) draft heads",
            "`specdec models info` shows mtp_layers; use --drafter auto or lookup, or a --draft model",
        )
    lacks = missing()
    if lacks:
        return (
            f"this llama-cpp-python lacks {lacks}, which drafting with MTP heads needs",
            "install llama-cpp-python 0.3.36 or later (README, Install), or use --drafter auto",
        )
    if not loaded:
        return (
            f"{name} was loaded without its MTP heads (this session's drafter never drafts with them)",
            "start it with --drafter mtp or auto",
        )
    return None


def usable(path: Path) -> bool:
    """Whether the model at `path` has heads this llama-cpp-python can draft with."""
    return heads_in_header(path) > 0 and missing() is None


def kv_bytes(model, n_ctx: int, heads: int) -> int:
    """What the heads' caches take: a sequence per head, each n_ctx positions of every head's block, a block's
    keys and values as one of the target's attention layers' (memory.kv_bytes_per_token's, per layer)."""
    recurrent = len(memory.recurrent_layers(gguf_file.header(model.path))) if model.recurrent else 0
    layers = max(L.llama_model_n_layer(model._ptr) - recurrent, 1)
    return n_ctx * heads * heads * model.kv_bytes_per_token() // layers


class Heads:
    """A target's NextN heads in their own llama.cpp context (type MTP, linked to the target's context), a sequence
    per head for each of `slots` generations (a server's slots share the target's context: slot i's sequences are
    i * n ..): chained heads (head i drafts token i + 1) each keep their own cells of the same positions.

    While a slot listens, the target's decodes also give its output rows' hidden states (its `taken`), which its
    drafter (drafting/mtp.py) feeds here: the target's own computation, nothing decoded twice. A slot's view of it
    is a `HeadSeqs`; its decodes are Rows, one decode each or several slots' at once (`decode_parts`)."""

    def __init__(self, target: Context, n_threads: int, slots: int = 1):
        problem = missing()
        if problem:
            raise SpecdecError(f"this llama-cpp-python lacks {problem}, which MTP drafting needs")
        model = target.model
        self.n = int(L.llama_model_n_layer_nextn(model._ptr))
        if self.n <= 0:
            raise SpecdecError(f"{model.name} has no MTP (NextN) heads")
        self._ext = _ext()
        self.target, self.slots = target, slots
        self.per_slot = target.n_seq // slots  # the target's sequences of one slot
        self.n_embd = int(L.llama_model_n_embd_out(model._ptr)) or int(L.llama_model_n_embd(model._ptr))
        self.n_vocab = target.n_vocab
        params = L.llama_context_default_params()
        # Each head's sequence holds every position of its slot's text: a cache of its own per sequence, as long as
        # a slot's share of the target's (one shared cache of n_ctx cells would fill at 1/n of the context).
        params.n_ctx = target.n_ctx * self.n
        params.n_batch = params.n_ubatch = min(target.n_ctx, BATCH)
        params.n_seq_max = self.n * slots
        params.n_threads = params.n_threads_batch = n_threads
        params.kv_unified = False
        params.swa_full = True  # a rollback must find its cells (as the target's context keeps them)
        params.n_outputs_max = (
            self.n * slots
        )  # a decode's last row of each slot (llama.cpp reserves a row per sequence)
        params.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target._ptr
        self._ptr = L.llama_init_from_model(model._ptr, params)
        if not self._ptr:
            raise SpecdecError(
                f"llama.cpp cannot draft with the MTP heads of {model.name}: {last_log_error() or 'no context'}"
            )
        self._ext.llama_set_embeddings_nextn(self._ptr, True, True)  # a head's own hidden state: the next's input
        self.memory = L.llama_get_memory(self._ptr)
        self.n_batch = L.llama_n_batch(self._ptr)
        self.max_outputs = self.n * slots
        self._batch = L.llama_batch_init(self.n_batch, self.n_embd, 1)
        if not self._batch.embd:
            L.llama_free(self._ptr)
            raise SpecdecError(f"cannot allocate a batch for the MTP heads of {model.name}")
        self._tokens = (L.llama_token * self.n_batch)()  # an embeddings batch has no token array of its own
        self._batch.token = self._tokens
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(self.n_batch, self.n_embd))
        # (pos, seqs, hidden rows) of the target's decodes, per slot: its own sequences' output rows, while it listens
        self.taken: list[list[tuple[list[int], list[tuple[int, ...]], np.ndarray]]] = [[] for _ in range(slots)]
        self._listening: set[int] = set()
        self.by_head = [_HeadDecodes(self, h) for h in range(self.n)]  # a decode takes one head's rows
        self.decode_seconds = 0.0
        self.decodes = 0

    def close(self) -> None:
        if self._ptr:
            for slot in list(self._listening):
                self.detach(slot)
            self._batch.token = ctypes.POINTER(L.llama_token)()  # ours: llama_batch_free must not free it
            L.llama_batch_free(self._batch)
            L.llama_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> Heads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the target's side -------------------------------------------------------------------
    def attach(self, slot: int = 0) -> None:
        """From now on every target decode keeps the hidden states of the slot's output rows in its `taken` (masked:
        the rows the decode outputs logits for, so the last layer still runs on those alone)."""
        if self.target.tap is not self:
            self._ext.llama_set_embeddings_nextn(self.target._ptr, True, True)
            self.target.tap = self
        if slot not in self._listening:
            self._listening.add(slot)
            self.taken[slot].clear()

    def detach(self, slot: int = 0) -> None:
        self._listening.discard(slot)
        self.taken[slot].clear()
        if not self._listening and self.target.tap is self:
            self._ext.llama_set_embeddings_nextn(self.target._ptr, False, False)
            self.target.tap = None

    def __call__(self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], out: list[bool]) -> None:
        """The target decoded: keep the hidden states of its output rows at their positions in their sequences, each
        slot's (a copy: the next decode writes over llama.cpp's buffer), in the slot's own sequence ids."""
        rows = [i for i, o in enumerate(out) if o]
        ptr = self._ext.llama_get_embeddings_nextn(self.target._ptr)
        if not ptr or not rows:
            return
        hidden = np.ctypeslib.as_array(ptr, shape=(len(rows), self.n_embd))
        for slot, mine in by_slot([seqs[i] for i in rows], self.per_slot).items():
            if slot in self._listening:
                base = slot * self.per_slot
                local = [tuple(s - base for s in seqs[rows[j]]) for j in mine]
                self.taken[slot].append(([pos[rows[j]] for j in mine], local, hidden[mine].copy()))

    # --- the heads' side ---------------------------------------------------------------------
    def decode_parts(self, head: int, parts: list[Rows]) -> list[tuple[np.ndarray, np.ndarray]]:
        """ONE decode of head `head` over every part's (token, hidden state) rows, each in its sequences; for each
        part its last row's logits and hidden state (a chained head's, or the next draft token's, input), copies."""
        b, n = self._batch, sum(len(p.tokens) for p in parts)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} rows exceeds the MTP heads' n_batch {self.n_batch}")
        b.n_tokens, i, last = n, 0, []
        for p in parts:
            for j, (t, pos, seqs) in enumerate(zip(p.tokens, p.pos, p.seqs)):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos, 1, j == len(p.tokens) - 1
                b.seq_id[i][0] = seqs[0]
                i += 1
            self._embd[i - len(p.tokens) : i] = p.embd
            last.append(i - 1)
        if self.n > 1:
            self._ext.llama_set_nextn_layer_offset(self._ptr, head)
        t0 = time.perf_counter()
        rc = L.llama_decode(self._ptr, b)
        self.decode_seconds += time.perf_counter() - t0
        self.decodes += 1
        if rc != 0:
            raise SpecdecError(f"llama_decode failed on the MTP heads of {self.target.model.name} (code {rc})")
        out = []
        for i in last:
            logits = L.llama_get_logits_ith(self._ptr, i)
            h = self._ext.llama_get_embeddings_nextn_ith(self._ptr, i)
            if not logits or not h:
                raise SpecdecError(f"llama.cpp gave no output for the MTP heads of {self.target.model.name}")
            out.append(
                (
                    np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).copy(),
                    np.ctypeslib.as_array(h, shape=(self.n_embd,)).copy(),
                )
            )
        return out


class _HeadDecodes:
    """One head's decodes, as the steps take them (batching/rendezvous.py's Decodes): several slots' rows at once."""

    def __init__(self, heads: Heads, head: int):
        self.heads, self.head = heads, head
        self.n_batch, self.max_outputs = heads.n_batch, heads.max_outputs

    def decode_parts(self, parts: list[Rows]) -> list[tuple[np.ndarray, np.ndarray]]:
        return self.heads.decode_parts(self.head, parts)


class HeadSeqs:
    """A slot's heads: its sequences of `heads` (slot * n ..), its rows of the target's decodes, its decodes handed to
    `run` (one decode each: `direct`; a server's: its slot's, through the steps)."""

    def __init__(self, heads: Heads, slot: int = 0, run: Run | None = None):
        self.heads, self.slot, self.run = heads, slot, run or direct
        self.n, self.n_embd, self.n_vocab, self.target = heads.n, heads.n_embd, heads.n_vocab, heads.target
        self.n_batch = heads.n_batch

    @property
    def taken(self) -> list:
        return self.heads.taken[self.slot]

    @property
    def decode_seconds(self) -> float:
        return self.heads.decode_seconds

    def attach(self) -> None:
        self.heads.attach(self.slot)

    def detach(self) -> None:
        self.heads.detach(self.slot)

    def decode(self, head: int, tokens: list[int], pos0: int, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Head `head` over (tokens[i], hidden[i]) at positions pos0.. in its sequence; returns the last row's
        logits and that row's hidden state (a chained head's, or the next draft token's, input). Longer than a
        batch: the earlier pieces first."""
        seq = (self.slot * self.n + head,)
        for start in range(0, len(tokens), self.n_batch):
            end = min(start + self.n_batch, len(tokens))
            piece = tokens[start:end]
            rows = Rows(piece, list(range(pos0 + start, pos0 + end)), [seq] * len(piece), len(piece) - 1)
            rows.embd = hidden[start:end]
            got = self.run(self.heads.by_head[head], rows)
        return got

    def forget(self, p0: int) -> None:
        """Every head's cells from position p0 on (-1: all)."""
        for s in range(self.slot * self.n, (self.slot + 1) * self.n):
            L.llama_memory_seq_rm(self.heads.memory, s, p0, -1)

    def pos_range(self, head: int) -> tuple[int, int]:
        s = self.slot * self.n + head
        return L.llama_memory_seq_pos_min(self.heads.memory, s), L.llama_memory_seq_pos_max(self.heads.memory, s)

    def time_one(self, passes: int = 5) -> float:
        """Seconds per one-row decode of head 0 (the fastest of `passes`), on its emptied cells (emptied after)."""
        self.forget(-1)
        best = float("inf")
        rows = Rows([0], [0], [(self.slot * self.n,)], 0, np.zeros((1, self.n_embd), np.float32))
        try:
            for _ in range(passes):
                t0 = time.perf_counter()
                self.heads.decode_parts(0, [rows])
                best = min(best, time.perf_counter() - t0)
                self.forget(-1)
        finally:
            self.forget(-1)
        return best
