"""What the commands share: model references to files, and resolved settings to a RunConfig."""

from __future__ import annotations

from pathlib import Path

from . import ui
from .models import store
from .models.catalog import KNOWN
from .session import RunConfig, default_threads


def model_file(ref: str) -> Path:
    """A known model's assembled GGUF (assembling it on first use, with a progress bar), or the path as given."""
    if ref in KNOWN:
        return store.ensure(KNOWN[ref], _bar)
    return Path(ref)


def _bar(model):
    return ui.byte_progress(f"assembling {model.name}", model.size)


def run_config(settings: dict, *, threads: int, debug: bool) -> RunConfig:
    """Settings (from config.resolve) to a validated RunConfig; known model names become assembled paths."""
    fields = {k: v for k, v in settings.items() if k in RunConfig.__dataclass_fields__}
    fields["target"] = model_file(settings["target"])
    draft = settings.get("draft")
    fields["drafter"] = settings.get("drafter") or ("model" if draft else "none")
    fields["draft"] = model_file(draft) if draft and fields["drafter"] == "model" else None
    return RunConfig(**fields, threads=threads or default_threads(), debug=debug)
