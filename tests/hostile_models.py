"""Hostile GGUF files for tests, made from the sound tiny fixtures (tiny_models.py).

Two kinds: `rewrite` writes a well-formed file whose metadata or tensors lie (a block count llama.cpp
asserts on, head counts that do not divide); `patch_*` overwrite one field of a copied header in place
(a count, a length, a value type, a tensor offset), as a damaged or crafted file would have it.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from tiny_models import finish

ARRAY = GGUFValueType.ARRAY


def rewrite(
    src: Path, dst: Path, meta: dict | None = None, drop: tuple[str, ...] = (), tensors: dict | None = None
) -> Path:
    """Copy `src` with metadata set (key: (value, type) or (values, ARRAY, item type)) or dropped, and
    tensors replaced or added (name: array; None removes one). "{arch}" in a key is the architecture."""
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    values = {
        name: (f.contents(), f.types[0], f.types[-1] if f.types[0] == ARRAY else None)
        for name, f in r.fields.items()
        if not name.startswith("GGUF.")
    }
    for key, (value, vtype, *sub) in (meta or {}).items():
        values[key.replace("{arch}", arch)] = (value, vtype, sub[0] if sub else None)
    w = GGUFWriter(str(dst), values.pop("general.architecture")[0])  # the writer puts it first
    for key, (value, vtype, sub) in values.items():
        if key not in drop:
            w.add_key_value(key, value, vtype, sub_type=sub)
    arrays = {t.name: np.array(t.data) for t in r.tensors} | (tensors or {})
    return finish(w, {name: a for name, a in arrays.items() if a is not None}, dst)


def _patched(src: Path, dst: Path, offset: int, fmt: str, value: int) -> Path:
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<" + fmt, value))
    return dst


def _tensor_dims_at(src: Path, name: str) -> tuple[int, int]:
    """Where tensor `name`'s dimensions start in its info (name length, name, n_dims, then the dimensions,
    the ggml type, the data offset), and how many there are."""
    t = next(t for t in GGUFReader(src).tensors if t.name == name)
    return t.field.offset + 8 + len(name.encode()) + 4, len(t.shape)


def patch_kv_count(src: Path, dst: Path, n: int) -> Path:
    """The header's metadata count (bytes 16..24: after magic, version and tensor count)."""
    return _patched(src, dst, 16, "Q", n)


def patch_first_key_length(src: Path, dst: Path, n: int) -> Path:
    """The length of the first metadata key, the first string in the file (at byte 24)."""
    return _patched(src, dst, 24, "Q", n)


def patch_value_type(src: Path, dst: Path, key: str, vtype: int) -> Path:
    """The value type of `key`'s entry (after the key's length and bytes)."""
    field = GGUFReader(src).fields[key]
    return _patched(src, dst, field.offset + 8 + len(key.encode()), "I", vtype)


def patch_tensor_offset(src: Path, dst: Path, name: str, offset: int) -> Path:
    """Where tensor `name`'s data starts, relative to the data section (the last field of its info)."""
    dims, n_dims = _tensor_dims_at(src, name)
    return _patched(src, dst, dims + 8 * n_dims + 4, "Q", offset)


def patch_tensor_dim(src: Path, dst: Path, name: str, dim: int, size: int) -> Path:
    """One dimension (ggml order: 0 is the row length) of tensor `name`."""
    dims, _ = _tensor_dims_at(src, name)
    return _patched(src, dst, dims + 8 * dim, "q", size)


def patch_tensor_type(src: Path, dst: Path, name: str, ggml_type: int) -> Path:
    """The ggml type id of tensor `name` (after its dimensions)."""
    dims, n_dims = _tensor_dims_at(src, name)
    return _patched(src, dst, dims + 8 * n_dims, "I", ggml_type)
