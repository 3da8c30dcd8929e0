"""A prefix block's file: its name (an HMAC of the model key, the namespace and every token to the block's end),
its header (magic, the model key, the name, its first position, token count, the state's size and SHA-256, then an
HMAC-SHA256 of all that with the install's secret) and llama.cpp's state of its cells; and which files under the
cache are this install's (own_files). The store that writes and restores blocks: store.py."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import struct
import time
from pathlib import Path

import numpy as np

from ..outputs import create_private, home, private_folder, remove_quietly, tighten

BLOCK = 512  # backend/context.py's n_ubatch: a cold prefill's ubatches start at its multiples
STALE = 3600.0  # seconds: a temporary file this old is a crashed writer's
VERSION = 2
MAGIC = b"SPDKV2\0\0"
OLD_MAGIC = b"SPDKV1\0\0"  # version 1 kept the prompt's tokens in clear: its files go at the first tidy
HEADER = struct.Struct("<8s24s32sIIQ32s32s")  # magic, model key, name, first position, tokens, state size,
# the state's SHA-256, HMAC-SHA256 of everything before it
TAGGED = HEADER.size - 32  # the header's bytes the HMAC covers
SUFFIX = ".kv"
SECRET = "hmac-secret"  # root()/SECRET: the install's key for names and HMACs
NAME = re.compile(r"[0-9a-f]{32}\.kv")  # a block's file
FOLDER = re.compile(r"[0-9a-f]{24}")  # a model key's folder
TEMP = re.compile(r"\.[0-9a-f]{32}\.kv\.[0-9]+\.[0-9a-f]{8}\.tmp")  # a block being written


class Damaged(Exception):
    """A block file that does not check out: its reason."""


def root() -> Path:
    """$SPECDEC_PREFIX_CACHE, else the specdec cache's prefix/ (SPECDEC_HOME moves it with the others)."""
    if os.environ.get("SPECDEC_PREFIX_CACHE"):
        return Path(os.path.expanduser(os.environ["SPECDEC_PREFIX_CACHE"]))
    return home() / "prefix"


def secret(folder: Path) -> bytes:
    """The install's HMAC key: folder/SECRET, 32 random bytes in a 0600 file, made on first use (two servers
    starting at once: the first link wins, both read it). Damaged where it is not a private file of ours."""
    private_folder(folder, link_ok=True)
    path = folder / SECRET
    if not os.path.lexists(path):
        tmp = folder / f".{SECRET}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        f = create_private(tmp)
        try:
            with f:
                f.write(os.urandom(32))
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            remove_quietly(tmp)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != 32:
            raise Damaged("is not 32 bytes in a regular file")
        if os.name == "posix" and (st.st_uid != os.getuid() or st.st_mode & 0o077):
            raise Damaged(f"is not private to this user (mode {stat.S_IMODE(st.st_mode):04o}, owner {st.st_uid})")
        return f.read()


def digests(secret: bytes, key: str, tokens: list[int], namespace: bytes = bytes(32)) -> list[str]:
    """Each whole block's name: an HMAC (the install's secret) of the model key, the namespace and every token up
    to the block's end. Without the secret nobody can tell from the names which prompts were kept."""
    h = hmac.new(secret, key.encode() + b"\0" + namespace, hashlib.sha256)
    out = []
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        h.update(np.asarray(tokens[end - BLOCK : end], dtype="<i4").tobytes())
        out.append(h.copy().hexdigest()[:32])
    return out


def namespace(keyed: bytes, salt: str | None) -> bytes:
    """Whose blocks: a hash of the server's API key (key_hash) and a request's cache_salt."""
    return hashlib.sha256(keyed + (salt or "").encode()).digest()


def encode(secret: bytes, key: str, digest: str, start: int, count: int, state) -> list[bytes | memoryview]:
    """A block file's parts, in order (`state`: llama.cpp's bytes, any buffer)."""
    state = memoryview(state).cast("B")
    sha = hashlib.sha256(state).digest()
    fields = HEADER.pack(MAGIC, key.encode(), digest.encode(), start, count, len(state), sha, b"")
    tag = hmac.new(secret, fields[:TAGGED], hashlib.sha256).digest()
    return [fields[:TAGGED] + tag, state]


