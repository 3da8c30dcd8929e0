"""What a GGUF file is, as llama.cpp reads it, and whether two files can pair."""

from __future__ import annotations

import llama_cpp.llama_cpp as L

from ..backend import draft_files, mtp, vocab
from ..backend.native import Model
from ..ui import placement as ui_placement


ROLLBACK = {  # how a cache drops a rejected draft (Model.rollback), in words
    "cells": "KV cells: any rejected tail is dropped",
    "snapshots": "recurrent-state snapshots: one per draft token, kept by llama.cpp",
    "none": "cannot: llama.cpp keeps no snapshots of this architecture's state",
}


def describe(model: Model) -> dict:
    desc = model.describe()  # e.g. "qwen2 1.5B Q4_K - Medium": architecture, size class, quantisation
    quant = desc.split(" ", 2)[2] if desc.count(" ") >= 2 else "unknown"
    return {
        "path": str(model.path),
        "file_bytes": model.path.stat().st_size,
        "name": model.meta("general.name"),
        "architecture": model.meta("general.architecture"),
        "parameters": int(L.llama_model_n_params(model._ptr)),
        "quantisation": quant,
        "vocab_type": vocab.VOCAB_TYPES.get(L.llama_vocab_type(model.vocab), "unknown"),
        "vocab_size": model.n_vocab,
        "context_length": model.n_ctx_train,
        "sliding_window": model.sliding_window or None,
        "chat_template": model.chat_template() is not None,
        "rollback": model.rollback,
        "can_roll_back": model.rollback != "none",
        "kv_bytes_per_token": model.kv_bytes_per_token(),
        "recurrent_state_bytes": model.state_bytes(),
        "mtp_layers": mtp.heads_in_header(model.path),  # its own draft heads (NextN): --drafter mtp
        "hidden_size": int(L.llama_model_n_embd(model._ptr)) if not model.vocab_only else None,
        "layers": model.n_layer if not model.vocab_only else None,
        # a draft that reads a target's hidden states (EAGLE-3, DFlash): what it reads; else whether drafts can read it
        "hidden_draft": _hidden(draft_files.read(model.path)),
        "feeds_hidden_drafts": model.architecture in draft_files.FEEDS,
    }


def _hidden(d: draft_files.DraftFile | None) -> dict | None:
    if d is None:
        return None
    return {
        "kind": d.variant,
        "target_layers": list(d.layers),
        "target_hidden_size": d.hidden,
        "block_size": d.block,
        "mask_token": d.mask,
        "own_head": d.own_head,
    }


def rows(facts: dict) -> list[tuple[str, str]]:
    p = facts["parameters"]
    state = facts["recurrent_state_bytes"]
    window = facts["sliding_window"]
    return [
        ("file", f"{facts['path']} ({facts['file_bytes'] / 1e6:,.1f} MB)"),
        ("name", facts["name"] or "-"),
        ("architecture", facts["architecture"] or "-"),
        ("parameters", f"{p / 1e9:.2f} B" if p >= 1e9 else f"{p / 1e6:.0f} M"),
        ("quantisation", facts["quantisation"]),
        ("vocabulary", f"{facts['vocab_type']}, {facts['vocab_size']:,} tokens"),
        ("context length", f"{facts['context_length']:,} tokens (trained)"),
        ("sliding window", f"{window:,} tokens (specdec keeps every cell: swa_full)" if window else "none"),
        ("chat template", "yes" if facts["chat_template"] else "no"),
        ("KV cache", f"{_size(facts['kv_bytes_per_token'])} per token" if facts["kv_bytes_per_token"] else "none"),
        ("recurrent state", _state(state, facts["rollback"])),
        ("rollback", ROLLBACK[facts["rollback"]]),
        ("speculation", "yes" if facts["can_roll_back"] else "no: auto decodes it plainly"),
        ("MTP heads", _heads(facts["mtp_layers"])),
        _drafts(facts),
    ] + _placement(facts.get("placement"))


def _drafts(facts: dict) -> tuple[str, str]:
    """What a draft trained on hidden states reads; for any other model, whether such drafts can read it."""
    d = facts["hidden_draft"]
    if d is not None:
        label = {"eagle3": "EAGLE-3", "dflash": "DFlash", "dflash2": "DFlash2", "dspark": "DSpark"}[d["kind"]]
        layers = ", ".join(map(str, d["target_layers"])) or "none"
        what = (
            f"{label}: reads the inputs of target layers {layers} (a target of hidden size {d['target_hidden_size']})"
        )
        if d["block_size"]:
            what += f"; a block of {d['block_size']} (drafts {d['block_size'] - 1} tokens at most)"
        if d["kind"] == "dspark":
            return "drafter", what + "; specdec does not run DSpark drafts"
        return "drafter", what + f"; --draft FILE drafts with it (--drafter {d['kind'].rstrip('2')})"
    if facts["feeds_hidden_drafts"]:
        return (
            "EAGLE-3 / DFlash",
            f"drafts can read it: layers 0 to {facts['layers'] - 1}, hidden size {facts['hidden_size']}",
        )
    return "EAGLE-3 / DFlash", f"no: llama.cpp does not hand out a {facts['architecture']} model's layer inputs"


def _placement(placement: dict | None) -> list[tuple[str, str]]:
    """Where a run at the defaults puts its layers (as it was loaded here: its weights, no context yet)."""
    if placement is None:
        return []
    return [("placement", ui_placement.where(placement) or "every layer on the CPU")] + ui_placement.rows(placement)


def _heads(n: int) -> str:
    if not n:
        return "none"
    lacks = mtp.missing()
    usable = f"--drafter mtp drafts with {'them' if n > 1 else 'it'}" if not lacks else f"unusable: no {lacks}"
    return f"{n} ({'chained' if n > 1 else 'one'}; {usable})"


def _state(n: int, rollback: str) -> str:
    if not n:
        return "none"
    return f"{_size(n)} per sequence" + (", and as much per snapshot" if rollback == "snapshots" else "")


def _size(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def pairing(target: Model, draft: Model) -> str | None:
    """None when draft can draft for target; otherwise why not. A draft's own cache never needs to roll
        back (a recurrent one drafts in a copy of its state), so only the vocabularies must agree or the draft's spell
    text (it drafts through text: drafting/foreign.py); a draft that reads
        the target's hidden states must also fit its architecture, width and layers (backend/draft_files.problem)."""
    why = vocab.incompatibility(target, draft)
    d = draft_files.read(draft.path)
    if why is not None and d is None:  # another vocabulary drafts through text, if its tokens spell any
        why = vocab.no_text(draft)
    if why is None and d is not None:
        n_embd = int(L.llama_model_n_embd(target._ptr))
        why = draft_files.problem(d, target.name, target.architecture, n_embd, target.n_layer)
    return why
