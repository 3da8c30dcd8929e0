"""Drafts trained on a target's hidden states: EAGLE-3 and DFlash (DFlash2 where the file has its selector).

What a draft file says of itself (`DraftFile`, from its header alone) and whether it fits a target (`problem`,
before llama.cpp sees the pair: llama.cpp aborts on most mismatches); then the llama.cpp side: the target's layer
inputs, read after each of its decodes (`LayerTap`), and the draft's own context (`DraftContext`), linked to the
target's (its embeddings and output head, where the draft borrows them). The calls that read layer inputs live in
llama.cpp's staging header (src/llama-ext.h), exported under C++-mangled names: bound here by ctypes.

The runtime conventions are llama.cpp's (common/speculative.cpp, the reference the drafters in drafting/ follow):
an EAGLE-3 draft encodes the target's features at position p into g[p] (`encode`), and its decoder takes
(token at p + 1, g[p]) at p; a DFlash draft has every committed position's features injected into its cache
(`inject`) and drafts a block [last, MASK, ...] in one non-causal decode (`decode`).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import llama_cpp.llama_cpp as L

from ..errors import SpecdecError
from . import gguf_file
from .context import Context
from .native import Model, last_log_error, native_lib

KINDS = ("eagle3", "dflash")  # general.architecture of the drafts this module runs
# Targets whose graphs hand out their layers' inputs (llama.cpp sets res->t_layer_inp[il] in src/models/ for these):
# any other (qwen2, gemma3, ...) aborts the process when asked for one.
# (qwen4exp sets them too, but hyper-connection wide: llama.cpp asserts a row is n_embd wide when it reads them)
FEEDS = frozenset(
    "bailingmoe3 deepseek4 gemma4 gpt-oss hunyuan_vl lfm2 llama mimo2 minimax-01 minimax-m2 muse-glimmer nanbeige "
    "nemotron_h qwen3 qwen35 qwen35moe qwen3moe qwen3next".split()
)
# Of those, the ones whose graphs also hand out the final layer's output as "layer n_layer" (a DFlash draft may read it).
FEEDS_LAST = frozenset("deepseek4 mimo2 nemotron_h".split())
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


# --- the file ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftFile:
    """An EAGLE-3 or DFlash draft, as its header describes it."""

    path: Path
    arch: str  # "eagle3" | "dflash"
    variant: str  # arch, or "dflash2" (a selector over candidates), "dspark" (a Markov head)
    layers: tuple[int, ...]  # the target layers whose inputs it reads (llama.cpp's ids: HF's + 1), in its order
    hidden: int | None  # the target hidden size it was made for (EAGLE-3: target_hidden_size; DFlash: its own width)
    n_embd: int | None  # its own width
    n_layer: int | None
    block: int | None  # DFlash: the trained block (its drafts are block - 1 tokens at most)
    mask: int | None  # DFlash: the mask token's id
    own_head: bool  # has its own output head (else it borrows the target's)
    n_vocab: int = 0  # its vocabulary's size (the target's: it carries the target's tokenizer)
    bad_d2t: str | None = None  # what is wrong with its d2t map (draft rows -> target ids), read from the file
    embd_rows: int | None = None  # rows of its own token embeddings (None: it borrows the target's)

    @property
    def label(self) -> str:
        return {"eagle3": "EAGLE-3", "dflash": "DFlash", "dflash2": "DFlash2", "dspark": "DSpark"}[self.variant]

    @property
    def max_draft(self) -> int | None:
        """The longest draft it makes (DFlash: its block less the anchor; EAGLE-3: a chain, as long as asked)."""
        return self.block - 1 if self.block else None


def read(path: Path) -> DraftFile | None:
    """The draft `path` describes, where its architecture is one of KINDS; None for any other model (or a file
    that is not a GGUF: loading it says why)."""
    try:
        h = gguf_file.header(gguf_file.check(path))
    except (SpecdecError, OSError, gguf_file.Malformed):
        return None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        fields = describe(h.metadata, {t.name for t in h.tensors}, d2t_problem(data, h), embd_rows(h))
    return DraftFile(path=Path(path), **fields) if fields is not None else None


def embd_rows(h: gguf_file.Header) -> int | None:
    """The rows of a file's own token embeddings (None: it has none)."""
    t = next((t for t in h.tensors if t.name == "token_embd.weight"), None)
    return t.shape[1] if t is not None and len(t.shape) == 2 else None


