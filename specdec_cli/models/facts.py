"""What a GGUF file holds, read from its header alone (no weights, no llama.cpp): a model, a projector, an
adapter or a vocabulary; its architecture, parameters, quantisation, split and vocabulary.

Listing the model stores reads hundreds of headers, and a real vocabulary's header is megabytes (150k token
texts, as many merges): what was read is kept in the specdec cache (gguf-facts.json), keyed by the file's
resolved path, size and modification time, so that each header is read once. The file is replaced whole
(written under another name, then renamed); a damaged one is read as empty and written again.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import struct
from dataclasses import asdict, dataclass
from math import prod
from pathlib import Path

from ..backend import draft_files
from ..backend.gguf_file import Array, Malformed, read_header
from ..outputs import home

VERSION = (
    4  # 2: width, layers, the head's bytes and a hidden-state draft's description; 3: its vocabulary, d2t; 4: embd
)
MAX_SIZE_DIFFERENCE = 128  # llama.cpp pairs vocabularies up to this many tokens apart (backend/vocab.py)
FIRST_CHECKED_ID = 5  # and compares their texts from this id on
MAX_INDEX = 64 << 20  # bytes: a cache file larger than this is not ours

# llama_ftype (llama.h): general.file_type, the quantisation most tensors have.
FTYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}  # fmt: skip


@dataclass(frozen=True)
class Vocab:
    """A vocabulary as llama.cpp's pairing rule compares two: type, size, BOS/EOS and the token texts."""

    type: str  # tokenizer.ggml.model: "gpt2" (BPE), "llama" (SentencePiece), ...
    pre: str  # tokenizer.ggml.pre: with the type, what add_bos/add_eos default to where they are not written
    size: int
    bos: int | None
    eos: int | None
    add_bos: bool | None  # as written in the file (None: llama.cpp's default for the type)
    add_eos: bool | None
    # Digests of the token texts from FIRST_CHECKED_ID up to m, for each m from size - MAX_SIZE_DIFFERENCE to
    # size (8 bytes each, in hex): two vocabularies at most that far apart agree where llama.cpp compares them
    # (up to the smaller size) exactly when their digests at the smaller size agree.
    tail: str

    def digest_at(self, m: int) -> str | None:
        i = m - max(FIRST_CHECKED_ID, self.size - MAX_SIZE_DIFFERENCE)
        return self.tail[16 * i : 16 * i + 16] if 0 <= i and 16 * i < len(self.tail) else None


@dataclass(frozen=True)
class Facts:
    kind: str  # "model" | "projector" (mmproj) | "adapter" (LoRA) | "vocabulary" (no weights) | "other"
    arch: str
    name: str  # general.name
    basename: str  # general.basename: the family ("Qwen2.5-Coder"), where the converter wrote it
    finetune: str  # general.finetune ("Instruct")
    params: int  # elements in this file's tensors (a split model's parts add up)
    quant: str
    split: tuple[int, int]  # (this part's number from 1, parts)
    context: int
    vocab: Vocab | None
    width: int = 0  # {arch}.embedding_length
    layers: int = 0  # {arch}.block_count
    head_bytes: int = 0  # its output head's (the token embeddings where it has none): what a draft borrowing it reads
    draft: dict | None = None  # an EAGLE-3 or DFlash draft: backend/draft_files.DraftFile's fields but its path

    @staticmethod
    def from_json(d: dict) -> Facts:
        v, draft = d.get("vocab"), d.get("draft")
        if draft is not None:
            draft = {**draft, "layers": tuple(draft["layers"])}
        return Facts(**{**d, "split": tuple(d["split"]), "vocab": Vocab(**v) if v else None, "draft": draft})


