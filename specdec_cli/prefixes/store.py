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

import contextlib
import ctypes
import hashlib
import os
import time
from pathlib import Path
from typing import Callable, Protocol


from .. import identity
from ..backend.context import Context
from ..backend.native import Model
from ..engine import kv
from ..outputs import create_private, evict_oldest, private_folder, remove_quietly
from . import blocks
from .blocks import (
    BLOCK,
    NAME,
    SECRET,
    SUFFIX,
    VERSION,
    Damaged,
    check,
    digests,
    encode,
    namespace,
    own_files,
    root,
    secret,
)

MIN_PROMPT = 1024  # shorter prompts are not saved: each block is a file (about 14 MiB for the 1.5B target)
MAX_BYTES = 2 << 30  # the default bound over every model: about 75,000 tokens of the 1.5B target
LIFETIME = 24 * 3600.0  # seconds a block may go unused: a day's sessions reuse it, a pasted secret goes the next
STOP_SECONDS = 5.0  # what a graceful stop may spend writing the last prompt's blocks (milliseconds each)
SCRATCH = 1  # the sequence a block passes through: between runs only sequence 0 holds cells (kv.Branches)

Warn = Callable[[str], None]


class Settings(Protocol):
    """What of a run's configuration a block's cells depend on (options.RunConfig)."""

    target: str
    exact: bool
    threads: int


def model_key(cfg: Settings, where: str) -> str:
    """What a block's cells depend on besides its tokens: the computation (identity.py: the target's file, exact
    mode's reference kernels for the prompt, threads, `where` the target runs) and the blocks' format."""
    return identity.key({**identity.computation([cfg.target], cfg.threads, cfg.exact, where), "format": VERSION})


def key_hash(api_key: str | None) -> bytes:
    """What a namespace keeps of the server's API key: a hash (the key itself is never written anywhere)."""
    return hashlib.sha256(b"specdec api key\0" + api_key.encode()).digest() if api_key else bytes(32)


def opened(
    target: Model, ctx: Context, key: str, max_bytes: int, warn: Warn, api_key: str | None, lifetime: float
) -> Store | str:
    """A store of `target`'s prompt blocks (`key`: model_key), tidied; the reason when it cannot have one.
    Blocks are namespaced by `api_key` (a hash of it)."""
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
    # A block's file is its cells and their metadata: twice the cells' bytes is room enough, and bounds
    # what a crafted file can make us read.
    max_file = 2 * BLOCK * target.kv_bytes_per_token() + (1 << 20)
    store = Store(root() / key, key, max_bytes, warn, max_file, key_secret, key_hash(api_key), lifetime)
    store.tidy()
    return store


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

    def restore(
        self, seq: kv.Sequence, tokens: list[int], salt: str | None = None, released=contextlib.nullcontext
    ) -> int:
        """Load into `seq` the saved blocks of the namespace of `salt` that start `tokens` (but its last token: a
        run decodes that itself) where they reach past what it holds; returns how many tokens it holds now. The
        prompt is `pending`: to save once answered (the server's work loop, between requests). A file is read and
        checked `released()` (a server slot's: the other slots' steps go on meanwhile)."""
        self.pending = (tokens, salt)
        chain = self.chain(tokens[:-1], salt)
        if not chain:  # shorter than a block: nothing to look for
            return len(seq)
        names, oldest = self._names(), time.time() - self.lifetime
        kept = (d in names and blocks.mtime(self.folder / names[d]) >= oldest for d in chain)  # (expired: as if gone)
        m = next((i for i, k in enumerate(kept) if not k), len(chain))
        if m * BLOCK <= len(seq):
            return len(seq)
        self._touch([self.folder / names[d] for d in chain[:m]])
        seq.rollback(len(seq) // BLOCK * BLOCK)  # a whole block's cells are the file's (the same bits)
        for i in range(len(seq) // BLOCK, m):
            path, start = self.folder / names[chain[i]], i * BLOCK
            try:
                self._load(seq, path, chain[i], start, released)
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

    def _load(self, seq: kv.Sequence, path: Path, digest: str, start: int, released) -> None:
        with released():
            state = check(self.secret, blocks.read(path, self.max_file), self.key, digest, start, BLOCK)
        ctx = seq.ctx
        kv.clear(ctx, [SCRATCH])
        try:
            read = ctx.set_seq_state(state, SCRATCH)
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

    def keep(self, seq: kv.Sequence | None, deadline: float = float("inf")) -> None:
        """Save the `pending` prompt (the last restored for) from `seq`, where it still holds its cells (None: emptied
        since), by `deadline`; then nothing is pending. A signal that cuts it leaves the prompt pending, for a
        stopping server's last write."""
        if self.pending is None:
            return
        try:
            if seq is not None:
                self.save(seq, *self.pending, deadline)
        except Exception:
            self.pending = None
            raise
        self.pending = None

    def unkept(self, seq: kv.Sequence | None) -> int:
        """How many blocks `keep` would write."""
        return self.unsaved(seq, *self.pending) if seq is not None and self.pending is not None else 0

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


def _block(seq: kv.Sequence, i: int) -> ctypes.Array:
    """llama.cpp's state of block i's cells: copied to the scratch sequence (sharing its cells) and read."""
    ctx = seq.ctx
    kv.clear(ctx, [SCRATCH])
    try:
        ctx.seq_cp(seq.seq_id, SCRATCH, i * BLOCK, (i + 1) * BLOCK)
        try:
            return ctx.seq_state(SCRATCH)
        except OSError:
            raise OSError(f"llama.cpp could not copy block {i}'s cells") from None
    finally:
        kv.clear(ctx, [SCRATCH])