def header(secret: bytes, data) -> tuple:
    """A block file's header fields, where its HMAC checks out (the file is this install's); else Damaged."""
    if len(data) < HEADER.size:
        raise Damaged("shorter than a header")
    fields = HEADER.unpack_from(data)
    if fields[0] != MAGIC:
        raise Damaged("not a prefix block file of this version")
    if not hmac.compare_digest(hmac.new(secret, bytes(data[:TAGGED]), hashlib.sha256).digest(), fields[7]):
        raise Damaged("its HMAC does not check out (edited, or not written by this install)")
    return fields


def check(secret: bytes, data: bytearray, key: str, digest: str, start: int, count: int) -> memoryview:
    """The llama.cpp state of a block file's bytes, where they are the block this name promises; else Damaged."""
    _, k, d, first, n, size, sha, _ = header(secret, data)
    if k != key.encode():
        raise Damaged("saved for another model, machine or setting")
    if d != digest.encode() or first != start or n != count:
        raise Damaged(f"another block: {n} tokens at {first}")
    state = memoryview(data)[HEADER.size :]
    if len(state) != size or not hmac.compare_digest(hashlib.sha256(state).digest(), sha):
        raise Damaged("its cells are not those it was written with (truncated or corrupted)")
    return state


def own_files(folder: Path, secret: bytes) -> list[tuple[Path, int, float]]:
    """(path, size, mtime) of the block files under `folder` that this install wrote: a block's name in a model
    key's folder, a regular file, a header whose HMAC checks out with `secret` and names it, and the size that
    header gives. Version 1's files (the prompt's tokens in clear) are removed on sight; a crashed writer's
    temporary files too, once STALE, where they are empty or begin with a header of ours. Nothing else is
    touched, whatever its name."""
    out = []
    for sub in _entries(folder):
        if not (FOLDER.fullmatch(sub.name) and sub.is_dir(follow_symlinks=False)):
            continue
        try:  # (a model's folder made 0755 by version 1)
            tighten(Path(sub.path))
        except OSError:
            pass
        for entry in _entries(Path(sub.path)):
            if not (NAME.fullmatch(entry.name) or TEMP.fullmatch(entry.name)):
                continue
            path = Path(entry.path)
            try:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    continue
                head = _head(path)
            except OSError:
                continue
            if NAME.fullmatch(entry.name):
                if _old(head, sub.name, entry.name):
                    remove_quietly(path)
                elif _ours(secret, head, entry.name[: -len(SUFFIX)], st.st_size):
                    out.append((path, st.st_size, st.st_mtime))
            elif time.time() - st.st_mtime > STALE and (not head or _ours(secret, head, entry.name[1:33], None)):
                remove_quietly(path)
    return out


def _ours(secret: bytes, head: bytes, digest: str, size: int | None) -> bool:
    try:
        fields = header(secret, head)
    except Damaged:
        return False
    return fields[2] == digest.encode() and (size is None or size == HEADER.size + fields[5])


def _old(head: bytes, folder: str, name: str) -> bool:
    """A version 1 block file (magic, then the model key and the name that are its folder's and its own)."""
    return head[:8] == OLD_MAGIC and head[8:32] == folder.encode() and head[32:64] == name[:32].encode()


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


def _head(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb", buffering=0) as f:
        return f.read(HEADER.size)


def mtime(path: Path) -> float:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def read(path: Path, max_file: int) -> bytearray:
    """A block file's bytes: a regular file of at most max_file bytes (a FIFO would block a plain read)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Damaged("not a regular file")
        if st.st_size > max_file:
            raise Damaged(f"larger than a block of this model ({max_file:,} bytes at most)")
        data = bytearray(st.st_size)
        got = f.readinto(data)
    return data[:got] if got != len(data) else data


def usage() -> tuple[int, int]:
    """(blocks, bytes) the prefix cache holds: this install's files (own_files), every model's. Read-only: a
    cache that has no secret yet has no block of ours, and none is made."""
    files = own_files(root(), secret(root())) if os.path.lexists(root() / SECRET) else []
    return len(files), sum(size for _, size, _ in files)


def clear() -> tuple[int, int]:
    """Remove every block of this install and the model folders left empty; (blocks, bytes) removed. The secret
    stays (blocks written later keep their names' meaning), and no file that is not ours is touched."""
    if not os.path.lexists(root() / SECRET):
        return 0, 0
    files = own_files(root(), secret(root()))
    for path, _, _ in files:
        remove_quietly(path)
    for sub in _entries(root()):
        if FOLDER.fullmatch(sub.name) and sub.is_dir(follow_symlinks=False):
            try:
                os.rmdir(sub.path)  # only if empty
            except OSError:
                pass
    return len(files), sum(size for _, size, _ in files)
