"""The GGUF models already on this machine, where the tools people use put them. Read-only: nothing in a
store is written, moved or hashed; only directories are listed and GGUF headers read (models/facts.py).

Each store's layout, as its tool writes it:
- hf: the Hugging Face hub cache ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub), where `hf download`
  and llama.cpp's `-hf` put files: models--ORG--REPO/snapshots/REV/FILE.gguf (symlinks into blobs/), REV
  named by refs/main. Names: ORG/REPO:QUANT (ORG/REPO/FILE where two files share a quantisation).
- llama.cpp: $LLAMA_CACHE (the hub layout, since 2026) and its per-OS default folder, where older releases
  kept ORG_REPO_FILE.gguf beside manifest=ORG=REPO=TAG.json. Names: ORG/REPO:TAG, else the file's stem.
- lmstudio: ~/.lmstudio/models/PUBLISHER/REPO/FILE.gguf (and the older ~/.cache/lm-studio/models).
  Names: PUBLISHER/REPO/FILE.
- ollama: $OLLAMA_MODELS or ~/.ollama/models: manifests/REGISTRY/NAMESPACE/MODEL/TAG, JSON whose layer of
  media type application/vnd.ollama.image.model names the blob blobs/sha256-HEX. Names: MODEL:TAG (library
  models), NAMESPACE/MODEL:TAG, REGISTRY/NAMESPACE/MODEL:TAG.
- config: the folders a config file's `model_dirs` lists, searched down to MAX_DEPTH. Names: the file's stem.
A split model (NAME-00001-of-00003.gguf) is one entry, its first part's path (llama.cpp finds the rest).
Projectors, adapters, imatrix files and vocabularies are not models. Anything that cannot be read (a
manifest that is not JSON, a missing blob, a symlink loop, an unreadable folder, a truncated header) is
skipped with a reason (`Scan.skipped`), never an error. How each layout is read: layouts.py.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..backend.gguf_file import Malformed
from .catalog import KNOWN
from .facts import Facts, Index
from .layouts import LAYOUTS, Found, Walker, roots
from .store import model_path

# In listing order: a file found in two stores is listed as the first's.
SOURCES = ("specdec", "hf", "llama.cpp", "lmstudio", "ollama", "config")


@dataclass(frozen=True)
class Entry:
    name: str
    source: str  # one of SOURCES
    path: Path  # what llama.cpp opens (a split model's first part)
    size: int  # bytes, every part
    facts: Facts
    aliases: tuple[str, ...] = ()  # other names that find it (ORG/REPO for its default quantisation, ...)
    parts: int = 1


@dataclass
class Scan:
    entries: list[Entry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "PATH: why", for --verbose


def scan(model_dirs: tuple[str, ...] = (), index: Index | None = None) -> Scan:
    """Every model in every store, each file once (the first source that holds it)."""
    index = index or Index()
    result, seen = Scan(), set()
    walker = Walker(result.skipped)
    for model in KNOWN.values():  # specdec's own: the catalogue's assembled files
        _add(result, seen, index, "specdec", Found(model.name, [model_path(model)]), quiet=True)
    for source, layout, root in roots(model_dirs):
        if not root.is_dir():
            continue
        walker.seen.clear()  # (a folder is listed once per store: two layouts may read one folder)
        for found in LAYOUTS[layout](root, walker):
            _add(result, seen, index, source, found)
    index.save()
    return result


def _add(result: Scan, seen: set, index: Index, source: str, found: Found, quiet: bool = False) -> None:
    size, facts = 0, None
    try:
        for i, part in enumerate(found.files):
            real = Path(os.path.realpath(part))
            st = os.stat(real)
            if not stat.S_ISREG(st.st_mode):
                raise Malformed("not a regular file")
            if i == 0:
                if real in seen:
                    return
                facts = index.facts(real, st)
                params = facts.params
            else:
                params += index.facts(real, st).params
            size += st.st_size
    except (OSError, Malformed) as e:
        if not quiet:
            result.skipped.append(f"{found.where or found.files[0]}: {getattr(e, 'strerror', None) or e}")
        return
    if facts.kind != "model":
        article = "an" if facts.kind[0] in "aeiou" else "a"
        result.skipped.append(f"{found.where or found.files[0]}: {article} {facts.kind} file, not a model")
        return
    seen.add(Path(os.path.realpath(found.files[0])))
    if len(found.files) > 1:
        facts = Facts(**{**facts.__dict__, "params": params})
    aliases = tuple(dict.fromkeys(a for a in found.aliases if a != found.name))
    result.entries.append(Entry(found.name, source, found.files[0], size, facts, aliases, len(found.files)))
