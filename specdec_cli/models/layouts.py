"""Where each tool keeps its GGUF files, and how its layout names them (the layouts stores.py reads): the
stores' folders on this machine (`roots`), one walker per layout, file names into models (split parts,
quantisation tags), and folder listings that cannot fail, loop or run on without end.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

MAX_DEPTH = 6  # folders below a store's root: deeper than any tool's layout
MAX_VISITS = 100_000  # directory entries one scan looks at: a `model_dirs = ["/"]` ends, with a warning
MAX_MANIFEST = 1 << 20  # bytes: an Ollama manifest is about 1 KB
OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # llama.cpp's: a repo's other files
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # what llama.cpp's `-hf ORG/REPO` picks, in this order, else the first file
_SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})$", re.I)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)
_HEX = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass
class Found:
    """A model a layout names, before its header is read."""

    name: str
    files: list[Path]  # its parts in order
    aliases: list[str] = field(default_factory=list)
    where: Path | None = None  # what names it, for messages (an Ollama manifest; else its first part)


def roots(model_dirs: tuple[str, ...] = ()) -> list[tuple[str, str, Path]]:
    """(source, layout, folder) of every store this machine may have, in SOURCES order; folders that do not
    exist are skipped by the scan."""
    env, home = os.environ, Path.home()
    xdg = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    hub = [Path(env[v]) for v in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE") if env.get(v)]
    hub += [Path(env["HF_HOME"]) / "hub"] if env.get("HF_HOME") else []
    hub += [xdg / "huggingface" / "hub", home / ".cache" / "huggingface" / "hub"]
    if sys.platform == "darwin":
        llama = home / "Library" / "Caches" / "llama.cpp"
    elif sys.platform == "win32":
        llama = Path(env.get("LOCALAPPDATA", home)) / "llama.cpp"
    else:
        llama = xdg / "llama.cpp"
    llamas = [Path(env["LLAMA_CACHE"])] if env.get("LLAMA_CACHE") else []
    ollama = [Path(env["OLLAMA_MODELS"])] if env.get("OLLAMA_MODELS") else [home / ".ollama" / "models"]
    out = [("hf", "hub", p) for p in hub]
    out += [("llama.cpp", layout, p) for p in [*llamas, llama] for layout in ("hub", "flat")]
    out += [
        ("lmstudio", "lmstudio", p) for p in (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models")
    ]
    out += [("ollama", "ollama", p) for p in ollama]
    out += [("config", "tree", Path(os.path.expanduser(d))) for d in model_dirs]
    seen: set[tuple[str, Path]] = set()
    unique = []
    for source, layout, p in out:
        if (layout, p) not in seen:
            seen.add((layout, p))
            unique.append((source, layout, p))
    return unique


class Walker:
    """Folder listings that never fail, never loop and never run on without end: an unreadable folder or a
    symlink loop is a skipped entry; a folder reached twice (through a symlink) is listed once."""

    def __init__(self, skipped: list[str]):
        self.skipped = skipped
        self.visits = 0
        self.seen: set[tuple[int, int]] = set()

    def listdir(self, folder: Path) -> list[os.DirEntry]:
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in self.seen:
                return []
            self.seen.add((st.st_dev, st.st_ino))
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            self.skipped.append(f"{folder}: {e.strerror or e}")
            return []
        self.visits += len(entries)
        if self.visits > MAX_VISITS:
            if self.visits - len(entries) <= MAX_VISITS:
                self.skipped.append(f"{folder}: stopped after {MAX_VISITS:,} entries (a store that large is not one)")
            return []
        return entries

    def files(self, folder: Path, depth: int = MAX_DEPTH) -> Iterator[Path]:
        """The GGUF files under `folder`, down to `depth` folders."""
        for e in self.listdir(folder):
            if _is_dir(e) and depth > 0 and not e.name.startswith("."):
                yield from self.files(Path(e.path), depth - 1)
            elif e.name.lower().endswith(".gguf") and not e.name.startswith("."):
                yield Path(e.path)


# --- files into models: splits and quantisation tags ---------------------------------------------------
def split_of(path: Path) -> tuple[str, int, int]:
    """(the name without .gguf and split suffix, part number, parts), as llama.cpp reads a file name."""
    stem = path.name[:-5] if path.name.lower().endswith(".gguf") else path.name
    m = _SPLIT.match(stem)
    return (m[1], int(m[2]), int(m[3])) if m else (stem, 1, 1)


def model_bytes(path: Path) -> int:
    """A model file's bytes, with a split model's other parts beside it (0 where it cannot be read)."""
    stem, _, parts = split_of(path)
    files = (
        [path] if parts == 1 else [path.with_name(f"{stem}-{i:05d}-of-{parts:05d}.gguf") for i in range(1, parts + 1)]
    )
    try:
        return sum(f.stat().st_size for f in files)
    except OSError:
        return 0


def quant_tag(path: Path) -> str:
    """The quantisation a file name ends with (llama.cpp's rule: `-Q4_K_M.gguf` -> Q4_K_M), or ""."""
    m = _TAG.search(split_of(path)[0])
    return m[1].upper() if m else ""


def is_model_file(path: Path) -> bool:
    return not any(word in path.name.lower() for word in NOT_MODELS)


def groups(files: list[Path], skipped: list[str]) -> list[list[Path]]:
    """The models among `files`: a file each, or a split model's parts in order (complete ones only)."""
    out, splits = [], {}
    for f in files:
        if not is_model_file(f):
            continue
        stem, part, parts = split_of(f)
        if parts == 1:
            out.append([f])
        else:
            splits.setdefault((f.parent, stem.lower(), parts), {})[part] = f
    for (_, _, parts), found in splits.items():
        if sorted(found) == list(range(1, parts + 1)):
            out.append([found[i] for i in range(1, parts + 1)])
        else:
            first = found[min(found)]
            skipped.append(f"{first}: a split model with {len(found)} of its {parts} parts")
    return sorted(out, key=lambda g: str(g[0]))


def _repo_models(repo: str, base: Path, files: list[Path], skipped: list[str]) -> Iterator[Found]:
    """A repository's models: named REPO:QUANT where that quantisation is the repo's only file of it, else
    REPO/FILE; REPO alone also finds the one llama.cpp's `-hf REPO` would pick."""
    models = groups(files, skipped)
    tags = [quant_tag(g[0]) for g in models]
    default = _default_pick(models)
    for g, tag in zip(models, tags):
        by_file = f"{repo}/{g[0].relative_to(base).as_posix()}"
        by_tag = [f"{repo}:{tag}"] if tag else []
        names = by_tag + [by_file] if tag and tags.count(tag) == 1 else [by_file] + by_tag
        yield Found(names[0], g, names[1:] + ([repo] if g is default else []))


def _default_pick(models: list[list[Path]]) -> list[Path] | None:
    for tag in DEFAULT_QUANTS:
        pattern = re.compile(re.escape(tag) + r"[.-]", re.I)
        for g in models:
            if pattern.search(g[0].name):
                return g
    return models[0] if models else None


# --- the layouts -----------------------------------------------------------------------------------------
def _hub(root: Path, walk: Walker) -> Iterator[Found]:
    for repo_dir in walk.listdir(root):
        if not repo_dir.name.startswith("models--"):
            continue
        repo = repo_dir.name[len("models--") :].replace("--", "/")
        if repo.count("/") != 1:
            continue
        snapshot = _snapshot(Path(repo_dir.path), walk)
        if snapshot is not None:
            yield from _repo_models(repo, snapshot, list(walk.files(snapshot)), walk.skipped)


def _snapshot(repo: Path, walk: Walker) -> Path | None:
    """The revision refs/main names (else another ref, else the newest snapshot), as llama.cpp picks it."""
    refs = sorted(walk.listdir(repo / "refs"), key=lambda e: e.name != "main") if (repo / "refs").is_dir() else []
    for ref in refs:
        try:
            commit = _small(Path(ref.path)).decode("ascii", "replace").strip()
        except (OSError, ValueError):
            continue
        if _COMMIT.fullmatch(commit) and (repo / "snapshots" / commit).is_dir():
            return repo / "snapshots" / commit
    snapshots = [e for e in walk.listdir(repo / "snapshots") if _is_dir(e)] if (repo / "snapshots").is_dir() else []
    newest = max(snapshots, key=_mtime, default=None)
    return Path(newest.path) if newest is not None else None


def _mtime(e: os.DirEntry) -> float:
    try:
        return e.stat().st_mtime
    except OSError:
        return 0.0


def _flat(root: Path, walk: Walker) -> Iterator[Found]:
    """llama.cpp's cache before the hub layout: ORG_REPO_FILE.gguf, named by manifest=ORG=REPO=TAG.json."""
    listing = walk.listdir(root)
    names: dict[str, list[str]] = {}
    for e in listing:
        if e.name.startswith("manifest=") and e.name.endswith(".json") and e.name.count("=") == 3:
            _, org, repo, tag = e.name[: -len(".json")].split("=")
            manifest = _json(Path(e.path), walk.skipped)
            rfile = manifest.get("ggufFile", {}).get("rfilename") if isinstance(manifest, dict) else None
            if isinstance(rfile, str) and isinstance(manifest.get("ggufFile"), dict):
                local = f"{org}_{repo}_{rfile.rsplit('/', 1)[-1]}"
                names.setdefault(local, []).extend(
                    [f"{org}/{repo}:{tag}"] + ([f"{org}/{repo}"] if tag == "latest" else [])
                )
    files = [Path(e.path) for e in listing if e.name.lower().endswith(".gguf") and not e.name.startswith(".")]
    for g in groups(files, walk.skipped):
        stem = split_of(g[0])[0]
        known = names.get(g[0].name, [])
        tagged = [n for n in known if not n.endswith(":latest")]
        yield Found(tagged[0] if tagged else known[0] if known else stem, g, known + [stem])


def _lmstudio(root: Path, walk: Walker) -> Iterator[Found]:
    for publisher in walk.listdir(root):
        if not _is_dir(publisher) or publisher.name.startswith("."):
            continue
        for repo in walk.listdir(Path(publisher.path)):
            if _is_dir(repo) and not repo.name.startswith("."):
                base = Path(repo.path)
                name = f"{publisher.name}/{repo.name}"
                for found in _repo_models(name, base, list(walk.files(base)), walk.skipped):
                    by_file = f"{name}/{found.files[0].relative_to(base).as_posix()}"  # LM Studio's own key
                    yield Found(by_file, found.files, [n for n in (found.name, *found.aliases) if n != by_file])


def _ollama(root: Path, walk: Walker) -> Iterator[Found]:
    manifests, blobs = root / "manifests", root / "blobs"
    for registry in walk.listdir(manifests) if manifests.is_dir() else []:
        for namespace in walk.listdir(Path(registry.path)):
            for model in walk.listdir(Path(namespace.path)):
                for tag in walk.listdir(Path(model.path)):
                    blob = _ollama_blob(Path(tag.path), blobs, walk.skipped)
                    if blob is None:
                        continue
                    reg, ns, name, t = registry.name, namespace.name, model.name, tag.name
                    # Ollama's own short forms: MODEL for library/MODEL, NS/MODEL on its own registry.
                    full = f"{reg}/{ns}/{name}"
                    names = [full] if reg != OLLAMA_REGISTRY else [f"{ns}/{name}", full]
                    names = [name, *names] if (reg, ns) == (OLLAMA_REGISTRY, "library") else names
                    tagged = [f"{n}:{t}" for n in names]
                    yield Found(tagged[0], [blob], tagged[1:] + (names if t == "latest" else []), Path(tag.path))


def _ollama_blob(manifest: Path, blobs: Path, skipped: list[str]) -> Path | None:
    data = _json(manifest, skipped)
    if data is None:
        return None
    layers = data.get("layers") if isinstance(data, dict) else None
    models = [
        x
        for x in (layers if isinstance(layers, list) else [])
        if isinstance(x, dict) and x.get("mediaType") == OLLAMA_MODEL
    ]
    digest = models[0].get("digest") if models else None
    if not isinstance(digest, str) or not digest.startswith("sha256:") or not _HEX.fullmatch(digest[7:]):
        skipped.append(f"{manifest}: no model layer with a sha256 digest")
        return None
    blob = blobs / f"sha256-{digest[7:]}"
    if not blob.exists():
        skipped.append(f"{manifest}: its model blob {blob.name} is missing")
        return None
    return blob


def _tree(root: Path, walk: Walker) -> Iterator[Found]:
    for g in groups(list(walk.files(root)), walk.skipped):
        yield Found(split_of(g[0])[0], g, [g[0].relative_to(root).as_posix()])


def _is_dir(e: os.DirEntry) -> bool:
    """Whether a listed entry is a folder (following a symlink: `Walker.listdir` lists each folder once)."""
    try:
        return e.is_dir()
    except OSError:
        return False


def _small(path: Path) -> bytes:
    """A small file's bytes (a manifest, a ref): a FIFO put in its place would block a plain read, a huge file
    fill the memory. Raises OSError or ValueError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = f.read(MAX_MANIFEST + 1)
    if len(data) > MAX_MANIFEST:
        raise ValueError(f"larger than {MAX_MANIFEST:,} bytes")
    return data


def _json(path: Path, skipped: list[str]):
    """A small JSON file's value (None, with a reason, where it is not one)."""
    try:
        return json.loads(_small(path).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        skipped.append(f"{path}: {getattr(e, 'strerror', None) or e}")
        return None


LAYOUTS = {"hub": _hub, "flat": _flat, "lmstudio": _lmstudio, "ollama": _ollama, "tree": _tree}
