"""What the commands share: the options every run command takes, model references to files, the run's
configuration (config.py decides the values; here the command line's values go in) and its session."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import typer

from .. import config, ui
from ..declaration import MODELS
from ..models import names, store
from ..models.catalog import KNOWN, KnownModel
from ..options import RunConfig
from ..session import Session, open_session

PAIR = typer.Option(None, "--pair", help="A named pair from the config (default: 'default').", rich_help_panel=MODELS)
CONFIG = typer.Option(
    None, "--config", help="Config file (default: $SPECDEC_CONFIG, else the user config).", rich_help_panel=MODELS
)


def model_ready(ref: str) -> Path:
    """A model reference's file (models/names.py), a known model assembled first (with a progress bar) where it
    is not yet."""
    return store.ensure(KNOWN[ref], bar) if ref in KNOWN else names.model_file(ref)


def known(path: Path | None) -> KnownModel | None:
    """The known model whose cache file `path` is, if it is one."""
    return next((m for m in KNOWN.values() if path is not None and path == store.model_path(m)), None)


def assemble(cfg: RunConfig) -> None:
    """Assemble the known models a run loads into the cache (once; a progress bar), before a session opens."""
    for path in (cfg.target, cfg.draft):
        model = known(path)
        if model is not None:
            store.ensure(model, bar)


def bar(model):
    return ui.byte_progress(f"assembling {model.name}", model.size)


def resolve(
    given: dict[str, Any], pair: Optional[str], config_path: Optional[Path], *, debug: bool = False
) -> RunConfig:
    """The command line's options over the environment and the config file: the run's configuration."""
    return config.resolve(given, pair, config.config_file(config_path), debug=debug)


@contextmanager
def opened(cfg: RunConfig, *, costs: bool = False, **how: Any) -> Iterator[Session]:
    """A session for the run: its known models assembled, then loaded (`how`: open_session's), the lookup
    cache read (a damaged file's warning comes with the others), the warnings shown; `costs`: auto's cost
    curve now (a server, a batch), not in the first request."""
    assemble(cfg)
    if cfg.draft_chosen_by == "auto":
        ui.note(f"draft: {cfg.draft_choice}; auto drafts with it where that pays")
    with open_session(cfg, measuring=ui.measuring, **how) as session:
        session.lookup_corpus()
        for message in session.warnings:
            ui.warning(message)
        if costs and session.speculates:
            session.costs(session.target.tokenize("Hello, world.", special=True))
            if session.curve.doubted:  # (a run's measurement says so in its stream: a Notice)
                ui.warning(session.curve.doubted)
        yield session


def model_names(cfg: RunConfig) -> tuple[str, set[str]]:
    """The id /v1/models shows (the target as it was named: a known model's or a store's name, else the file's
    stem), and every name a request's `model` may use: that, the file's stem, the pair's name."""
    stem = Path(cfg.target).stem
    named = cfg.target_name and not names.looks_like_path(cfg.target_name) and Path(cfg.target_name) != cfg.target
    primary = cfg.target_name if named else stem
    return primary, {primary, stem} | ({cfg.pair} if cfg.pair else set())
