"""Files the CLI writes: which paths it may replace, checked before any work starts, and the atomic
write itself. An output is a regular file or a new path, never a device, a FIFO or an input.

Symlinks are written through: the file a link names is replaced and the link stays a link, which is
what a user who linked results.json into another folder expects. A dangling link is refused: the
file it would create could be anywhere (a disk that is not mounted, another user's folder), and
creating the target first is one `touch` away.

The on-disk caches (answers, prompts' cells, cost curves, models) live under `home()`; the private ones are files
0600 in folders 0700 whatever the umask.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from .errors import SpecdecError, UsageError


def home() -> Path:
    """SPECDEC_HOME, else the XDG cache directory's specdec/: every cache's folder (models, lookup answers, prompt
    blocks, cost curves) is under it."""
    if os.environ.get("SPECDEC_HOME"):
        return Path(os.path.expanduser(os.environ["SPECDEC_HOME"]))
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.path.expanduser(cache)) / "specdec"


_KINDS = [
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
]


def output_path(path: Path, option: str, inputs: dict[str, Path | None] | None = None) -> Path:
    """The regular file that `option` (e.g. "--json") will replace: `path` with its symlinks resolved.
    `inputs` names the files the command reads (and the outputs checked before this one): an output
    may be none of them. Raises UsageError naming the option and the reason."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise UsageError(
            f"{option}: {path} is a dangling symlink (to {os.readlink(path)})",
            hint="create the file it points to, or remove the link",
        )
    target = Path(os.path.realpath(path))  # a loop of links resolves to where it gives up: stat says why
    shown = f"{path} (a link to {target})" if path.is_symlink() else str(path)
    for problem, hint in (
        (kind_problem(target), "give a regular file or a new path"),
        (folder_problem(target), "create the directory first, or choose another path"),
        (input_problem(target, inputs or {}), "an output never replaces an input: choose another path"),
    ):
        if problem:
            raise UsageError(f"{option}: {shown} {problem}", hint=hint)
    return target


def kind_problem(path: Path) -> str | None:
    """Why `path` (links followed) may not be replaced by a new file; None for a regular file or nothing."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None  # a new file
    except OSError as e:  # e.g. a file where a directory should be: named by folder_problem
        return None if isinstance(e, NotADirectoryError) else f"cannot be examined ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    return f"is {kind_name(mode)}, not a regular file"


def kind_name(mode: int) -> str:
    """What a file that is not a regular file is, in words (from its st_mode)."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def folder_problem(path: Path) -> str | None:
    """Why no file can be created beside `path`: the atomic write puts its temporary file there."""
    folder = path.parent
    if not folder.is_dir():
        return f"is in {folder}, which is not an existing directory"
    if not os.access(folder, os.W_OK):  # as root too on a read-only file system (EROFS)
        return f"is in {folder}, which is not writable"
    return None


def input_problem(path: Path, inputs: dict[str, Path | None]) -> str | None:
    """Which input `path` is, if any: the same inode (hard links too), or the same new path."""
    for name, other in inputs.items():
        if other is not None and _same_file(path, Path(other)):
            return f"is the same file as {name}"
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet: the same if both name one place
        return os.path.realpath(a) == os.path.realpath(b)


def write_atomic(path: Path, text: str) -> None:
    """Replace the file `path` names (through symlinks) with `text`: write a temporary file in the
    same directory, fsync, rename. Readers see the old file or the new one, never half of one."""
    target = Path(os.path.realpath(path))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # a leftover of a dead process that had our pid
        # O_EXCL: never open through something that appeared at the temporary name.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        if target.exists():  # the replaced file keeps its permissions (a 0600 result stays private)
            os.fchmod(fd, target.stat().st_mode & 0o7777)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        raise SpecdecError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)  # Ctrl-C too: no hidden temporary files left behind


def remove_quietly(path: Path) -> None:
    """Remove a cache file; one already gone (another process evicted it) or not ours is left alone."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def evict_oldest(paths: Iterable[Path], max_bytes: int) -> None:
    """Remove the least recently written of `paths` until the rest hold at most max_bytes: the rule of
    both on-disk caches (lookup answers and prefix blocks), whose readers refresh a file's mtime."""
    files = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:  # removed while we looked
            continue
        files.append((st.st_mtime_ns, st.st_size, path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files, key=lambda f: f[0]):
        if total <= max_bytes:
            break
        remove_quietly(path)
        total -= size


class NotOurs(OSError):
    """A cache's folder that is a link, not a folder, or another user's: a cache does not use it."""


def private_folder(folder: Path, link_ok: bool = False) -> None:
    """Make `folder` (and its parents) and leave it 0700 whatever the umask (a folder of ours made 0755 by an
    older version included). NotOurs where it is not a folder this user owns, or is a link and not `link_ok` (a
    cache's root the user may point anywhere; inside it, a link another user planted would have us chmod and
    write where it points)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.stat() if link_ok else folder.lstat()
    if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        raise NotOurs(f"{folder} is not a folder of this user's (a link, a file, or another user's)")
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)


def tighten(folder: Path) -> None:
    """Make a folder of ours that others may enter 0700 (another user's, and a link, are left as they are)."""
    st = folder.lstat()
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o077 and (not hasattr(os, "getuid") or st.st_uid == os.getuid()):
        os.chmod(folder, 0o700)


def create_private(path: Path) -> BinaryIO:
    """A new file at `path`, open for writing, 0600 whatever the umask. O_EXCL and O_NOFOLLOW: never a file (or a
    link) that was there already."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # (os.open's mode is under the umask, which may take the owner's bits)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise
