"""What a computation on this machine depends on, stated once: a kept cost curve (drafting/curves.py) and a prompt's
blocks on disk (prefixes/store.py) are keyed by it, so that a change to any of it measures, or computes, again."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

import llama_cpp

from .backend import cpu


def computation(models: list[Path], threads: int, exact: bool, where: str) -> dict[str, Any]:
    """This machine and its kernels, the model files (each by file_identity), threads, exact mode (reference
    kernels), `where` the target runs (its layers' placement, RPC servers) and llama.cpp's build."""
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
    """What says a model file is the same file: its resolved path, size and modification time."""
    st = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
