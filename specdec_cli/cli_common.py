"""What the commands share: model references to files, and resolved settings to a RunConfig."""

from __future__ import annotations

from pathlib import Path

from . import config, ui
from .models import store
from .models.catalog import KNOWN
from .errors import UsageError
from .options import DRAFT_TOKENS, OptionError, RunConfig, default_drafter, default_threads


def model_file(ref: str) -> Path:
    """A known model's assembled GGUF (assembling it on first use, with a progress bar), or the path as given."""
    if ref in KNOWN:
        return store.ensure(KNOWN[ref], _bar)
    return Path(ref)


def model_location(ref: str) -> Path:
    """Where a model reference points, without assembling anything."""
    return store.model_path(KNOWN[ref]) if ref in KNOWN else Path(ref)


def _bar(model):
    return ui.byte_progress(f"assembling {model.name}", model.size)


def run_config(settings: dict, *, debug: bool) -> RunConfig:
    """Settings (from config.resolve) to a validated RunConfig; known model names become assembled paths.
    With a draft the drafter defaults to auto, and auto's draft length to auto."""
    fields = {k: v for k, v in settings.items() if k in RunConfig.__dataclass_fields__}
    fields["target"] = model_file(settings["target"])
    draft = settings.get("draft")
    fields["drafter"] = drafter = settings.get("drafter") or default_drafter(bool(draft))
    fields["draft"] = model_file(draft) if draft and drafter in ("model", "auto") else None
    fields["draft_tokens"] = draft_tokens(settings.get("draft_tokens"), drafter)
    fields["threads"] = settings.get("threads") or default_threads()  # unset or 0: every core
    try:
        return RunConfig(**fields, debug=debug)
    except OptionError as e:
        where = settings.get("from_file", {}).get(e.key)
        if where:  # the value came from the config file: say where, not which flag
            raise config.ConfigError(*where, e.rule) from None
        raise


def draft_tokens(value: int | str | None, drafter: str) -> int | None:
    """-k as given ("auto" is None); unset, it is auto for the auto and lookup drafters (a lookup draft's
    right length runs from 0 to dozens of tokens, round by round) and DRAFT_TOKENS for the draft model."""
    if value is None:
        return None if drafter in ("auto", "lookup") else DRAFT_TOKENS
    if isinstance(value, int):
        return value
    if value.strip().lower() == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"-k/--draft-tokens must be a whole number or 'auto' (got {value!r})") from None
