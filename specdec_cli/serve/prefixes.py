"""Long prompts' KV cells kept on disk, so that a server does not prefill again a prompt it has seen: an agent
sends thousands of tokens of system prompt and tools every turn, and after a restart (or another conversation
in between) the caches hold none of them.

A prompt is cut into blocks of BLOCK tokens from its start. Block i is stored once, as the target's KV cells
of positions iB..(i+1)B-1, under a name that hashes the model's key and every token up to the block's end (its
cells depend on all of them). So two prompts that share their first 3,600 tokens share their first 7 blocks
whatever follows (another user message), a conversation adds only its new blocks, and a restore loads the
longest run of blocks that starts the new prompt, in place of prefilling it. Only the target's cells: the
draft model is fed a window of the text lazily, as it is after any prompt (drafting/window.py).

A block's cells are those a cold prefill computes, bit for bit, so a restored run's output is a cold run's:
block boundaries are where a cold prefill's ubatches start (BLOCK), and in exact mode every prompt token of a
reusing run is decoded through the reference kernels (session.py), which the key includes.

File: HEADER (magic, the model key, the block's chain digest, its first position, token count, CRC-32 of
the rest), the block's tokens as little-endian int32, then llama.cpp's state of those cells (the bytes of
llama_state_seq_get_data: llama.cpp's own state files carry no checksum and no model identity beyond layer
sizes). Written to a temporary name and renamed: two servers writing a block at once each replace it whole.
A file that does not check out is one warning, removed, and the prompt is prefilled from that block on.
The oldest files go once all of them are over the bound: least recently used first, and within a prompt its
last blocks first (a block is of no use without those before it).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import stat
import struct
import time
import zlib
from pathlib import Path
from typing import Callable

import llama_cpp
import llama_cpp.llama_cpp as L
import numpy as np

from ..backend import cpu
from ..drafting import curves
from ..engine import kv
from ..models.store import home
from ..outputs import evict_oldest, remove_quietly

BLOCK = 512  # backend/context.py's n_ubatch: a cold prefill's ubatches start at its multiples
MIN_PROMPT = 1024  # shorter prompts are not saved: each block is a file (about 14 MiB for the 1.5B target)
MAX_BYTES = 2 << 30  # the default bound over every model: about 75,000 tokens of the 1.5B target
SCRATCH = 1  # the sequence a block passes through: between runs only sequence 0 holds cells (kv.Branches)
STALE = 3600.0  # seconds: a temporary file this old is a crashed writer's
VERSION = 1
MAGIC = b"SPDKV1\0\0"
HEADER = struct.Struct("<8s24s32sIII")  # magic, model key, chain digest, first position, tokens, CRC-32
SUFFIX = ".kv"

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


def attach(session, max_bytes: int, warn: Warn) -> str | None:
    """Give a server's session a store of prompt blocks (`session.prefixes`); the reason when its target
    cannot have one (None: it has)."""
    target, ctx = session.target, session.target_ctx
    if target.rollback != "cells" or target.sliding_window:
        return f"{target.name} keeps a recurrent or sliding-window cache, whose cells are not saved by position"
    if ctx.n_seq <= SCRATCH:
        return f"{target.name}'s context has no spare sequence to save blocks through"
    key = model_key(session)
    # A block's file is its cells and their metadata: twice the cells' bytes is room enough, and bounds
    # what a crafted file can make us read.
    max_file = 2 * BLOCK * target.kv_bytes_per_token() + (1 << 20)
    session.prefixes = Store(root() / key, key, max_bytes, warn, max_file)
    return None


def digests(key: str, tokens: list[int]) -> list[str]:
    """Each whole block's name: a hash of the model key and every token up to the block's end."""
    h = hashlib.sha256(key.encode())
    out = []
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        h.update(np.asarray(tokens[end - BLOCK : end], dtype="<i4").tobytes())
        out.append(h.copy().hexdigest()[:32])
    return out


def encode(key: str, digest: str, start: int, tokens: list[int], state) -> list[bytes | memoryview]:
    """A block file's parts, in order (`state`: llama.cpp's bytes, any buffer)."""
    body = np.asarray(tokens, dtype="<i4").tobytes()
    crc = zlib.crc32(state, zlib.crc32(body))
    return [HEADER.pack(MAGIC, key.encode(), digest.encode(), start, len(tokens), crc), body, memoryview(state)]


def check(data: bytearray, key: str, digest: str, start: int, tokens: list[int]) -> memoryview:
    """The llama.cpp state of a block file's bytes, where they are the block this name promises; else Damaged."""
    if len(data) < HEADER.size:
        raise Damaged("shorter than a header")
    magic, k, d, first, count, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise Damaged("not a prefix block file of this version")
    if k != key.encode():
        raise Damaged("saved for another model, machine or setting")
    if d != digest.encode() or first != start or count != len(tokens):
        raise Damaged(f"another block: {count} tokens at {first}")
    body_end = HEADER.size + 4 * count
    if len(data) <= body_end or data[HEADER.size : body_end] != np.asarray(tokens, dtype="<i4").tobytes():
        raise Damaged("its tokens are not the prompt's")
    view = memoryview(data)
    if zlib.crc32(view[body_end:], zlib.crc32(view[HEADER.size : body_end])) != crc:
        raise Damaged("checksum mismatch (truncated or corrupted)")
    return view[body_end:]


