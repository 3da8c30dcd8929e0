"""The model cache: where assembled GGUF files live, their status, assembly and verification.

Assembly streams the parts into a temporary file in the cache directory, hashing as it goes, and
renames it into place only when the sha256 matches: a crash or Ctrl-C never leaves a file under the
final name, so a file with that name and the right size was verified when it was written.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

from ..errors import SpecdecError
from .catalog import INSTALL_HINT, KNOWN, KnownModel

CHUNK = 8 << 20  # 8 MiB reads: large enough to stream at disk speed, small enough for a smooth progress bar
DISK_MARGIN = 64 << 20  # leave this much free after writing, for the system's sake

Progress = Callable[[int], None]  # called with the number of bytes just processed


def home() -> Path:
    """SPECDEC_HOME, else the XDG cache directory's specdec/."""
    if os.environ.get("SPECDEC_HOME"):
        return Path(os.environ["SPECDEC_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "specdec"


def model_path(model: KnownModel) -> Path:
    return home() / "models" / model.filename


def part_paths(model: KnownModel) -> tuple[list[Path], list[str]]:
    """(paths of the parts found, packages missing). Parts are located, never imported."""
    found, missing = [], []
    for part in model.parts:
        spec = importlib.util.find_spec(part.module)
        locations = list(spec.submodule_search_locations or []) if spec else []
        path = Path(locations[0]) / part.resource if locations else None
        if path is not None and path.is_file():
            found.append(path)
        else:
            missing.append(part.package)
    return found, missing


@dataclass(frozen=True)
class Status:
    model: KnownModel
    state: str  # "not installed" | "installed" | "assembled" | "corrupt"
    path: Path


def status(model: KnownModel) -> Status:
    path = model_path(model)
    if path.exists():
        return Status(model, "assembled" if path.stat().st_size == model.size else "corrupt", path)
    _, missing = part_paths(model)
    return Status(model, "not installed" if missing else "installed", path)


def assemble(model: KnownModel, progress: Progress | None = None) -> Path:
    """Concatenate the parts into the cache, verify the sha256, and rename into place."""
    parts, missing = part_paths(model)
    if missing:
        raise SpecdecError(
            f"{model.name} is not installed: missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}",
            hint=INSTALL_HINT,
        )
    have = sum(p.stat().st_size for p in parts)
    if have != model.size:
        raise SpecdecError(
            f"{model.name}: its packages hold {have:,} bytes, expected {model.size:,}",
            hint=f"reinstall them: pip install --force-reinstall {' '.join(model.packages[:2])} ...",
        )
    final = model_path(model)
    final.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(final.parent, model.size)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while chunk := f.read(CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        if progress:
                            progress(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != model.sha256:
            raise SpecdecError(
                f"{model.name}: sha256 mismatch after assembly (got {digest.hexdigest()[:16]}..., "
                f"expected {model.sha256[:16]}...)",
                hint=f"its packages are damaged; reinstall them with pip install --force-reinstall {model.packages[0]} ...",
            )
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def check_free_space(folder: Path, need: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < need + DISK_MARGIN:
        raise SpecdecError(
            f"not enough disk space in {folder}: assembling needs {_mb(need + DISK_MARGIN)}, {_mb(free)} free",
            hint="free some space, or point SPECDEC_HOME at a disk with room",
        )


def ensure(model: KnownModel, bar: Callable[[KnownModel], ContextManager[Progress]] | None = None) -> Path:
    """The model's GGUF path, assembling it first if needed (`bar` makes a progress display)."""
    st = status(model)
    if st.state == "assembled":
        return st.path
    if st.state == "not installed":
        return assemble(model)  # raises, naming the missing packages, before any progress bar shows
    if st.state == "corrupt":
        raise SpecdecError(
            f"{st.path} has the wrong size ({st.path.stat().st_size:,} bytes, expected {model.size:,})",
            hint=f"delete it and run `specdec models pull {model.name}`",
        )
    with bar(model) if bar else nullcontext(None) as progress:
        return assemble(model, progress)


def sha256_of(path: Path, progress: Progress | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            if progress:
                progress(len(chunk))
    return digest.hexdigest()


def lookup(name: str) -> KnownModel:
    try:
        return KNOWN[name]
    except KeyError:
        raise SpecdecError(f"unknown model {name!r}", hint=f"known models: {', '.join(KNOWN)}") from None


def _mb(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"
