"""The lookup cache on disk: earlier answers of a target model, kept as draft sources for later runs.

Scripts send similar requests again and again ("apply this change to each file"); what the target wrote
last time is often what it writes next. Each answer is one file in a folder per vocabulary (token ids mean
nothing under another tokenizer): written to a temporary name and renamed, so a reader never sees half a
file, and several specdec processes can write at once without a lock (two writers of the same answer write
the same bytes). The oldest answers go once the whole cache is over MAX_BYTES. A file that does not check
out (a crash mid-write on a disk without atomic rename, bit rot, a stray file) is removed with a warning;
the cache goes on without it.

Privacy, as the prefix cache's (prefixes/): an answer is what a client was told, so files are 0600 in
folders 0700 whatever the umask, and each answer is kept in a namespace that only its own drafts from: "" (the
plain one: `generate`, `batch`, a server without API key or cache_salt; file `<content hash>.tok`), else a hash
of the server's API key's hash and the request's cache_salt (`space`; file `<space>.<content hash>.tok`). So a
client cannot draft from another's answers, nor tell from its speed that a guessed text was one of them.

File: MAGIC, uint32 token count, uint32 CRC-32 of the payload, then the tokens as little-endian int32.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from .corpus import Corpus
from ..outputs import create_private, evict_oldest, home, private_folder, remove_quietly, tighten

MAGIC = b"SPDLK1\0\0"
HEADER = struct.Struct("<8sII")
MAX_BYTES = 8 << 20  # ~2M tokens over all models: a few thousand answers, loaded and indexed in ~0.1 s
MIN_TOKENS = 16  # shorter answers ("Yes.") predict nothing worth a file
SUFFIX = ".tok"
SPACE_CHARS = 24  # hex characters of a namespace: 96 bits, no two clients' alike by chance
CORPORA = 8  # namespaces kept loaded (Answers): a client inventing salts must not grow memory without bound
# What the cache writes, and all that eviction, `cache info` and `cache clear` touch: answers and a crashed writer's
# temporary files, as regular files (not links) in vocabulary folders (not links) under the root.
_VOCAB = re.compile(r"[0-9a-f]{16}")  # backend/vocab.fingerprint
_ANSWER = re.compile(rf"(?:[0-9a-f]{{{SPACE_CHARS}}}\.)?[0-9a-f]{{20}}\{SUFFIX}")
_TEMPORARY = re.compile(rf"\.{_ANSWER.pattern}\.\d+\.[0-9a-f]{{8}}\.tmp")


class Answers:
    """The lookup cache as a session holds it: each namespace's answers (`space`: the server's API key's hash,
    `key_hash`, and a request's salt) loaded once, the CORPORA most recently used kept; an answer kept goes to
    disk and into its namespace's loaded index."""

    def __init__(self, vocab_key: Callable[[], str], warn: Callable[[str], None]):
        self.key_hash = b""  # a server's (prefixes.key_hash); b"": none
        self._vocab_key, self._warn = vocab_key, warn
        self._corpora: dict[str, Corpus] = {}  # namespace -> its answers, least recently used first

    def __len__(self) -> int:
        return len(self._corpora)

    def corpus(self, salt: str | None = None) -> Corpus:
        where = space(self.key_hash, salt)
        corpus = self._corpora.pop(where, None)
        if corpus is None:
            corpus = Corpus(load(self._vocab_key(), self._warn, where))
        self._corpora[where] = corpus  # (the most recently used last)
        if len(self._corpora) > CORPORA:
            del self._corpora[next(iter(self._corpora))]
        return corpus

    def remember(self, answer: list[int], salt: str | None = None) -> None:
        where = space(self.key_hash, salt)
        kept = save(self._vocab_key(), answer, space=where)
        corpus = self._corpora.get(where)
        # A later run (a server's or a batch's next request) drafts from it too: added to the loaded index, or
        # (past the cache's bound, where the disk evicts old answers) read again.
        if corpus is not None and kept is not None and len(corpus) < MAX_BYTES // 4:
            corpus.add(answer)
        elif kept is not None:
            self._corpora.pop(where, None)


def root() -> Path:
    """$SPECDEC_LOOKUP_CACHE, else the specdec cache's lookup/ (SPECDEC_HOME moves both)."""
    if os.environ.get("SPECDEC_LOOKUP_CACHE"):
        return Path(os.path.expanduser(os.environ["SPECDEC_LOOKUP_CACHE"]))
    return home() / "lookup"


def folder(vocab_key: str) -> Path:
    return root() / vocab_key


def space(key_hash: bytes, salt: str | None) -> str:
    """Whose answers: "" without an API key (`key_hash` empty or zeros, as prefixes.key_hash(None)) and cache_salt,
    else a hash of both (neither is written anywhere)."""
    keyed = key_hash if any(key_hash) else b""
    if not keyed and not salt:
        return ""
    seed = b"specdec lookup space\0" + keyed.hex().encode() + b"\0" + (salt or "").encode()
    return hashlib.sha256(seed).hexdigest()[:SPACE_CHARS]


def file_name(space: str, data: bytes) -> str:
    """An answer's file: its content hash, after its namespace where it has one."""
    digest = hashlib.sha1(data).hexdigest()[:20]
    return f"{space}.{digest}{SUFFIX}" if space else digest + SUFFIX