def read(path: Path) -> Facts:
    """The facts of the GGUF file at `path` (a regular file: the caller has checked). Raises Malformed (not a
    GGUF, truncated, damaged) or OSError."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    with open(os.open(path, flags), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced by a FIFO since the caller's stat
            raise Malformed("not a regular file")
        if f.read(4) != b"GGUF":
            raise Malformed("not a GGUF file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _facts(buf)


def _facts(buf) -> Facts:
    h = read_header(buf)
    meta = h.metadata
    arch = _str(meta, "general.architecture")
    split = (_int(meta, "split.no", 0) + 1, max(_int(meta, "split.count", 1), 1))
    gtype = _str(meta, "general.type")
    if gtype == "mmproj" or arch == "clip":
        kind = "projector"
    elif gtype == "adapter" or "adapter.type" in meta:
        kind = "adapter"
    elif gtype == "imatrix" or "imatrix.datasets" in meta:
        kind = "other"
    elif not h.tensors and split[1] == 1:
        kind = "vocabulary"
    else:
        kind = "model"
    ftype = meta.get("general.file_type")
    tensors = {t.name: t for t in h.tensors}
    head = tensors.get("output.weight") or tensors.get("token_embd.weight")
    return Facts(
        kind=kind,
        arch=arch,
        name=_str(meta, "general.name"),
        basename=_str(meta, "general.basename"),
        finetune=_str(meta, "general.finetune"),
        params=sum(prod(t.shape) for t in h.tensors),
        quant=FTYPES.get(ftype, "") if isinstance(ftype, int) else "",
        split=split,
        context=_int(meta, f"{arch}.context_length", 0),
        vocab=_vocab(buf, meta),
        width=_int(meta, f"{arch}.embedding_length", 0),
        layers=_int(meta, f"{arch}.block_count", 0),
        head_bytes=head.nbytes if head is not None else 0,
        draft=draft_files.describe(meta, set(tensors), draft_files.d2t_problem(buf, h), draft_files.embd_rows(h)),
    )


def _str(meta: dict, key: str) -> str:
    value = meta.get(key)
    return value if isinstance(value, str) else ""


def _int(meta: dict, key: str, default):
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _bool(meta: dict, key: str) -> bool | None:
    value = meta.get(key)
    return value if isinstance(value, bool) else None


def _vocab(buf, meta: dict) -> Vocab | None:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, Array) or tokens.at < 0:
        return None
    n = tokens.length
    lo = max(FIRST_CHECKED_ID, n - MAX_SIZE_DIFFERENCE)
    # Where token i's text starts (its length first), for i = FIRST_CHECKED_ID and lo..n (n: the array's end).
    at, pos, u64 = {}, tokens.at, struct.Struct("<Q").unpack_from
    for i in range(n + 1):
        if i == FIRST_CHECKED_ID or i >= lo:
            at[i] = pos
        if i < n:
            pos += 8 + u64(buf, pos)[0]
    tail = []
    if n >= FIRST_CHECKED_ID:
        digest = hashlib.blake2b(buf[at[FIRST_CHECKED_ID] : at[lo]], digest_size=8)  # (length-prefixed texts)
        for m in range(lo, n + 1):
            tail.append(digest.hexdigest())  # the texts of FIRST_CHECKED_ID .. m-1
            if m < n:
                digest.update(buf[at[m] : at[m + 1]])
    return Vocab(
        type=_str(meta, "tokenizer.ggml.model"),
        pre=_str(meta, "tokenizer.ggml.pre"),
        size=n,
        bos=_int(meta, "tokenizer.ggml.bos_token_id", None),
        eos=_int(meta, "tokenizer.ggml.eos_token_id", None),
        add_bos=_bool(meta, "tokenizer.ggml.add_bos_token"),
        add_eos=_bool(meta, "tokenizer.ggml.add_eos_token"),
        tail="".join(tail),
    )


class Index:
    """The facts of the files read before (gguf-facts.json in the specdec cache): by resolved path, kept while
    the file's size and modification time are those it had. A file that could not be read is kept as its
    reason, so that a damaged file costs one read, not one per listing."""

    def __init__(self, path: Path | None = None):
        self.path = path or home() / "gguf-facts.json"
        self.entries = _load(self.path)
        self.changed = False

    def facts(self, path: Path, st: os.stat_result) -> Facts:
        """The facts of `path` (resolved; `st`: its stat). Raises Malformed or OSError as `read` does, again
        for a file that failed before and has not changed."""
        key = str(path)
        e = self.entries.get(key)
        if not (e and e.get("size") == st.st_size and e.get("mtime_ns") == st.st_mtime_ns):
            e = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
            try:
                e["facts"] = asdict(read(path))
            except (Malformed, ValueError) as error:  # (mmap refuses an empty file with ValueError)
                e["error"] = str(error) or "empty"
            self.entries[key] = e
            self.changed = True
        if "error" in e:
            raise Malformed(e["error"])
        try:
            return Facts.from_json(e["facts"])
        except (TypeError, KeyError, ValueError):  # an entry another version wrote: read the file again
            del self.entries[key]
            return self.facts(path, st)

    def save(self) -> None:
        """Write what changed (entries of files that are gone are dropped); a cache that cannot be written is
        left as it was: the next listing reads those headers again."""
        if not self.changed:
            return
        entries = {k: v for k, v in self.entries.items() if os.path.exists(k)}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"version": VERSION, "files": entries}), encoding="utf-8")
            os.replace(tmp, self.path)
            self.changed = False
        except OSError:
            tmp.unlink(missing_ok=True) if tmp.parent.is_dir() else None


def _load(path: Path) -> dict[str, dict]:
    """The kept entries; none where the file is missing, damaged, another version's or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        data = f.read(MAX_INDEX + 1)
    try:
        index = json.loads(data.decode("utf-8")) if len(data) <= MAX_INDEX else None
    except (ValueError, UnicodeDecodeError):
        return {}
    ok = isinstance(index, dict) and index.get("version") == VERSION and isinstance(index.get("files"), dict)
    return {k: v for k, v in index["files"].items() if isinstance(v, dict)} if ok else {}
