"""Long prompts' KV cells kept on disk, so that a server does not prefill again a prompt it has seen: an agent
sends thousands of tokens of system prompt and tools every turn, and after a restart (or another conversation
in between) the caches hold none of them.

A prompt is cut into blocks of BLOCK tokens from its start. Block i is stored once, as the target's KV cells
of positions iB..(i+1)B-1, under a name that hashes the model's key, the namespace and every token up to the
block's end (its cells depend on all of them). So two prompts that share their first 3,600 tokens share their
first 7 blocks whatever follows (another user message), a conversation adds only its new blocks, and a restore
loads the longest run of blocks that starts the new prompt, in place of prefilling it. Only the target's cells:
the draft model is fed a window of the text lazily, as it is after any prompt (drafting/window.py).

A block's cells are those a cold prefill computes, bit for bit, so a restored run's output is a cold run's:
block boundaries are where a cold prefill's ubatches start (BLOCK), and in exact mode every prompt token of a
reusing run is decoded through the reference kernels (session.py), which the key includes.

Privacy. The cells stand for the prompt, secrets pasted in it included, so: files 0600 in folders 0700 whatever
the umask; a name is an HMAC keyed by the install's secret (SECRET: 32 random bytes, 0600), so a name cannot be
computed from a guessed prompt; the namespace (a hash of the server's API key, never the key, and a request's
`cache_salt`) is in every name, so a client restores only blocks of its own namespace; the tokens themselves
are not stored; a block unused for the lifetime (LIFETIME) is removed.

File: HEADER (magic, the model key, the block's name, its first position, token count, the state's size and
SHA-256, then an HMAC-SHA256 of all that with the secret), then llama.cpp's state of those cells (the bytes of
llama_state_seq_get_data: llama.cpp's own state files carry no checksum and no model identity beyond layer
sizes). The HMAC makes a file that was not written with the secret (edited, crafted, another install's) fail
the check, and lets eviction recognise its own files from their header alone. Written to a temporary name and
renamed: two servers writing a block at once each replace it whole. A file that does not check out is one
warning, removed, and the prompt is prefilled from that block on. The oldest files go once all of them are
over the bound: least recently used first, and within a prompt its last blocks first (a block is of no use
without those before it). Eviction and expiry remove only files that are this store's by name, folder and an
HMAC-checked header: never another file under the folder.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import os
import platform
import re
import stat
import struct
import time
from pathlib import Path
from typing import Callable

import llama_cpp
import llama_cpp.llama_cpp as L
import numpy as np

from ..backend import cpu
from ..drafting import curves
from ..engine import kv
from ..outputs import create_private, evict_oldest, home, private_folder, remove_quietly, tighten

BLOCK = 512  # backend/context.py's n_ubatch: a cold prefill's ubatches start at its multiples
MIN_PROMPT = 1024  # shorter prompts are not saved: each block is a file (about 14 MiB for the 1.5B target)
MAX_BYTES = 2 << 30  # the default bound over every model: about 75,000 tokens of the 1.5B target
LIFETIME = 24 * 3600.0  # seconds a block may go unused: a day's sessions reuse it, a pasted secret goes the next
STOP_SECONDS = 5.0  # what a graceful stop may spend writing the last prompt's blocks (milliseconds each)
SCRATCH = 1  # the sequence a block passes through: between runs only sequence 0 holds cells (kv.Branches)
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

Warn = Callable[[str], None]


class Damaged(Exception):
    """A block file that does not check out: its reason."""


def root() -> Path:
    """$SPECDEC_PREFIX_CACHE, else the specdec cache's prefix/ (SPECDEC_HOME moves it with the others)."""
    if os.environ.get("SPECDEC_PREFIX_CACHE"):
        return Path(os.path.expanduser(os.environ["SPECDEC_PREFIX_CACHE"]))
    return home() / "prefix"


def model_key(session) -> str:
    """What a block's cells depend on besides its tokens: the model file, the machine and its kernels, exact
    mode (reference kernels for the prompt), threads, where the target runs, llama.cpp's build and format."""
    cfg = session.cfg
    parts = {
        "format": VERSION,
        "host": platform.node(),
        "cpu": cpu.features(),
        "model": curves.file_identity(cfg.target),
        "exact": cfg.exact,
        "threads": cfg.threads,
        "where": session.where,
        "llama_cpp": llama_cpp.__version__,
    }
    return curves.key(parts)


def key_hash(api_key: str | None) -> bytes:
    """What a namespace keeps of the server's API key: a hash (the key itself is never written anywhere)."""
    return hashlib.sha256(b"specdec api key\0" + api_key.encode()).digest() if api_key else bytes(32)


