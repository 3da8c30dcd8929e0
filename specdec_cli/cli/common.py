"""What the commands share: the options every run command takes, model references to files, and settings
to a RunConfig (config.py decides the values; here the command line's values go in and files come out)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import typer

from .. import config, ui
from ..models import store
from ..models.catalog import KNOWN
from ..options import RunConfig
from ..session import Session

PAIR = typer.Option(None, "--pair", help="A named pair from the config (default: 'default').")
CONFIG = typer.Option(None, "--config", help="Config file (default: $SPECDEC_CONFIG, else the user config).")


def model_file(ref: str) -> Path:
    """A known model's assembled GGUF (assembling it on first use, with a progress bar), or the path as given."""
    if ref in KNOWN:
        return store.ensure(KNOWN[ref], bar)
    return Path(ref)


def model_location(ref: str) -> Path:
    """Where a model reference points, without assembling anything."""
    return store.model_path(KNOWN[ref]) if ref in KNOWN else Path(ref)


def bar(model):
    return ui.byte_progress(f"assembling {model.name}", model.size)


def settings(given: dict[str, Any], pair: Optional[str], config_path: Optional[Path]) -> dict[str, Any]:
    """The command line's options merged with the environment and the config file (config.resolve)."""
    return config.resolve(given, pair, config.config_file(config_path))


def run_config(merged: dict[str, Any], *, debug: bool = False) -> RunConfig:
    """Merged settings to the run's configuration, known models assembled."""
    return config.run_config(merged, debug=debug, model_file=model_file)


def start(session: Session, *, costs: bool = False) -> None:
    """A loaded session's first steps: read the lookup cache (a damaged file's warning comes with the
    others), show the warnings; `costs`: auto's cost curve now (a server, a batch), not in the first request."""
    session.lookup_corpus()
    for message in session.warnings:
        ui.warning(message)
    if costs and session.drafter != "none":
        session.costs(session.target.tokenize("Hello, world.", special=True))


def model_names(settings: dict, cfg: RunConfig) -> tuple[str, set[str]]:
    """The id /v1/models shows (the target as it was named: a known model's name, else the file's stem),
    and every name a request's `model` may use: that, the file's stem, the pair's name."""
    ref, stem = str(settings["target"]), Path(cfg.target).stem
    primary = stem if os.sep in ref or ref.endswith(".gguf") else ref
    return primary, {primary, stem} | ({settings["pair"]} if settings.get("pair") else set())
