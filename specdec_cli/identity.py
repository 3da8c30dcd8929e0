"""What a computation on this machine depends on, stated once: a kept cost curve (drafting/curves.py) and a prompt's
blocks on disk (prefixes/store.py) are keyed by it, so that a change to any of it measures, or computes, again."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
from pathlib import Path
from typing import Any

import llama_cpp

from .backend import cpu

HEAD = 1 << 20  # bytes read whole: a GGUF's header, its hyperparameters first (a large vocabulary runs on, sampled)
# Blocks of the rest, 4 MiB: weights that differ in a tenth of the file escape every block with chance 0.9^256.
SAMPLES, SAMPLE = 256, 16 << 10


def computation(models: list[Path], threads: int, exact: bool, where: str) -> dict[str, Any]:
    """This machine and its kernels, the model files (each by its content: file_identity), threads, exact mode
    (reference kernels), `where` the target runs (its layers' placement, RPC servers) and llama.cpp's build."""
    return {
        "host": platform.node(),
        "cpu": cpu.features(),
        "models": [file_identity(path) for path in models],
        "threads": threads,
        "exact": exact,
        "where": where,
        "llama_cpp": llama_cpp.__version__,
    }


def key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def file_identity(path: Path) -> dict[str, Any]:
    """What says a model file is the same: its size, its modification time and a digest of its content, not its
    name, so that the file named by a store's name, by a path or through a link is one file (one cost curve, one
    prefix store). The digest covers the header (hyperparameters change the computation) and SAMPLES blocks spread
    over the weights: milliseconds, not a 1 GB read. The time stays: a fine-tune of a few tensors, quantised alike,
    has the same size and may escape the samples, and the prefix store must never restore another model's cells."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # (a FIFO would block a plain open)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # no content to read: the path's own identity
            return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        digest = hashlib.sha256(b"%d\0" % st.st_size + f.read(HEAD))
        for i in range(SAMPLES):
            f.seek(HEAD + i * max(st.st_size - HEAD - SAMPLE, 0) // (SAMPLES - 1))
            digest.update(f.read(SAMPLE))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "content": digest.hexdigest()}