def space_of(name: str) -> str:
    """The namespace of an answer file's name: "" for `<hash>.tok` (every answer before namespaces)."""
    return name[: -len(SUFFIX)].rpartition(".")[0]


def encode(tokens: list[int]) -> bytes:
    payload = np.asarray(tokens, dtype="<i4").tobytes()
    return HEADER.pack(MAGIC, len(tokens), zlib.crc32(payload)) + payload


def decode(data: bytes) -> np.ndarray | None:
    """The tokens, or None when the bytes are not a whole, intact answer file."""
    if len(data) < HEADER.size:
        return None
    magic, count, crc = HEADER.unpack_from(data)
    payload = data[HEADER.size :]
    if magic != MAGIC or len(payload) != 4 * count or zlib.crc32(payload) != crc:
        return None
    return np.frombuffer(payload, dtype="<i4").astype(np.int64)


def load(vocab_key: str, warn=lambda message: None, space: str = "") -> list[np.ndarray]:
    """Every intact answer of namespace `space` for this vocabulary, oldest first; damaged files are removed
    (with `warn`)."""
    answers: list[tuple[float, np.ndarray]] = []
    _tighten_old(vocab_key)
    if not _ours(folder(vocab_key)):  # none yet; or a link, or another user's folder: run without it
        return []
    try:
        entries = list(os.scandir(folder(vocab_key)))
    except OSError:  # not a folder we can read: run without one
        return []
    for entry in entries:
        if (
            not (_ANSWER.fullmatch(entry.name) and entry.is_file(follow_symlinks=False))
            or space_of(entry.name) != space
        ):
            continue
        try:
            with open(entry.path, "rb") as f:
                data = f.read(MAX_BYTES + HEADER.size + 1)
            mtime = entry.stat().st_mtime
        except OSError:  # removed meanwhile by another process's eviction
            continue
        tokens = decode(data)
        if tokens is None:
            warn(f"lookup cache file {entry.path} is damaged; removed (the cache rebuilds as you run)")
            remove_quietly(Path(entry.path))
            continue
        answers.append((mtime, tokens))
    answers.sort(key=lambda a: a[0])
    return [tokens for _, tokens in answers]


def _tighten_old(vocab_key: str) -> None:
    """Make the folders a version before privacy left 0755 (its files 0644 in them) 0700, before any run reads."""
    for where in (root(), folder(vocab_key)):
        try:
            tighten(where)
        except OSError:  # no cache yet, or a read-only disk: nothing to do, or nothing we can do
            pass


def save(vocab_key: str, tokens: list[int], max_bytes: int = MAX_BYTES, space: str = "") -> Path | None:
    """Store one answer in namespace `space` (atomically), then evict the oldest answers past `max_bytes`. None
    when the answer is too short to keep or the cache cannot be written (a read-only home: the run is unaffected)."""
    if len(tokens) < MIN_TOKENS:
        return None
    data = encode(tokens)
    if len(data) > max_bytes:
        return None
    where = folder(vocab_key)
    path = where / file_name(space, data)
    tmp = where / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        private_folder(root(), link_ok=True)  # (mkdir's parents would be made under the umask)
        private_folder(where)  # (NotOurs, an OSError: a link, or another user's folder, who could read the answers)
        with create_private(tmp) as f:
            f.write(data)
        os.replace(tmp, path)  # the same answer again: same name, same bytes, and its age starts over
    except OSError:
        remove_quietly(tmp)
        return None
    evict(max_bytes)
    return path


def evict(max_bytes: int = MAX_BYTES) -> None:
    """Remove the oldest answers, over every vocabulary, until the cache holds at most max_bytes."""
    evict_oldest(_own(_ANSWER), max_bytes)


def usage() -> tuple[int, int]:
    """(answers, bytes) in the whole cache: every vocabulary and namespace."""
    sizes = []
    for path in _own(_ANSWER):
        try:
            sizes.append(path.lstat().st_size)
        except OSError:
            continue
    return len(sizes), sum(sizes)


def clear() -> tuple[int, int]:
    """Remove every answer file of every namespace (and a crashed writer's temporary file) and the folders left
    empty; (answers, bytes) removed. Only what the cache writes is touched: $SPECDEC_LOOKUP_CACHE pointed at a
    folder of other files leaves those files (and the folder) in place."""
    answers, size = usage()
    for path in [*_own(_ANSWER), *_own(_TEMPORARY)]:
        remove_quietly(path)
    for folder_ in [*_vocab_folders(), root()]:
        try:
            folder_.rmdir()  # only if empty
        except OSError:
            pass
    return answers, size


def _ours(path: Path) -> bool:
    """A folder itself (not a link to one) that this user owns."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and (not hasattr(os, "getuid") or st.st_uid == os.getuid())


def _vocab_folders() -> list[Path]:
    try:
        entries = list(os.scandir(root()))
    except OSError:
        return []
    return [Path(e.path) for e in entries if _VOCAB.fullmatch(e.name) and _ours(Path(e.path))]


def _own(pattern: re.Pattern) -> list[Path]:
    """The cache's own files whose names `pattern` matches: regular files, in its vocabulary folders."""
    out = []
    for where in _vocab_folders():
        try:
            entries = list(os.scandir(where))
        except OSError:
            continue
        out += [Path(e.path) for e in entries if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
    return out
