"""Checks on a model path before llama.cpp sees it: a mistake or a hostile file gets one clear error.

A FIFO blocks whoever opens it, and llama.cpp trusts much of a GGUF header: some metadata values trip
an assert that aborts the whole process (`llama.block_count = 1000000` is a core dump). So `check`
refuses anything but a regular file without reading it, walks the whole header (magic, version,
every key and value, every tensor's shape, type and extent) against the file's size, and then checks
the hyperparameters that llama.cpp asserts on instead of reporting. Only the header is read, through
mmap, so the check costs milliseconds even for a 150k-token vocabulary.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

from ..errors import SpecdecError
from ..outputs import kind_name

GGUF_MAGIC = b"GGUF"
HEADER_BYTES = 24  # magic, version, tensor count, metadata count
VERSIONS = (2, 3)  # v1 had 32-bit lengths; llama.cpp reads only these
DEFAULT_ALIGNMENT = 32  # the data section's alignment when general.alignment is absent
MAX_DIMS = 4  # GGML_MAX_DIMS
MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, a 1-byte key, value type, a 1-byte value
MIN_TENSOR_BYTES = 8 + 1 + 4 + 4 + 8  # name length, a 1-byte name, n_dims, ggml type, offset
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: llama.cpp asserts block_count is 1..512
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
MAX_CONTEXT = 2**31 - 1  # llama_model_n_ctx_train returns an int32
ROPE_SCALING = ("none", "linear", "yarn", "longrope")  # any other name trips an assert
ARRAY_ITEMS_KEPT = 4096  # numeric arrays up to this long keep their items (per-layer counts)
MAX_NESTING = 8  # arrays of arrays (llama.cpp reads none): deep enough for any use, shallow for the stack

# GGUF value types: the fixed-size ones as little-endian structs; 8 is a string, 9 an array.
_SCALAR = {t: struct.Struct("<" + f) for t, f in zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd")}
_STRING, _ARRAY = 8, 9
_U32, _U64, _I64 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")

# ggml type id: (elements per block, bytes per block), as ggml's type traits (ggml/src/ggml.c) say.
# Ids 4, 5, 31-33 and 36-38 were removed from ggml: llama.cpp refuses them too.
GGML_TYPES = {
    0: (1, 4),
    1: (1, 2),
    30: (1, 2),
    28: (1, 8),  # F32, F16, BF16, F64
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),  # I8, I16, I32, I64
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 36),  # Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),  # Q2_K..Q8_K
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),  # IQ2_XXS IQ2_XS IQ3_XXS IQ1_S IQ4_NL
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    29: (256, 56),  # IQ3_S IQ2_S IQ4_XS IQ1_M
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
    40: (64, 36),  # TQ1_0 TQ2_0 MXFP4 NVFP4
    41: (128, 18),
    42: (64, 18),  # Q1_0 Q2_0
}


class Malformed(Exception):
    """What is wrong with a GGUF file, in words: `cannot load model PATH: <reason>`."""


@dataclass(frozen=True)
class Array:
    """An array value: its element type and length, and its items when numeric and short."""

    type: int
    length: int
    items: tuple | None = None
    at: int = field(default=-1, compare=False)  # a string array's first item, in the file (models/facts.py reads it)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section
    nbytes: int


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, object]  # scalars as Python values, arrays as Array
    tensors: list[TensorInfo]
    data_offset: int  # where the data section starts in the file


def check(path: str | Path) -> Path:
    """Return the path if it is a regular file with a sound GGUF header; raise SpecdecError otherwise."""
    p = Path(os.path.expanduser(path))
    try:
        mode = p.stat().st_mode  # stat, not open: opening a FIFO waits for a writer
    except FileNotFoundError:
        raise SpecdecError(f"model file not found: {p}", hint="check the path, or run `ls` on its folder") from None
    except OSError as e:
        raise SpecdecError(f"cannot read {p}: {e.strerror}") from None
    if stat.S_ISDIR(mode):
        raise SpecdecError(f"{p} is a directory, not a GGUF file", hint="pass the .gguf file inside it")
    if not stat.S_ISREG(mode):
        raise SpecdecError(f"{p} is {kind_name(mode)}, not a regular file", hint="pass the path of a .gguf file")
    try:
        # O_NONBLOCK: should a FIFO replace the file after the stat, opening it still returns at once.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        with open(os.open(p, flags), "rb") as f:
            head = f.read(HEADER_BYTES)
            _check_magic(p, head)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                check_header(read_header(buf))
    except OSError as e:
        raise SpecdecError(f"cannot read {p}: {e.strerror or e}") from None
    except Malformed as e:
        raise SpecdecError(
            f"cannot load model {p}: {e}",
            hint="the file is damaged, incomplete or not made by a GGUF converter; download it again",
        ) from None
    return p


def _check_magic(p: Path, head: bytes) -> None:
    if len(head) < 4 and GGUF_MAGIC.startswith(head):
        raise Malformed(f"truncated: only {len(head)} bytes")
    if head[:4] != GGUF_MAGIC:
        raise SpecdecError(
            f"{p} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF')",
            hint="specdec runs llama.cpp GGUF models; convert others with llama.cpp's convert_hf_to_gguf.py",
        )
    if len(head) < HEADER_BYTES:
        raise Malformed(f"truncated: only {len(head)} bytes")


# --- the header walk --------------------------------------------------------------------------------
class _Cursor:
    """A read position in the file's bytes; `where` names what is being read, for messages."""

    def __init__(self, buf) -> None:
        self.buf, self.pos, self.end, self.where = buf, 0, len(buf), "the header"

    def fail(self, what: str) -> Malformed:
        return Malformed(f"truncated: {self.where}: {what} runs past the end of the file ({self.end:,} bytes)")

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise self.fail(what)

    def unpack(self, s: struct.Struct):
        self.need(s.size, "a value")
        (value,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return value

    def string(self) -> str:
        n = self.unpack(_U64)
        self.need(n, f"a string of {n:,} bytes")
        self.pos += n
        return bytes(self.buf[self.pos - n : self.pos]).decode("utf-8", "replace")

    def value(self, vtype: int) -> object:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        raise Malformed(f"{self.where} has unknown value type {vtype}")

    def array(self, depth: int = 0) -> Array:
        etype, n = self.unpack(_U32), self.unpack(_U64)
        if etype in _SCALAR:
            s = _SCALAR[etype]
            self.need(n * s.size, f"an array of {n:,} items")
            items = None
            if n <= ARRAY_ITEMS_KEPT:
                items = struct.unpack_from(f"<{n}{s.format[-1]}", self.buf, self.pos)
            self.pos += n * s.size
            return Array(etype, n, items)
        if etype == _STRING:
            self.need(n * 8, f"an array of {n:,} strings")
            at = self.pos
            self._skip_strings(n)
            return Array(etype, n, at=at)
        if etype == _ARRAY:
            if depth == MAX_NESTING:
                raise Malformed(f"{self.where} has arrays nested more than {MAX_NESTING} deep")
            self.need(n * 12, f"an array of {n:,} arrays")
            for _ in range(n):
                self.array(depth + 1)
        else:
            raise Malformed(f"{self.where} is an array of unknown value type {etype}")
        return Array(etype, n)

    def _skip_strings(self, n: int) -> None:
        # The hot loop: 150k tokens and 150k merges in a real vocabulary. A length past the end makes the
        # next unpack fail (or the final position exceed the end): one check outside the loop.
        buf, pos, u64 = self.buf, self.pos, _U64.unpack_from
        try:
            for _ in range(n):
                pos += 8 + u64(buf, pos)[0]
        except (struct.error, OverflowError):  # a length past the end, or past any offset
            pos = self.end + 1
        if pos > self.end:
            raise self.fail(f"a list of {n:,} strings")
        self.pos = pos


def read_header(buf) -> Header:
    """Walk a GGUF header in `buf` (bytes or an mmap of the whole file); raise Malformed on any fault."""
    c = _Cursor(buf)
    c.need(HEADER_BYTES, "the fixed header")
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise Malformed("not a GGUF file")
    c.pos = 4
    version, n_tensors, n_kv = c.unpack(_U32), c.unpack(_U64), c.unpack(_U64)
    if version not in VERSIONS:
        raise Malformed(f"GGUF version {version} is not supported (llama.cpp reads versions 2 and 3)")
    if n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_BYTES > c.end - c.pos:
        raise Malformed(
            f"the header claims {n_kv:,} metadata entries and {n_tensors:,} tensors, "
            f"more than a {c.end:,}-byte file can hold: the file is truncated or damaged"
        )
    meta: dict[str, object] = {}
    for i in range(n_kv):
        c.where = f"metadata entry {i}"
        key = c.string()
        c.where = f"key {key!r}"
        meta[key] = c.value(c.unpack(_U32))
    tensors = [_tensor_info(c, i) for i in range(n_tensors)]
    align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise Malformed(f"general.alignment = {align!r} is not a power of two")
    data_offset = -(-c.pos // align) * align if tensors else c.pos
    for t in tensors:
        if data_offset + t.offset + t.nbytes > c.end:
            raise Malformed(
                f"tensor {t.name!r} ({t.nbytes:,} bytes at data offset {t.offset:,}) runs past the end "
                f"of the file ({c.end:,} bytes): the file is truncated or damaged"
            )
    return Header(version, meta, tensors, data_offset)


def _tensor_info(c: _Cursor, i: int) -> TensorInfo:
    c.where = f"tensor info {i}"
    name = c.string()
    c.where = f"tensor {name!r}"
    n_dims = c.unpack(_U32)
    if n_dims > MAX_DIMS:
        raise Malformed(f"tensor {name!r} has {n_dims:,} dimensions (ggml allows at most {MAX_DIMS})")
    shape = tuple(c.unpack(_I64) for _ in range(n_dims))
    if any(d < 1 for d in shape):
        raise Malformed(f"tensor {name!r} has shape {shape}: every dimension must be at least 1")
    ggml_type = c.unpack(_U32)
    if ggml_type not in GGML_TYPES:
        raise Malformed(f"tensor {name!r} has unknown ggml type {ggml_type}")
    block, block_bytes = GGML_TYPES[ggml_type]
    if shape and shape[0] % block:
        raise Malformed(f"tensor {name!r} has rows of {shape[0]} elements, not whole blocks of {block}")
    return TensorInfo(name, shape, ggml_type, c.unpack(_U64), prod(shape) // block * block_bytes)


# --- hyperparameters that llama.cpp asserts on ------------------------------------------------------
def check_header(h: Header) -> None:
    """Refuse the metadata values that make llama.cpp abort (GGML_ASSERT) rather than fail cleanly, and
    a few it would misread (a context length past int32) or report obscurely (a short embedding table).
    What llama.cpp checks itself with a clear reason (value types, tensor shapes) is left to it."""
    arch = h.metadata.get("general.architecture")
    if not isinstance(arch, str):
        return  # llama.cpp names a missing architecture itself
    names = {t.name: t for t in h.tensors}
    n_layer = _check_layers(h.metadata, arch, names)
    _check_heads(h.metadata, arch, names, n_layer)
    _check_experts(h.metadata, arch)
    _check_vocab(h.metadata, names)
    ctx = int_value(h.metadata, f"{arch}.context_length")
    if ctx is not None and not 1 <= ctx <= MAX_CONTEXT:
        raise Malformed(f"{arch}.context_length = {ctx} is not a usable context length (1 to {MAX_CONTEXT:,})")
    if int_value(h.metadata, f"{arch}.embedding_length") == 0:
        raise Malformed(f"{arch}.embedding_length = 0: a model needs embeddings")
    rope = h.metadata.get(f"{arch}.rope.scaling.type")
    if isinstance(rope, str) and rope not in ROPE_SCALING:
        raise Malformed(f"{arch}.rope.scaling.type = {rope!r} is not one of {', '.join(ROPE_SCALING)}")


def int_value(meta: dict, key: str) -> int | None:
    """An integer value; None when absent or of another type (llama.cpp reports a wrong type itself)."""
    v = meta.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def per_layer(meta: dict, key: str) -> list[int] | None:
    """A count given once for all layers or as a per-layer array: as a list (one item for all)."""
    v = meta.get(key)
    if isinstance(v, Array) and v.items and all(isinstance(x, int) for x in v.items):
        return list(v.items)
    return [v] if int_value(meta, key) is not None else None


def _check_layers(meta: dict, arch: str, names: dict) -> int | None:
    key = f"{arch}.block_count"
    n_layer = int_value(meta, key)
    if n_layer is None:
        return None
    if not 1 <= n_layer <= MAX_LAYERS:
        raise Malformed(f"{key} = {n_layer} is out of range: llama.cpp supports 1 to {MAX_LAYERS} layers")
    blocks = [int(n.split(".")[1]) for n in names if n.startswith("blk.") and n.split(".")[1].isdigit()]
    if blocks and max(blocks) >= n_layer:
        raise Malformed(f"{key} = {n_layer}, but the file has tensors for block {max(blocks)}")
    nextn = int_value(meta, f"{arch}.nextn_predict_layers")
    if nextn is not None and nextn > n_layer:
        raise Malformed(f"{arch}.nextn_predict_layers = {nextn} is more than {key} = {n_layer}")
    return n_layer


def _check_heads(meta: dict, arch: str, names: dict, n_layer: int | None) -> None:
    """Query heads must come in whole groups per key/value head, and a layer with attention weights needs
    key/value heads: otherwise building the attention graph trips an assert (head_count_kv defaults to
    head_count). Arrays of the wrong length are llama.cpp's to refuse."""
    key, key_kv = f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"
    heads = per_layer(meta, key)
    kv_heads = per_layer(meta, key_kv) or heads
    if n_layer is None or heads is None or {len(heads), len(kv_heads)} - {1, n_layer}:
        return
    for il in range(n_layer):
        h, kv = heads[il % len(heads)], kv_heads[il % len(kv_heads)]
        at = f" (layer {il})" if len(heads) > 1 or len(kv_heads) > 1 else ""
        if h > 0 and kv > 0 and h % kv:
            raise Malformed(f"{key} = {h} is not a multiple of {key_kv} = {kv}{at}")
        if h > 0 and kv == 0 and (f"blk.{il}.attn_k.weight" in names or f"blk.{il}.attn_qkv.weight" in names):
            raise Malformed(f"{key_kv} = 0{at}, but layer {il} has attention weights")


def _check_experts(meta: dict, arch: str) -> None:
    """The mixture-of-experts counts that llama.cpp's load_hparams asserts on."""
    n_expert = int_value(meta, f"{arch}.expert_count") or 0
    used = max(per_layer(meta, f"{arch}.expert_used_count") or [0])
    groups = int_value(meta, f"{arch}.expert_group_count") or 0
    group_used = int_value(meta, f"{arch}.expert_group_used_count") or 0
    if arch in ("hunyuan-dense", "hunyuan_vl") and n_expert <= 1:
        return  # llama.cpp treats these as dense and drops the counts
    k = f"{arch}.expert"
    if n_expert > MAX_EXPERTS:
        raise Malformed(f"{k}_count = {n_expert} is more than llama.cpp supports ({MAX_EXPERTS})")
    if used > n_expert:
        raise Malformed(f"{k}_used_count = {used} is more than {k}_count = {n_expert}")
    if n_expert and not used:
        raise Malformed(f"{k}_count = {n_expert}, but {k}_used_count is 0 or absent")
    if groups and not groups < n_expert:
        raise Malformed(f"{k}_group_count = {groups} needs more experts than {k}_count = {n_expert}")
    if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
        raise Malformed(
            f"{k}_group_count = {groups} with {k}_count = {n_expert} and {k}_group_used_count = {group_used}: "
            "the experts must split evenly and some (not all) groups be used"
        )


def _check_vocab(meta: dict, names: dict) -> None:
    """Per-token arrays cover every token, and the embedding table has a row for every token id."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, Array):
        return
    n = tokens.length
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        a = meta.get(key)
        if isinstance(a, Array) and a.length < n:
            raise Malformed(f"{key} has {a.length:,} entries for {n:,} tokens")
    embd = names.get("token_embd.weight")
    if embd is not None and len(embd.shape) >= 2 and embd.shape[1] < n:
        raise Malformed(f"token_embd.weight has {embd.shape[1]:,} rows for {n:,} tokens (tokenizer.ggml.tokens)")


# --- what exact mode needs to know -------------------------------------------------------------------
def header(path: Path) -> Header:
    """The header of a file `check` has passed."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return read_header(buf)
