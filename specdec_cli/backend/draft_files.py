"""What an EAGLE-3 or DFlash draft file says of itself (`DraftFile`, from its header alone) and whether it fits a
target (`problem`), before llama.cpp sees the pair: llama.cpp aborts on most mismatches, or drafts from an unwritten
buffer in silence. backend/hidden.py runs the drafts; models/ lists them."""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SpecdecError
from . import gguf_file

KINDS = ("eagle3", "dflash")  # general.architecture of the drafts this module runs
# Targets whose graphs hand out their layers' inputs (llama.cpp sets res->t_layer_inp[il] in src/models/ for these):
# any other (qwen2, gemma3, ...) aborts the process when asked for one.
# (qwen4exp sets them too, but hyper-connection wide: llama.cpp asserts a row is n_embd wide when it reads them)
FEEDS = frozenset(
    "bailingmoe3 deepseek4 gemma4 gpt-oss hunyuan_vl lfm2 llama mimo2 minimax-01 minimax-m2 muse-glimmer nanbeige "
    "nemotron_h qwen3 qwen35 qwen35moe qwen3moe qwen3next".split()
)
# Of those, the ones whose graphs also hand out the final layer's output as "layer n_layer" (a DFlash draft may read it).
FEEDS_LAST = frozenset("deepseek4 mimo2 nemotron_h".split())


@dataclass(frozen=True)
class DraftFile:
    """An EAGLE-3 or DFlash draft, as its header describes it."""

    path: Path
    arch: str  # "eagle3" | "dflash"
    variant: str  # arch, or "dflash2" (a selector over candidates), "dspark" (a Markov head)
    layers: tuple[int, ...]  # the target layers whose inputs it reads (llama.cpp's ids: HF's + 1), in its order
    hidden: int | None  # the target hidden size it was made for (EAGLE-3: target_hidden_size; DFlash: its own width)
    n_embd: int | None  # its own width
    n_layer: int | None
    block: int | None  # DFlash: the trained block (its drafts are block - 1 tokens at most)
    mask: int | None  # DFlash: the mask token's id
    own_head: bool  # has its own output head (else it borrows the target's)
    n_vocab: int = 0  # its vocabulary's size (the target's: it carries the target's tokenizer)
    bad_d2t: str | None = None  # what is wrong with its d2t map (draft rows -> target ids), read from the file
    embd_rows: int | None = None  # rows of its own token embeddings (None: it borrows the target's)

    @property
    def label(self) -> str:
        return {"eagle3": "EAGLE-3", "dflash": "DFlash", "dflash2": "DFlash2", "dspark": "DSpark"}[self.variant]

    @property
    def max_draft(self) -> int | None:
        """The longest draft it makes (DFlash: its block less the anchor; EAGLE-3: a chain, as long as asked)."""
        return self.block - 1 if self.block else None


def read(path: Path) -> DraftFile | None:
    """The draft `path` describes, where its architecture is one of KINDS; None for any other model (or a file
    that is not a GGUF: loading it says why)."""
    try:
        h = gguf_file.header(gguf_file.check(path))
    except (SpecdecError, OSError, gguf_file.Malformed):
        return None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        fields = describe(h.metadata, {t.name for t in h.tensors}, d2t_problem(data, h), embd_rows(h))
    return DraftFile(path=Path(path), **fields) if fields is not None else None


def embd_rows(h: gguf_file.Header) -> int | None:
    """The rows of a file's own token embeddings (None: it has none)."""
    t = next((t for t in h.tensors if t.name == "token_embd.weight"), None)
    return t.shape[1] if t is not None and len(t.shape) == 2 else None


def d2t_problem(data, h: gguf_file.Header) -> str | None:
    """What is wrong with a reduced draft vocabulary's map to target ids (d2t, I64; `data`: the file's bytes), each
    id checked to be one: llama.cpp scatters the draft's logits by it unchecked. None: none, or nothing wrong."""
    t = next((t for t in h.tensors if t.name == "d2t"), None)
    if t is None:
        return None
    tokens = h.metadata.get("tokenizer.ggml.tokens")
    n_vocab = tokens.length if isinstance(tokens, gguf_file.Array) else 0
    if t.ggml_type != 27 or len(t.shape) != 1:  # GGML_TYPE_I64
        return "its d2t map is not a vector of 64-bit ids"
    head = next((x for x in h.tensors if x.name == "output.weight"), None)
    rows = head.shape[1] if head is not None and len(head.shape) == 2 else n_vocab  # (else the target's head)
    if t.shape[0] != rows:  # llama.cpp asserts they agree, in the graph
        return f"its d2t map has {t.shape[0]:,} ids for an output head of {rows:,} rows"
    ids = np.frombuffer(data, np.int64, count=t.shape[0], offset=h.data_offset + t.offset)
    if ids.size and not (0 <= int(ids.min()) and int(ids.max()) < n_vocab):
        return f"its d2t map names token ids outside its vocabulary of {n_vocab:,}"
    return None


