"""The model cache: where assembled GGUF files live, their status, assembly and verification.

Assembly streams the parts into a temporary file in the cache directory, hashing as it goes (a model shipped
whole, in one part, is hard-linked there instead, then hashed: its bytes are on disk once), and
renames it into place only when the sha256 matches: a crash or Ctrl-C never leaves a file under the
final name, so a file with that name and the right size was verified when it was written. A process
killed outright leaves its `.<file>.<pid>.partial`; the next assembly removes it once that pid is gone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import stat
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

from ..errors import SpecdecError
from ..outputs import home, kind_problem
from .catalog import INSTALL_HINT, KNOWN, KnownModel

CHUNK = 8 << 20  # 8 MiB reads: large enough to stream at disk speed, small enough for a smooth progress bar
DISK_MARGIN = 64 << 20  # leave this much free after writing, for the system's sake

Progress = Callable[[int], None]  # called with the number of bytes just processed


def models_dir(create: bool = False) -> Path:
    """home()/models, checked (and with `create`, made): a file in the way, a read-only disk or a folder
    we may not enter is one error naming SPECDEC_HOME, not an OSError from deep inside a command."""
    folder = home() / "models"
    try:
        if create and not folder.is_dir():
            folder.mkdir(parents=True)
        mode = folder.stat().st_mode
    except FileNotFoundError:
        return folder  # nothing assembled yet; `create` makes it
    except OSError as e:  # NotADirectoryError, FileExistsError, PermissionError, EROFS
        raise _unusable_home(folder, f"{e.filename or folder}: {e.strerror or e}") from None
    if not stat.S_ISDIR(mode):
        raise _unusable_home(folder, f"{folder} is not a directory")
    if create and not os.access(folder, os.W_OK):
        raise _unusable_home(folder, f"{folder} is not writable")
    return folder


def _unusable_home(folder: Path, why: str) -> SpecdecError:
    env = os.environ.get("SPECDEC_HOME")
    source = f"SPECDEC_HOME={env}" if env else f"the model cache {home()}"
    blocker = next((p for p in [*reversed(folder.parents), folder] if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # name what is in the way rather than errno's "Not a directory"
        why = f"{blocker} is not a directory"
    return SpecdecError(f"cannot use {source}: {why}", hint="point SPECDEC_HOME at a writable directory")


def model_path(model: KnownModel) -> Path:
    return models_dir() / model.filename


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


# A catalogue model's states, as `models list` shows them (and --json says them), with what each means to a user.
READY = "ready"  # assembled in the cache: loads now
DOWNLOADED = "downloaded"  # its packages are installed: the first use (or `models pull`) assembles it, once
NOT_DOWNLOADED = "not downloaded"  # its packages are missing
CORRUPT = "corrupt"  # a file of the wrong size under its name in the cache
MEANING = {
    READY: "in the cache, loads now",
    DOWNLOADED: "its packages are installed; the first run (or `specdec models pull NAME`) assembles it into the cache",
    NOT_DOWNLOADED: f"its packages are missing: {INSTALL_HINT}",
    CORRUPT: "the cache holds a file of the wrong size: `specdec models pull NAME` assembles it again",
}


@dataclass(frozen=True)
class Status:
    model: KnownModel
    state: str  # one of MEANING's keys
    path: Path


def status(model: KnownModel) -> Status:
    path = model_path(model)
    if path.exists():
        # Not a regular file (a FIFO, a device): never ready, and never opened to be hashed.
        ok = path.is_file() and path.stat().st_size == model.size
        return Status(model, READY if ok else CORRUPT, path)
    _, missing = part_paths(model)
    return Status(model, NOT_DOWNLOADED if missing else DOWNLOADED, path)


def assemble(model: KnownModel, progress: Progress | None = None) -> Path:
    """Concatenate the parts into the cache, verify the sha256, and rename into place."""
    return _write(model, *_prepare(model), progress)


def _prepare(model: KnownModel) -> tuple[list[Path], Path]:
    """(the parts, the destination), after every check that can fail before a byte is written."""
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
    final = models_dir(create=True) / model.filename
    check_destination(final, model)
    remove_stale_partials(final.parent)
    check_free_space(final.parent, model.size)
    return parts, final


def _write(model: KnownModel, parts: list[Path], final: Path, progress: Progress | None) -> Path:
    tmp = final.with_name(f".{final.name}.{os.getpid()}.partial")
    # One under our own pid is a killed earlier process's (pids are reused): a link to the package's file, maybe,
    # which writing through would truncate.
    tmp.unlink(missing_ok=True)
    try:
        # The link's own bytes are hashed: what the cache holds under the final name is what was verified.
        got = sha256_of(tmp, progress) if _linked(parts, tmp) else _concatenate(parts, tmp, progress)
        if got != model.sha256:
            raise SpecdecError(
                f"{model.name}: sha256 mismatch after assembly (got {got[:16]}..., expected {model.sha256[:16]}...)",
                hint=f"its packages are damaged; reinstall them with pip install --force-reinstall {model.packages[0]} ...",
            )
        os.replace(tmp, final)  # also replaces a corrupt file, atomically
    finally:
        tmp.unlink(missing_ok=True)  # on any exception, an interruption (Ctrl-C, SIGTERM) included
    return final


def _linked(parts: list[Path], tmp: Path) -> bool:
    """A model shipped whole, in one part, is hard-linked into the cache rather than copied: one copy of its bytes
    on disk, which stays when its package is uninstalled. (Chunks of one file must be concatenated: llama.cpp
    opens one GGUF, or gguf-split shards that each carry a header, never raw byte slices.) False where the
    system refuses (another disk, a file another user owns): then it is copied."""
    if len(parts) != 1:
        return False
    try:
        os.link(parts[0], tmp)
    except OSError:
        return False
    return True


def _concatenate(parts: list[Path], tmp: Path, progress: Progress | None) -> str:
    """Write the parts, in order, to `tmp` (synced to disk); their sha256."""
    digest = hashlib.sha256()
    with tmp.open("xb") as out:  # (never through a file already there: it may be a package's, linked)
        for part in parts:
            with part.open("rb") as f:
                while chunk := f.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    if progress:
                        progress(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def check_destination(final: Path, model: KnownModel) -> None:
    """The cache owns its files: a regular file (a corrupt one is replaced) or nothing. A symlink is
    refused rather than written through: replacing what it points to would write outside the cache."""
    why = "is a symlink: the cache replaces only its own files" if final.is_symlink() else kind_problem(final)
    if why:
        raise SpecdecError(
            f"cannot assemble {model.name}: {final} {why}",
            hint=f"move or remove it, then run `specdec models pull {model.name}` again",
        )


_PARTIAL = re.compile(r"\.(.+)\.(\d+)\.partial")


def remove_stale_partials(folder: Path) -> None:
    """Delete the `.<file>.<pid>.partial` files of processes that are gone (killed mid-assembly).
    A live process's partial file is its work in progress: concurrent pulls each keep their own."""
    for path in folder.iterdir():
        match = _PARTIAL.fullmatch(path.name)
        if match and not _alive(int(match[2])):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, as another user
    return True


def check_free_space(folder: Path, need: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < need + DISK_MARGIN:
        raise SpecdecError(
            f"not enough disk space in {folder}: assembling needs {_mb(need + DISK_MARGIN)}, {_mb(free)} free",
            hint="free some space, or point SPECDEC_HOME at a disk with room",
        )


def ensure(
    model: KnownModel, bar: Callable[[KnownModel], ContextManager[Progress]] | None = None, repair: bool = False
) -> Path:
    """The model's GGUF path, assembling it first if needed (`bar` makes a progress display).
    A corrupt (wrong-size) file is an error, unless `repair` (`models pull`) re-assembles over it."""
    st = status(model)
    if st.state == READY:
        return st.path
    if st.state == CORRUPT and not repair:
        raise SpecdecError(
            f"{st.path} has the wrong size ({st.path.stat().st_size:,} bytes, expected {model.size:,})",
            hint=f"run `specdec models pull {model.name}` to assemble it again",
        )
    ready = _prepare(model)  # raises (missing packages, no room, ...) before any progress bar shows
    with bar(model) if bar else nullcontext(None) as progress:
        return _write(model, *ready, progress)


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
