"""Auto's cost curve kept between processes, so that a short `generate` does not pay the measurement (about
three seconds for the default pair on 2 cores) every call.

One JSON file per key in the specdec cache (curves/KEY.json, or $SPECDEC_COST_CURVES/KEY.json). The key is a
hash of what the costs depend on: the machine, the model files (by content, identity.file_identity: a changed file
is a new key, the same file named by path, by a store's name or copied is one), threads (-t: llama.cpp's costs
change with them), exact mode, where the target runs and the llama.cpp build. A file is written atomically (several
processes at once each replace it whole), is measured again when it is older than MAX_AGE, and is ignored, with a
warning, when it cannot be read. A measurement that cannot be the idle machine's (measure.doubt: another program
held the cores) is not written. Auto refines its costs as rounds run: where what it observes drifts more than DRIFT
from the kept curve, the file goes, and the next run measures again.
"""

from __future__ import annotations

import json
import math
import os
import platform
import stat
import time
from pathlib import Path
from typing import Any, Callable


from .. import identity
from ..outputs import home
from ..outputs import remove_quietly

VERSION = 2  # 2: the draft's prefill and load times (draft_source since: whose they are, where not a draft model's)
MAX_AGE = 24 * 3600.0  # seconds: a day (a machine's load, clocks and thermal state change slowly)
MAX_FILE = 1 << 16  # bytes: a curve is about 1 KB
MAX_BATCH = 1024  # the largest batch a kept curve may time (auto's is 32, the bench's 64)
MIN_SECONDS, MAX_SECONDS = 1e-7, 3600.0  # a decode time outside these is no measurement of ours
OPTIONAL = ("draft", "plain", "draft_catch_up", "draft_prefill", "draft_load")  # Costs' optional arguments
DRIFT = 1.5  # observed plain-decoding cost this many times the kept one (or 1/DRIFT of it): measure again


def folder() -> Path:
    """$SPECDEC_COST_CURVES, else the specdec cache's curves/ (SPECDEC_HOME moves both)."""
    if os.environ.get("SPECDEC_COST_CURVES"):
        return Path(os.path.expanduser(os.environ["SPECDEC_COST_CURVES"]))
    return home() / "curves"


def about(paths: list[Path], threads: int, exact: bool, where: str, n_max: int) -> dict[str, Any]:
    """What a cost curve depends on (its key hashes them): the computation (identity.py: the target's file first, a
    draft's even where it is not loaded) and the longest batch it times."""
    return {**identity.computation(paths, threads, exact, where), "n_max": n_max}


key = identity.key


def load(name: str, warn: Callable[[str], None]) -> dict[str, Any] | None:
    """The kept measurement (Costs' arguments: verify and OPTIONAL), or None: none kept,
    too old, or damaged (then `warn` says so, and the next measurement replaces it)."""
    path = folder() / f"{name}.json"
    try:
        data = json.loads(_read(path).decode("utf-8"))
        costs, saved_at = _costs(data, name)
    except (FileNotFoundError, NotADirectoryError):  # none kept (or no cache folder can be there)
        return None
    except (OSError, ValueError, TypeError, KeyError, UnicodeDecodeError) as e:
        warn(f"ignored a damaged cost curve in the specdec cache ({path}: {e}); measuring it again")
        return None
    age = time.time() - saved_at
    return costs if 0 <= age <= MAX_AGE else None


def _read(path: Path) -> bytes:
    """A kept curve's bytes: a regular file of at most MAX_FILE bytes (a FIFO put there would block a plain
    read, a huge file fill the memory)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise ValueError(f"larger than a curve ({MAX_FILE} bytes at most)")
    return data


def save(name: str, measured: dict[str, Any], about: dict[str, Any] | None = None) -> None:
    """Keep a fresh measurement (Costs' arguments, as measured: before auto refines it); `about`: what it was
    measured for (the session's key parts: the host, the model files, the target's first), for `kept_for`. A cache that cannot be written leaves
    the run as it is: the next one measures again."""
    where = folder()
    path = where / f"{name}.json"
    tmp = where / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    data = {"version": VERSION, "key": name, "saved_at": time.time(), "about": about or {}, **measured}
    data["verify"] = {str(n): s for n, s in measured["verify"].items()}
    try:
        where.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        remove_quietly(tmp)


def kept_for(target: dict[str, Any]) -> dict[str, Any] | None:
    """The newest curve kept for the target file `target` (its file_identity: the first of the models `about`
    names) on this host, whatever its age, draft or threads: Costs' arguments, or None. (`specdec models pair`
    ranks drafts by it.)"""
    best, newest = None, -math.inf
    try:
        files = list(folder().glob("*.json"))
    except OSError:
        return None
    for path in files:
        try:
            data = json.loads(_read(path).decode("utf-8"))
            about = data.get("about") or {}
            if (about.get("models") or [None])[0] != target or about.get("host") != platform.node():
                continue
            costs, saved_at = _costs(data, data.get("key"))
        except (OSError, ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
            continue
        if saved_at > newest:
            best, newest = costs, saved_at
    return best


def drop(name: str) -> None:
    remove_quietly(folder() / f"{name}.json")


def _costs(data: Any, name: str) -> tuple[dict[str, Any], float]:
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("key") != name:
        raise ValueError("not a curve of this version and key")
    verify = {int(n): _seconds(s) for n, s in data["verify"].items()}
    if not verify or not all(1 <= n <= MAX_BATCH for n in verify):
        raise ValueError(f"verify costs must be for batches of 1..{MAX_BATCH} tokens")
    optional = {k: None if data.get(k) is None else _seconds(data[k]) for k in OPTIONAL}
    source = data.get("draft_source")
    if source is not None and not (isinstance(source, str) and source.isidentifier() and len(source) <= 32):
        raise ValueError("draft_source is not a drafter's name")
    saved_at = data["saved_at"]
    if not isinstance(saved_at, (int, float)) or isinstance(saved_at, bool) or not math.isfinite(saved_at):
        raise ValueError("saved_at is not a time")
    return {"verify": verify, **optional, "draft_source": source}, float(saved_at)


def _seconds(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and MIN_SECONDS <= value <= MAX_SECONDS
    if not ok:  # (NaN fails both comparisons)
        raise ValueError(f"{value!r} is not a decode time in seconds ({MIN_SECONDS:g}..{MAX_SECONDS:g})")
    return float(value)
