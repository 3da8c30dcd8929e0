"""Can this draft speak for this target? The same test llama.cpp applies before speculating."""

from __future__ import annotations

import hashlib

import llama_cpp.llama_cpp as L

from .native import Model

MAX_SIZE_DIFFERENCE = 128  # Qwen pads its vocabularies to different sizes across model sizes
FINGERPRINT_STRIDE = 61
FIRST_CHECKED_ID = 5  # the first ids are control tokens that families number differently

PROBE = b"Hello, world. 123\n"  # text every vocabulary that spells text spells
VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo2"}


def incompatibility(target: Model, draft: Model) -> str | None:
    """None when the draft's token ids mean the same as the target's; otherwise what differs."""
    tv, dv = target.vocab, draft.vocab
    t_type, d_type = L.llama_vocab_type(tv), L.llama_vocab_type(dv)
    if t_type != d_type:
        return f"vocabulary types differ: target {VOCAB_TYPES.get(t_type, t_type)}, draft {VOCAB_TYPES.get(d_type, d_type)}"
    for what, get in (("add-BOS", L.llama_vocab_get_add_bos), ("add-EOS", L.llama_vocab_get_add_eos)):
        if bool(get(tv)) != bool(get(dv)):
            return f"{what} flags differ: target {bool(get(tv))}, draft {bool(get(dv))}"
    for what, get, flag in (
        ("BOS", L.llama_vocab_bos, L.llama_vocab_get_add_bos),
        ("EOS", L.llama_vocab_eos, L.llama_vocab_get_add_eos),
    ):
        if flag(tv) and get(tv) != get(dv):
            return f"{what} ids differ: target {get(tv)}, draft {get(dv)}"
    if abs(target.n_vocab - draft.n_vocab) > MAX_SIZE_DIFFERENCE:
        return f"vocabulary sizes differ by more than {MAX_SIZE_DIFFERENCE}: target {target.n_vocab}, draft {draft.n_vocab}"
    for i in range(FIRST_CHECKED_ID, min(target.n_vocab, draft.n_vocab)):
        a, b = L.llama_vocab_get_text(tv, i), L.llama_vocab_get_text(dv, i)
        if a != b:
            return f"token {i} differs: target {a!r}, draft {b!r}"
    return None


def fingerprint(model: Model) -> str:
    """A short name for the model's vocabulary: the same for every model whose token ids mean the same
    (all sizes of a family), different otherwise. Keys the lookup cache. Every FINGERPRINT_STRIDE-th
    token and the last ones (where families add their control tokens) stand for the whole: reading all
    150k texts through ctypes takes ~0.2 s, this ~5 ms, and vocabularies that differ, differ throughout."""
    v, n = model.vocab, model.n_vocab
    h = hashlib.sha1(f"{L.llama_vocab_type(v)}:{n}".encode())
    for i in [*range(0, n, FINGERPRINT_STRIDE), *range(max(n - 512, 0), n)]:
        h.update(L.llama_vocab_get_text(v, i) or b"")
        h.update(b"\0")
    return h.hexdigest()[:16]


def no_text(model: Model) -> str | None:
    """Why this vocabulary's tokens cannot stand for text (then it cannot draft through text for another
    vocabulary); None where they can."""
    if L.llama_vocab_type(model.vocab) == 0 or model.n_vocab == 0:
        return "it has no vocabulary (an embedding model's file, or weights alone)"
    tokens = model.tokenize_bytes(PROBE, add_special=False, parse_special=False)
    if not b"".join(model.piece(t) for t in tokens).strip():
        return f"its tokens spell no text ({PROBE!r} tokenizes to {len(tokens)} tokens that spell nothing)"
    return None