def attach(session, max_bytes: int, warn: Warn, api_key: str | None = None, lifetime: float = LIFETIME) -> str | None:
    """Give a server's session a store of prompt blocks (`session.prefixes`); the reason when its target
    cannot have one (None: it has). Blocks are namespaced by `api_key` (a hash of it)."""
    target, ctx = session.target, session.target_ctx
    if target.rollback != "cells" or target.sliding_window:
        return f"{target.name} keeps a recurrent or sliding-window cache, whose cells are not saved by position"
    if ctx.n_seq <= SCRATCH:
        return f"{target.name}'s context has no spare sequence to save blocks through"
    try:
        key_secret = secret(root())
    except OSError as e:
        return f"cannot write the prefix cache {root()} ({e.strerror or e})"
    except Damaged as e:
        return f"its secret {root() / SECRET} {e}: remove it (a new one is made; the blocks kept so far are lost)"
    key = model_key(session)
    # A block's file is its cells and their metadata: twice the cells' bytes is room enough, and bounds
    # what a crafted file can make us read.
    max_file = 2 * BLOCK * target.kv_bytes_per_token() + (1 << 20)
    store = Store(root() / key, key, max_bytes, warn, max_file, key_secret, key_hash(api_key), lifetime)
    store.tidy()
    session.prefixes = store
    return None


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