class Store:
    """The blocks of one target (folder: root()/key), bounded over every model's by max_bytes."""

    def __init__(
        self, folder: Path, key: str, max_bytes: int = MAX_BYTES, warn: Warn = lambda m: None, max_file: int = 1 << 30
    ):
        self.folder, self.key, self.max_bytes, self.warn, self.max_file = folder, key, max_bytes, warn, max_file
        self._warned_write = False
        self.last_save: tuple[int, int, float] | None = None  # blocks written, bytes, seconds (scripts report it)
        self.pending: list[int] | None = None  # the last prompt restored for, to keep once it is answered

    def restore(self, seq: kv.Sequence, tokens: list[int]) -> int:
        """Load into `seq` the saved blocks that start `tokens` (but its last token: a run decodes that
        itself) where they reach past what it holds; returns how many tokens it holds now. The prompt is
        `pending`: to save once answered (the server's work loop, between requests)."""
        self.pending = tokens
        chain = digests(self.key, tokens[:-1])
        if not chain:  # shorter than a block: nothing to look for
            return len(seq)
        names = self._names()
        m = next((i for i, d in enumerate(chain) if d not in names), len(chain))
        if m * BLOCK <= len(seq):
            return len(seq)
        self._touch([self.folder / names[d] for d in chain[:m]])
        seq.rollback(len(seq) // BLOCK * BLOCK)  # a whole block's cells are the file's (the same bits)
        for i in range(len(seq) // BLOCK, m):
            path, start = self.folder / names[chain[i]], i * BLOCK
            try:
                self._load(seq, path, chain[i], start, tokens[start : start + BLOCK])
            except FileNotFoundError:  # another server's eviction took it meanwhile: prefill the rest
                break
            except (OSError, Damaged) as e:
                self.warn(
                    f"ignored a damaged prefix cache file {path} ({e}); prefilling the prompt from token {start:,}"
                )
                remove_quietly(path)
                break
            seq.restored(tokens[: start + BLOCK])
        return len(seq)

    def _load(self, seq: kv.Sequence, path: Path, digest: str, start: int, block: list[int]) -> None:
        state = check(_read(path, self.max_file), self.key, digest, start, block)
        ctx = seq.ctx
        kv.clear(ctx, [SCRATCH])
        try:
            buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
            read = L.llama_state_seq_set_data(ctx._ptr, buf, len(state), SCRATCH)
            # llama.cpp read it all, as the cells of exactly this block's positions: then they join the prompt's.
            if read != len(state) or ctx.seq_pos_range(SCRATCH) != (start, start + len(block) - 1):
                raise Damaged("llama.cpp did not read it back as this block's cells")
            ctx.seq_cp(SCRATCH, seq.seq_id, -1, -1)
        finally:
            kv.clear(ctx, [SCRATCH])

    def save(self, seq: kv.Sequence, tokens: list[int]) -> int:
        """Keep the whole blocks of the prompt `tokens` that `seq` holds (a prompt of MIN_PROMPT tokens or
        more), those on disk already marked as used; then the bound. Returns the blocks written."""
        if len(tokens) - 1 < MIN_PROMPT:
            return 0
        t0, written, size = time.perf_counter(), 0, 0
        chain = digests(self.key, tokens[: min(seq.shared(tokens), len(tokens) - 1)])
        names = self._names()
        for i, digest in enumerate(chain):
            if digest not in names:
                block = tokens[i * BLOCK : (i + 1) * BLOCK]
                wrote = self._write(digest, encode(self.key, digest, i * BLOCK, block, _block(seq, i)))
                if not wrote:  # (a full or read-only disk: the next blocks would fail alike)
                    break
                written, size = written + 1, size + wrote
        self._touch([self.folder / (d + SUFFIX) for d in chain])
        if written:
            self.last_save = (written, size, time.perf_counter() - t0)
        evict(self.max_bytes)
        return written

    def _write(self, digest: str, parts: list) -> int:
        path = self.folder / (digest + SUFFIX)
        tmp = self.folder / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
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
            return {n[: -len(SUFFIX)]: n for n in os.listdir(self.folder) if n.endswith(SUFFIX) and n[0] != "."}
        except OSError:  # no cache yet, or not a folder we can read
            return {}

    def _touch(self, paths: list[Path]) -> None:
        """Used now: block i a microsecond older than block i - 1, so that eviction takes a prompt's tail first."""
        now = time.time_ns()
        for i, path in enumerate(paths):
            try:
                os.utime(path, ns=(now - 1000 * i, now - 1000 * i))
            except OSError:  # evicted meanwhile
                pass


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
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Damaged("not a regular file")
        if st.st_size > max_file:
            raise Damaged(f"larger than a block of this model ({max_file:,} bytes at most)")
        data = bytearray(st.st_size)
        got = f.readinto(data)
    return data[:got] if got != len(data) else data


def evict(max_bytes: int) -> None:
    """Remove the least recently used blocks, over every model, until the files hold at most max_bytes;
    and the temporary files of writers that crashed."""
    evict_oldest(root().glob(f"*/*{SUFFIX}"), max_bytes)
    for path in root().glob("*/.*.tmp"):
        try:
            if time.time() - path.stat().st_mtime > STALE:
                remove_quietly(path)
        except OSError:
            continue