def d2t_problem(data, h: gguf_file.Header) -> str | None:
    """What is wrong with a reduced draft vocabulary's map to target ids (d2t, I64; `data`: the file's bytes), each
    id checked to be one: llama.cpp scatters the draft's logits by it unchecked. None: none, or nothing wrong."""
    t = next((t for t in h.tensors if t.name == "d2t"), None)
    if t is None:
        return None
    tokens = h.metadata.get("tokenizer.ggml.tokens")
    n_vocab = tokens.length if isinstance(tokens, gguf_file.Array) else 0
    if t.ggml_type != 27 or len(t.shape) != 1:  # GGML_TYPE_I64
        return "its d2t map is not a vector of 64-bit ids"
    head = next((x for x in h.tensors if x.name == "output.weight"), None)
    rows = head.shape[1] if head is not None and len(head.shape) == 2 else n_vocab  # (else the target's head)
    if t.shape[0] != rows:  # llama.cpp asserts they agree, in the graph
        return f"its d2t map has {t.shape[0]:,} ids for an output head of {rows:,} rows"
    ids = np.frombuffer(data, np.int64, count=t.shape[0], offset=h.data_offset + t.offset)
    if ids.size and not (0 <= int(ids.min()) and int(ids.max()) < n_vocab):
        return f"its d2t map names token ids outside its vocabulary of {n_vocab:,}"
    return None


def describe(meta: dict, names: set[str], bad_d2t: str | None = None, embd_rows: int | None = None) -> dict | None:
    """DraftFile's fields but its path, from a header's metadata and tensor names (None: not one of KINDS), what
    d2t_problem found and the rows of its own token_embd (None: none)."""
    arch = meta.get("general.architecture")
    if arch not in KINDS:
        return None
    ids = meta.get(f"{arch}.target_layers")
    layers = tuple(int(i) for i in ids.items) if isinstance(ids, gguf_file.Array) and ids.items else ()
    n_embd = gguf_file.int_value(meta, f"{arch}.embedding_length")
    variant = arch
    if arch == "dflash" and "markov_w1.weight" in names:
        variant = "dspark"
    elif arch == "dflash" and "selector_hidden.weight" in names:
        variant = "dflash2"
    mask = gguf_file.int_value(meta, "tokenizer.ggml.mask_token_id")
    return dict(
        arch=arch,
        variant=variant,
        layers=layers,
        hidden=gguf_file.int_value(meta, "eagle3.target_hidden_size") if arch == "eagle3" else n_embd,
        n_embd=n_embd,
        n_layer=gguf_file.int_value(meta, f"{arch}.block_count"),
        block=(gguf_file.int_value(meta, "dflash.block_size") or 16) if arch == "dflash" else None,
        mask=mask if mask is not None and mask >= 0 else None,
        own_head="output.weight" in names and "token_embd.weight" in names,
        n_vocab=tokens.length if isinstance(tokens := meta.get("tokenizer.ggml.tokens"), gguf_file.Array) else 0,
        bad_d2t=bad_d2t,
        embd_rows=embd_rows,
    )


def problem(d: DraftFile, target: str, arch: str, n_embd: int, n_layer: int) -> str | None:
    """Why draft `d` cannot draft for `target` (its architecture, width and layers), in words ("it ...": the caller
    names the two); None: it can. Every case here would abort inside llama.cpp, or draft from the wrong numbers in
    silence."""
    if d.variant == "dspark":
        return "it is a DSpark draft (a Markov head), which specdec does not run"
    if arch not in FEEDS:
        return (
            f"{target} is a {arch} model, whose layer inputs llama.cpp does not hand out; {d.label} drafts read them "
            f"(llama.cpp has them for {', '.join(sorted(FEEDS))})"
        )
    if not d.layers:
        return f"it names no target layers ({d.arch}.target_layers)"
    if d.arch == "eagle3" and len(d.layers) != 3:
        return f"it reads {len(d.layers)} target layers; EAGLE-3 reads exactly 3"
    if d.arch == "eagle3" and d.n_layer != 1:
        return f"it has {d.n_layer} decoder layers; EAGLE-3 has one"
    if d.hidden != n_embd:
        return f"it was made for a target of hidden size {d.hidden}; {target} has {n_embd}"
    if d.n_embd != n_embd and not d.own_head:
        return f"it is {d.n_embd} wide and borrows the embeddings and head of {target}, which is {n_embd} wide"
    last = n_layer if d.arch == "dflash" and arch in FEEDS_LAST else n_layer - 1
    bad = [i for i in d.layers if not 0 <= i <= last]
    if bad:
        return f"it reads target layer {bad[0]}; {target} has layers 0 to {last} to read ({n_layer} layers)"
    if d.arch == "dflash" and d.mask is None:
        return "it has no mask token (tokenizer.ggml.mask_token_id), which its blocks are made of"
    if d.mask is not None and not d.mask < d.n_vocab:
        return f"its mask token {d.mask} is not in its vocabulary of {d.n_vocab:,}"
    if d.bad_d2t:
        return d.bad_d2t
    if d.embd_rows is not None and d.embd_rows < d.n_vocab:  # a token past them: get_rows asserts
        return f"it embeds {d.embd_rows:,} tokens of its vocabulary of {d.n_vocab:,}"
    if d.block is not None and d.block < 2:
        return f"it has a block of {d.block} (dflash.block_size): no token to draft"
    return None


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