class Store:
    """The blocks of one target (folder: root()/key), bounded over every model's by max_bytes, each block kept
    while it is used within `lifetime` seconds."""

    def __init__(
        self,
        folder: Path,
        key: str,
        max_bytes: int = MAX_BYTES,
        warn: Warn = lambda m: None,
        max_file: int = 1 << 30,
        secret: bytes = bytes(32),
        keyed: bytes = bytes(32),
        lifetime: float = LIFETIME,
    ):
        self.folder, self.key, self.max_bytes, self.warn, self.max_file = folder, key, max_bytes, warn, max_file
        self.secret, self.keyed, self.lifetime = secret, keyed, lifetime
        self._warned_write = False
        self.last_save: tuple[int, int, float] | None = None  # blocks written, bytes, seconds (scripts report it)
        self.pending: tuple[list[int], str | None] | None = None  # the last prompt restored for and its salt,
        # to keep once it is answered

    def chain(self, tokens: list[int], salt: str | None = None) -> list[str]:
        """The names of the whole blocks of `tokens`, in the namespace of this server's key and `salt`."""
        return digests(self.secret, self.key, tokens, namespace(self.keyed, salt))

    def restore(self, seq: kv.Sequence, tokens: list[int], salt: str | None = None) -> int:
        """Load into `seq` the saved blocks of the namespace of `salt` that start `tokens` (but its last token: a
        run decodes that itself) where they reach past what it holds; returns how many tokens it holds now. The
        prompt is `pending`: to save once answered (the server's work loop, between requests)."""
        self.pending = (tokens, salt)
        chain = self.chain(tokens[:-1], salt)
        if not chain:  # shorter than a block: nothing to look for
            return len(seq)
        names, oldest = self._names(), time.time() - self.lifetime
        kept = (d in names and _mtime(self.folder / names[d]) >= oldest for d in chain)  # (expired: as if gone)
        m = next((i for i, k in enumerate(kept) if not k), len(chain))
        if m * BLOCK <= len(seq):
            return len(seq)
        self._touch([self.folder / names[d] for d in chain[:m]])
        seq.rollback(len(seq) // BLOCK * BLOCK)  # a whole block's cells are the file's (the same bits)
        for i in range(len(seq) // BLOCK, m):
            path, start = self.folder / names[chain[i]], i * BLOCK
            try:
                self._load(seq, path, chain[i], start)
            except FileNotFoundError:  # another server's eviction took it meanwhile: prefill the rest
                break
            except (OSError, Damaged) as e:
                self.warn(
                    f"ignored a damaged prefix cache file {path} ({e}); prefilling the prompt from token {start:,}"
                )
                remove_quietly(path)  # (a name of ours in our folder: the next save writes it again)
                break
            seq.restored(tokens[: start + BLOCK])
        return len(seq)

    def _load(self, seq: kv.Sequence, path: Path, digest: str, start: int) -> None:
        state = check(self.secret, _read(path, self.max_file), self.key, digest, start, BLOCK)
        ctx = seq.ctx
        kv.clear(ctx, [SCRATCH])
        try:
            buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
            read = L.llama_state_seq_set_data(ctx._ptr, buf, len(state), SCRATCH)
            # llama.cpp read it all, as the cells of exactly this block's positions: then they join the prompt's.
            if read != len(state) or ctx.seq_pos_range(SCRATCH) != (start, start + BLOCK - 1):
                raise Damaged("llama.cpp did not read it back as this block's cells")
            ctx.seq_cp(SCRATCH, seq.seq_id, -1, -1)
        finally:
            kv.clear(ctx, [SCRATCH])

    def save(self, seq: kv.Sequence, tokens: list[int], salt: str | None = None, deadline: float = float("inf")) -> int:
        """Keep the whole blocks of the prompt `tokens` that `seq` holds (a prompt of MIN_PROMPT tokens or
        more) in the namespace of `salt`, those on disk already marked as used; then the bound and the lifetime.
        Writes no block past `deadline` (time.monotonic: a stopping server's). Returns the blocks written."""
        if len(tokens) - 1 < MIN_PROMPT:
            return 0
        t0, written, size = time.perf_counter(), 0, 0
        chain = self.chain(tokens[: min(seq.shared(tokens), len(tokens) - 1)], salt)
        names = self._names()
        for i, digest in enumerate(chain):
            if digest not in names:
                if time.monotonic() > deadline:
                    break
                wrote = self._write(digest, encode(self.secret, self.key, digest, i * BLOCK, BLOCK, _block(seq, i)))
                if not wrote:  # (a full or read-only disk: the next blocks would fail alike)
                    break
                written, size = written + 1, size + wrote
        self._touch([self.folder / (d + SUFFIX) for d in chain])
        if written:
            self.last_save = (written, size, time.perf_counter() - t0)
        self.tidy()
        return written

    def unsaved(self, seq: kv.Sequence, tokens: list[int], salt: str | None = None) -> int:
        """How many blocks `save` would write (a stopping server says so)."""
        if len(tokens) - 1 < MIN_PROMPT:
            return 0
        names = self._names()
        return sum(d not in names for d in self.chain(tokens[: min(seq.shared(tokens), len(tokens) - 1)], salt))

    def _write(self, digest: str, parts: list) -> int:
        path = self.folder / (digest + SUFFIX)
        tmp = self.folder / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        try:
            private_folder(self.folder)
            with create_private(tmp) as f:
                for part in parts:
                    f.write(part)
            os.replace(tmp, path)  # readers see the old file or the new one, whole
            return sum(len(p) for p in parts)
        except OSError as e:  # a read-only or full disk: the server goes on without this block
            if not self._warned_write:
                self.warn(f"cannot write the prefix cache {self.folder} ({e.strerror or e}); long prompts are not kept")
                self._warned_write = True
            return 0
        finally:
            remove_quietly(tmp)  # (gone already, once renamed)

    def _names(self) -> dict[str, str]:
        """digest -> file name, of the blocks on disk."""
        try:
            return {n[: -len(SUFFIX)]: n for n in os.listdir(self.folder) if NAME.fullmatch(n)}
        except OSError:  # no cache yet, or not a folder we can read
            return {}

    def _touch(self, paths: list[Path]) -> None:
        """Used now: block i a microsecond older than block i - 1, so that eviction takes a prompt's tail first."""
        now = time.time_ns()
        for i, path in enumerate(paths):
            try:
                os.utime(path, ns=(now - 1000 * i, now - 1000 * i), follow_symlinks=False)
            except (OSError, NotImplementedError):  # evicted meanwhile
                pass

    def tidy(self) -> None:
        """Expiry, then the bound, over every model's blocks of this install: only files of ours (own_files)."""
        files, now = own_files(root(), self.secret), time.time()
        for path, _, mtime in files:
            if now - mtime > self.lifetime:
                remove_quietly(path)
        evict_oldest((path for path, _, mtime in files if now - mtime <= self.lifetime), self.max_bytes)


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


def _mtime(path: Path) -> float:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _block(seq: kv.Sequence, i: int) -> ctypes.Array:
    """llama.cpp's state of block i's cells: copied to the scratch sequence (sharing its cells) and read."""
    ctx = seq.ctx
    kv.clear(ctx, [SCRATCH])
    try:
        ctx.seq_cp(seq.seq_id, SCRATCH, i * BLOCK, (i + 1) * BLOCK)
        size = L.llama_state_seq_get_size(ctx._ptr, SCRATCH)
        buf = (ctypes.c_uint8 * size)()
        if L.llama_state_seq_get_data(ctx._ptr, buf, size, SCRATCH) != size:
            raise OSError(f"llama.cpp could not copy block {i}'s cells")
        return buf
    finally:
        kv.clear(ctx, [SCRATCH])


def _read(path: Path, max_file: int) -> bytearray:
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
