"""A model reference, as people write one, to its file: a path, a catalogue name (`qwen2.5-coder-1.5b`), a
Hugging Face repository as llama.cpp's `-hf` takes it (`ORG/REPO[:QUANT]`), an Ollama tag
(`qwen2.5-coder:7b`, `library/` implied, `:latest` where none is given) or an LM Studio key
(`PUBLISHER/REPO[/FILE]`), found in the stores (stores.py). A name that finds no model, or several, is one
line naming the closest ones and where they are (exit 2).
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from ..errors import UsageError
from .catalog import KNOWN
from .store import model_path, status
from .stores import Entry, Scan, scan

SOURCE_PREFIX = re.compile(r"^(hf|llama\.cpp|lmstudio|ollama|config|specdec):(?=.)")  # `ollama:qwen2.5:7b`
MAX_LISTED = 4  # closest matches an error names


def looks_like_path(ref: str, base: Path = Path(".")) -> bool:
    """A reference that is a file, not a store's name: one that starts where paths start, a bare file name, or
    one whose first folder is there (relative to `base`). A store's name may end in .gguf (LM Studio's
    PUBLISHER/REPO/FILE.gguf) but has folders in front that are not."""
    bare_file = ref.lower().endswith(".gguf") and "/" not in ref
    first = ref.split("/", 1)[0]
    here = "/" in ref and os.path.lexists(base / first)
    return bare_file or here or ref.startswith(("/", "~", "./", "../", ".\\", "..\\")) or "\\" in ref


def model_file(ref: str, model_dirs: tuple[str, ...] = (), role: str = "model") -> Path:
    """The file a reference names: a catalogue model's place in the cache (assembled when a session opens), a
    path as given (an existing file, or one that can only be a path: the loader says it is missing), else the
    model the stores hold under that name. `role` names the option in errors (--target, --draft)."""
    if ref in KNOWN:
        return model_path(KNOWN[ref])
    if looks_like_path(ref) or os.path.exists(os.path.expanduser(ref)) or not ref.strip():
        return Path(os.path.expanduser(ref))
    return find(ref, scan(model_dirs), role).path


def find(ref: str, found: Scan, role: str = "model") -> Entry:
    """The one entry `ref` names: by its name, else by one of its aliases (case-insensitively; `SOURCE:` in
    front keeps only that store's)."""
    m = SOURCE_PREFIX.match(ref)
    entries = [e for e in found.entries if m is None or e.source == m[1]]
    want = _key(ref[m.end() :] if m else ref)
    for names in (lambda e: (e.name,), lambda e: e.aliases):
        hits = [e for e in entries if any(_key(n) == want for n in names(e))]
        if len(hits) == 1:
            return hits[0]
        if hits:
            listed = ", ".join(_where(e) for e in hits[:MAX_LISTED])
            raise UsageError(
                f"{role} {ref!r} names {len(hits)} models: {listed}",
                hint="use one of those names, put its store first (hf:, lmstudio:, ollama:, llama.cpp:, config:), or give the path",
            )
    catalogue = m is None or m[1] == "specdec"  # the catalogue's names, assembled or not, as `models list` shows them
    raise UsageError(f"{role} {ref!r}: no such file or model", hint=_hint(found, _closest(want, entries, catalogue)))


def _key(name: str) -> str:
    name = name.strip().lower()
    if name.startswith("hf.co/") and name.count("/") == 2:  # Ollama's name for a Hugging Face repository
        return name
    return name.removeprefix("huggingface.co/").removeprefix("https://huggingface.co/")


def _where(e: Entry) -> str:
    return f"{e.name} ({e.source}, {e.path})"


def _closest(want: str, entries: list[Entry], catalogue: bool) -> list[str]:
    """The names closest to `want` (difflib, or a part of a longer name), each with where it is."""
    names = {}
    for e in entries:
        for n in (e.name, *e.aliases):
            names.setdefault(_key(n), _where(e))
    if catalogue:  # a catalogue model not assembled yet is in no store, but its name works
        for model in KNOWN.values():
            names.setdefault(_key(model.name), f"{model.name} (specdec, {status(model).state})")
    close = difflib.get_close_matches(want, list(names), n=MAX_LISTED * 3, cutoff=0.5)
    close += [n for n in names if want and want in n and n not in close]  # a part of a longer name
    return list(dict.fromkeys(names[n] for n in close))[:MAX_LISTED]


def _hint(found: Scan, closest: list[str]) -> str:
    if closest:
        return f"closest: {', '.join(closest)}; `specdec models list` shows every model found and its name"
    if not found.entries:
        return "no GGUF model was found in the stores specdec reads (`specdec models list` shows where it looks); give a path"
    return "`specdec models list` shows every model found and its name; or give the path of a .gguf file"
