"""The caches `specdec cache` shows and clears, a record each: what it keeps, its folder, what it holds, its bound
and how it is emptied. Each clear removes only files that cache writes, by name (and, for prefix blocks, by an
HMAC-checked header): never a model, never another file under a folder a variable points elsewhere."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import prefixes
from .drafting import cache as lookup
from .drafting import curves
from .outputs import remove_quietly
from .prefixes import blocks


@dataclass(frozen=True)
class Cache:
    kind: str  # the name `specdec cache clear KIND` takes
    unit: str  # what it counts, plural
    what: str  # what it keeps, for the help
    variable: str  # the environment variable that moves it (else SPECDEC_HOME moves it with the others)
    folder: Callable[[], Path]
    usage: Callable[[], tuple[int, int]]  # (count, bytes)
    clear: Callable[[], tuple[int, int]]  # (count, bytes) removed
    max_bytes: int | None  # its default bound; None: none (a curve is ~1 KB per model pair and threads)


# A kept curve: curves/KEY.json (identity.key: 24 hex digits), and a crashed writer's temporary file.
_CURVE = re.compile(r"[0-9a-f]{24}\.json")
_CURVE_TMP = re.compile(r"\.[0-9a-f]{24}\.json\.\d+\.[0-9a-f]{8}\.tmp")


def _curve_files(pattern: re.Pattern) -> list[Path]:
    try:
        with os.scandir(curves.folder()) as it:
            return [Path(e.path) for e in it if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
    except OSError:  # none kept yet, or not a folder we can read
        return []


def _curves_usage() -> tuple[int, int]:
    sizes = []
    for path in _curve_files(_CURVE):
        try:
            sizes.append(path.lstat().st_size)
        except OSError:  # removed while we looked
            continue
    return len(sizes), sum(sizes)


def _curves_clear() -> tuple[int, int]:
    """Every kept curve (each run measures its own again, once) and a crashed writer's temporary files."""
    count, size = _curves_usage()
    for path in [*_curve_files(_CURVE), *_curve_files(_CURVE_TMP)]:
        remove_quietly(path)
    return count, size


CACHES = {
    c.kind: c
    for c in (
        Cache(
            "lookup",
            "answers",
            "earlier answers that lookup drafts from",
            "SPECDEC_LOOKUP_CACHE",
            lookup.root,
            lookup.usage,
            lookup.clear,
            lookup.MAX_BYTES,
        ),
        Cache(
            "curves",
            "curves",
            "auto's measured cost curves (kept a day; a run without one measures it again)",
            "SPECDEC_COST_CURVES",
            curves.folder,
            _curves_usage,
            _curves_clear,
            None,
        ),
        Cache(
            "prefix",
            "blocks",
            "the server's KV cells of long prompts (`serve --prefix-cache`)",
            "SPECDEC_PREFIX_CACHE",
            blocks.root,
            blocks.usage,
            blocks.clear,
            prefixes.MAX_BYTES,
        ),
    )
}
