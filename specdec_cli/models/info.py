"""What a GGUF file is, as llama.cpp reads it, and whether two files can pair."""

from __future__ import annotations

import llama_cpp.llama_cpp as L

from ..backend import vocab
from ..backend.native import Model


def describe(model: Model) -> dict:
    desc = model.describe()  # e.g. "qwen2 1.5B Q4_K - Medium": architecture, size class, quantisation
    quant = desc.split(" ", 2)[2] if desc.count(" ") >= 2 else "unknown"
    problem = model.rollback_problem()
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
        "chat_template": model.chat_template() is not None,
        "can_roll_back": problem is None,
    }


def rows(facts: dict) -> list[tuple[str, str]]:
    p = facts["parameters"]
    return [
        ("file", f"{facts['path']} ({facts['file_bytes'] / 1e6:,.1f} MB)"),
        ("name", facts["name"] or "-"),
        ("architecture", facts["architecture"] or "-"),
        ("parameters", f"{p / 1e9:.2f} B" if p >= 1e9 else f"{p / 1e6:.0f} M"),
        ("quantisation", facts["quantisation"]),
        ("vocabulary", f"{facts['vocab_type']}, {facts['vocab_size']:,} tokens"),
        ("context length", f"{facts['context_length']:,} tokens (trained)"),
        ("chat template", "yes" if facts["chat_template"] else "no"),
        ("speculation", "yes" if facts["can_roll_back"] else "no: its cache cannot roll back"),
    ]


def pairing(target: Model, draft: Model) -> str | None:
    """None when draft can draft for target; otherwise why not."""
    return vocab.incompatibility(target, draft) or (
        f"draft: {draft.rollback_problem()}" if draft.rollback_problem() else None
    )
