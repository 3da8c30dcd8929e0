"""The one place where a run's settings are decided: command line > environment > config file > built-in
defaults (`resolve`: the finished RunConfig), and the config file's named pairs (TOML).

Which file: --config FILE, else $SPECDEC_CONFIG, else the user config in the XDG config directory
(specdec/config.toml) if it exists. Only that one file is read. See models.example.toml.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Callable, NamedTuple

from .backend import grammar, mtp
from .errors import SpecdecError, UsageError
from .inputs import read_file
from .outputs import kind_name
from .drafting import DRAFTERS, NEVER
from .models import names, pairing
from .models.catalog import BUILTIN_PAIRS, DEFAULT_PAIR
from .options import MAX_PREDICTION, OPTIONS, PAIR_KEYS, OptionError, RunConfig, parse_draft_tokens

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class ConfigError(SpecdecError):
    def __init__(self, file: Path | str, key: str, problem: str):
        super().__init__(f"config {file}: {key}: {problem}", hint="see models.example.toml for the format")


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(os.path.expanduser(base)) / "specdec" / "config.toml"


def config_file(explicit: Path | None) -> Path | None:
    """The one config file to read, or None. An explicitly named file must exist."""
    if explicit is not None:
        path, source = explicit, "--config"
    elif os.environ.get("SPECDEC_CONFIG"):
        path, source = Path(os.environ["SPECDEC_CONFIG"]), "SPECDEC_CONFIG"
    else:
        path = user_config_path()
        return path if path.is_file() else None
    path = Path(os.path.expanduser(path))
    if not path.exists():
        raise SpecdecError(f"config file not found: {path} (from {source})")
    if not path.is_file():  # a FIFO would block the read, a directory cannot be one
        raise SpecdecError(f"config {path} (from {source}) is {kind_name(path.stat().st_mode)}, not a regular file")
    return path


class Loaded(NamedTuple):
    default: str  # the default pair's name
    pairs: dict[str, dict[str, Any]]
    model_dirs: tuple[str, ...] = ()  # folders of GGUF models to list and name (models/stores.py)


def load(path: Path | None) -> Loaded:
    """The file's default pair, its pairs merged over the built-in ones, and its model folders; validated."""
    pairs = {name: dict(values) for name, values in BUILTIN_PAIRS.items()}
    if path is None:
        return Loaded(DEFAULT_PAIR, pairs)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, "syntax", str(e)) from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(path, "syntax", "values are nested too deeply") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecdecError(f"cannot read config {path}: {e}") from None
    unknown = set(data) - {"default_pair", "pairs", "model_dirs"}
    if unknown:
        raise ConfigError(
            path, sorted(unknown)[0], "unknown top-level key (expected default_pair, model_dirs and [pairs.NAME])"
        )
    dirs = data.get("model_dirs", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) and d.strip() for d in dirs):
        raise ConfigError(path, "model_dirs", "must be a list of folders (strings)")
    file_pairs = data.get("pairs", {})
    if not isinstance(file_pairs, dict):
        raise ConfigError(path, "pairs", "must be tables: [pairs.NAME]")
    for name, values in file_pairs.items():
        if not isinstance(values, dict):
            raise ConfigError(path, f"pairs.{name}", "must be a table")
        for key, value in values.items():
            where = f"pairs.{name}.{key}"
            if key not in PAIR_KEYS:
                raise ConfigError(path, where, f"unknown key (known: {', '.join(PAIR_KEYS)})")
            expected = PAIR_KEYS[key]
            if isinstance(value, bool) and expected is not bool or not isinstance(value, expected):
                names = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
                raise ConfigError(path, where, f"must be {names}, not {type(value).__name__} {value!r}")
            if key == "draft_tokens" and isinstance(value, str) and not _parses(value):
                raise ConfigError(path, where, f'must be a number or "auto", not {value!r}')
            if key in ("target", "draft") and not value.strip():
                raise ConfigError(path, where, "must be a model name or a path, not empty")
            if key in ("target", "draft") and _is_path(value, path.parent):
                values[key] = os.path.abspath(path.parent / os.path.expanduser(value))  # relative to the file
        if "target" not in values and name not in pairs:
            raise ConfigError(path, f"pairs.{name}", "a new pair needs a target")
        pairs[name] = values if name not in pairs else {**pairs[name], **values}
    default = data.get("default_pair", DEFAULT_PAIR)
    if not isinstance(default, str) or default not in pairs:
        raise ConfigError(path, "default_pair", f"{default!r} is not a pair (pairs: {', '.join(pairs)})")
    return Loaded(default, pairs, tuple(os.path.abspath(path.parent / os.path.expanduser(d)) for d in dirs))