def describe(meta: dict, names: set[str], bad_d2t: str | None = None, embd_rows: int | None = None) -> dict | None:
    """DraftFile's fields but its path, from a header's metadata and tensor names (None: not one of KINDS), what
    d2t_problem found and the rows of its own token_embd (None: none)."""
    arch = meta.get("general.architecture")
    if arch not in KINDS:
        return None
    ids = meta.get(f"{arch}.target_layers")
    layers = tuple(int(i) for i in ids.items) if isinstance(ids, gguf_file.Array) and ids.items else ()
    n_embd = gguf_file.int_value(meta, f"{arch}.embedding_length")
    variant = arch
    if arch == "dflash" and "markov_w1.weight" in names:
        variant = "dspark"
    elif arch == "dflash" and "selector_hidden.weight" in names:
        variant = "dflash2"
    mask = gguf_file.int_value(meta, "tokenizer.ggml.mask_token_id")
    return dict(
        arch=arch,
        variant=variant,
        layers=layers,
        hidden=gguf_file.int_value(meta, "eagle3.target_hidden_size") if arch == "eagle3" else n_embd,
        n_embd=n_embd,
        n_layer=gguf_file.int_value(meta, f"{arch}.block_count"),
        block=(gguf_file.int_value(meta, "dflash.block_size") or 16) if arch == "dflash" else None,
        mask=mask if mask is not None and mask >= 0 else None,
        own_head="output.weight" in names and "token_embd.weight" in names,
        n_vocab=tokens.length if isinstance(tokens := meta.get("tokenizer.ggml.tokens"), gguf_file.Array) else 0,
        bad_d2t=bad_d2t,
        embd_rows=embd_rows,
    )


def problem(d: DraftFile, target: str, arch: str, n_embd: int, n_layer: int) -> str | None:
    """Why draft `d` cannot draft for `target` (its architecture, width and layers), in words ("it ...": the caller
    names the two); None: it can. Every case here would abort inside llama.cpp, or draft from the wrong numbers in
    silence."""
    if d.variant == "dspark":
        return "it is a DSpark draft (a Markov head), which specdec does not run"
    if arch not in FEEDS:
        return (
            f"{target} is a {arch} model, whose layer inputs llama.cpp does not hand out; {d.label} drafts read them "
            f"(llama.cpp has them for {', '.join(sorted(FEEDS))})"
        )
    if not d.layers:
        return f"it names no target layers ({d.arch}.target_layers)"
    if d.arch == "eagle3" and len(d.layers) != 3:
        return f"it reads {len(d.layers)} target layers; EAGLE-3 reads exactly 3"
    if d.arch == "eagle3" and d.n_layer != 1:
        return f"it has {d.n_layer} decoder layers; EAGLE-3 has one"
    if d.hidden != n_embd:
        return f"it was made for a target of hidden size {d.hidden}; {target} has {n_embd}"
    if d.n_embd != n_embd and not d.own_head:
        return f"it is {d.n_embd} wide and borrows the embeddings and head of {target}, which is {n_embd} wide"
    last = n_layer if d.arch == "dflash" and arch in FEEDS_LAST else n_layer - 1
    bad = [i for i in d.layers if not 0 <= i <= last]
    if bad:
        return f"it reads target layer {bad[0]}; {target} has layers 0 to {last} to read ({n_layer} layers)"
    if d.arch == "dflash" and d.mask is None:
        return "it has no mask token (tokenizer.ggml.mask_token_id), which its blocks are made of"
    if d.mask is not None and not d.mask < d.n_vocab:
        return f"its mask token {d.mask} is not in its vocabulary of {d.n_vocab:,}"
    if d.bad_d2t:
        return d.bad_d2t
    if d.embd_rows is not None and d.embd_rows < d.n_vocab:  # a token past them: get_rows asserts
        return f"it embeds {d.embd_rows:,} tokens of its vocabulary of {d.n_vocab:,}"
    if d.block is not None and d.block < 2:
        return f"it has a block of {d.block} (dflash.block_size): no token to draft"
    return None
