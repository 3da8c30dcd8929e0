"""Cheap checks on a model path before llama.cpp sees it, so the common mistakes get a clear error."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecdecError

GGUF_MAGIC = b"GGUF"
HEADER_BYTES = 24  # magic, version, tensor count, metadata count


def check(path: str | Path) -> Path:
    """Return the path if it looks like a GGUF file; raise SpecdecError saying what is wrong otherwise."""
    p = Path(path).expanduser()
    if not p.exists():
        raise SpecdecError(f"model file not found: {p}", hint="check the path, or run `ls` on its folder")
    if p.is_dir():
        raise SpecdecError(f"{p} is a directory, not a GGUF file", hint="pass the .gguf file inside it")
    try:
        with p.open("rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError as e:
        raise SpecdecError(f"cannot read {p}: {e.strerror}") from e
    if head[:4] != GGUF_MAGIC:
        raise SpecdecError(
            f"{p} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF')",
            hint="specdec runs llama.cpp GGUF models; convert others with llama.cpp's convert_hf_to_gguf.py",
        )
    if len(head) < HEADER_BYTES:
        raise SpecdecError(f"{p} is truncated: only {len(head)} bytes", hint="download the file again")
    return p