def resolve(
    cli: dict[str, Any],
    pair: str | None,
    path: Path | None,
    *,
    debug: bool = False,
    model_file: Callable[..., Path] = names.model_file,
) -> RunConfig:
    """The run's configuration: values given on the command line (not None) win over the environment's (an
    option's variable, e.g. $SPECDEC_RPC), which win over the pair's, which win over RunConfig's own (which are
    what a run gets: auto with a draft, -k the drafter's, every core).

    A pair is used when named with --pair, or when the command line names no target (the default pair).
    `model_file(ref, model_dirs, role)` turns a model reference (a path, a catalogue name, a store's name)
    into its file. A target without a draft (or with `--draft auto`) gets the best local model that can draft
    for it (models/pairing.py), where the drafter may use one; with none, auto drafts by lookup alone. A
    value that breaks its option's rule is an error naming where it came from: the flag, or the config
    file's key."""
    default, pairs, model_dirs = load(path)
    given = {k: v.value if isinstance(v, Enum) else v for k, v in cli.items() if v is not None}
    given |= {o.key: os.environ[o.env] for o in OPTIONS if o.env and o.key not in given and os.environ.get(o.env)}
    merged, from_file, name = given, {}, None
    if pair is not None or "target" not in given:
        name = pair or default
        if name not in pairs:
            where = f" in {path}" if path else ""
            raise SpecdecError(f"unknown pair {name!r}{where}", hint=f"pairs: {', '.join(pairs)}")
        merged = {**pairs[name], **given}
        if "draft" in given and "drafter" not in given:
            merged.pop("drafter", None)  # a draft named on the command line is used where it pays: the default
        if path is not None:
            from_file = {k: (path, f"pairs.{name}.{k}") for k in pairs[name] if k not in given}
    fields = {k: v for k, v in merged.items() if k in RunConfig.__dataclass_fields__}
    fields["target"] = model_file(str(merged["target"]), model_dirs, "--target")
    fields |= _draft(merged, "draft" in given, fields["target"], model_dirs, model_file)
    if "draft_tokens" in fields:
        try:
            fields["draft_tokens"] = parse_draft_tokens(fields["draft_tokens"])
        except ValueError as e:
            raise UsageError(f"-k/--draft-tokens {e}") from None
    try:
        cfg = RunConfig(**fields, debug=debug, pair=name, target_name=str(merged["target"]))
    except OptionError as e:
        if e.key in from_file:  # the value came from the config file: say where, not which flag
            raise ConfigError(*from_file[e.key], e.rule) from None
        raise
    if cfg.prediction is not None:  # read now: a bad path fails before any model loads
        cfg = cfg.override(prediction_text=read_file(cfg.prediction, "--prediction", MAX_PREDICTION))
    return cfg.override(gbnf=_gbnf(cfg)) if cfg.json_schema or cfg.grammar else cfg


def _gbnf(cfg: RunConfig) -> str:
    """The constraint as GBNF, parsed once now: a schema or grammar that cannot work fails before any model loads."""
    gbnf = grammar.from_schema(cfg.json_schema) if cfg.json_schema else grammar.from_file(cfg.grammar)
    grammar.check(gbnf, schema=bool(cfg.json_schema))
    return gbnf


def _draft(merged: dict, on_command_line: bool, target: Path, model_dirs: tuple[str, ...], model_file) -> dict:
    """The draft's fields: the one named (by the command line, else the pair), or the one `--draft auto` (or no
    draft where the drafter may use one) chooses among the local models, and how it was chosen."""
    ref, drafter = merged.get("draft"), merged.get("drafter")
    if ref is not None and str(ref).strip().lower() != "auto":
        return {
            "draft": model_file(str(ref), model_dirs, "--draft"),
            "draft_chosen_by": "option" if on_command_line else "pair",
        }
    if drafter in DRAFTERS and not DRAFTERS[drafter].uses_model:
        return {"draft": None}
    uses_heads = drafter is None or drafter in DRAFTERS and DRAFTERS[drafter].heads != NEVER
    if ref is None and uses_heads and mtp.usable(target):  # its own heads draft cheapest
        return {"draft": None, "draft_choice": "the target's own MTP heads"} | ({} if drafter else {"drafter": "auto"})
    entry, why = pairing.for_target(target, model_dirs)
    out = {"draft": entry.path if entry else None, "draft_chosen_by": "auto" if entry else None, "draft_choice": why}
    return out | ({"drafter": "auto"} if drafter is None else {})  # no draft model: auto drafts by lookup


def _parses(value: str) -> bool:
    try:
        parse_draft_tokens(value)
    except ValueError:
        return False
    return True


def _is_path(value: str, folder: Path) -> bool:
    """Whether a pair's target or draft is a file (relative to the config's folder), not a model's name."""
    if value.strip().lower() == "auto":
        return False
    return names.looks_like_path(value, folder) or (folder / os.path.expanduser(value)).exists()
