"""Every setting of a run: RunConfig, the option table (option_table.py) and what a run derives from it, and
what else is read off the table.

RunConfig is an ordinary frozen dataclass (editors and type checkers see its fields); OPTIONS, each field's
Option, is read off the class. `generate`'s parameters, the config file's keys (PAIR_KEYS), validation, the
`--json` config and the options `bench` shares with `generate` all come from there. Which value a run gets
(command line > environment > config file > built-in) is decided in config.py.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from . import drafting
from .backend import devices
from .declaration import Option
from .drafting import DRAFTERS, NEEDS
from .engine.sampling import Sampler
from .engine.speculative import Settings
from .errors import UsageError
from .option_limits import AUTO_K_MAX, default_threads

# The limits config, fit, session and serve name from here:
from .option_limits import CTX_SIZE, MAX_BRANCHES, MAX_DRAFT_TOKENS, MAX_LOGPROBS, MAX_PREDICTION, MIN_CTX  # noqa: F401
from .option_table import RunOptions


def parse_draft_tokens(value: int | str | None) -> int | None:
    """-k's value as the command line, a config file or a request gives it: a whole number, or "auto"
    (None: the cost model chooses every round). Raises ValueError with the rule."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"must be a whole number or 'auto' (got {value!r})")


class OptionError(UsageError):
    """One setting breaks its rule; `key` names the option (and config key)."""

    def __init__(self, key: str, rule: str):
        super().__init__(f"{BY_KEY[key].flag} {rule}")
        self.key = key
        self.rule = rule


@dataclass(frozen=True)
class RunConfig(RunOptions):
    """Everything a run needs, resolved (config.resolve) and validated here, on every construction and
    every `override`."""

    debug: bool = False  # check the KV caches after every round (--debug, not a run option of its own)
    gbnf: str | None = None  # the grammar --json-schema or --grammar gives, as GBNF text (config.resolve)
    prediction_text: str | None = None  # the --prediction file's text (config.resolve)
    pair: str | None = None  # the config's pair the settings came from (None: none was used)
    target_name: str | None = None  # the target as it was named (a known model's name, or a path)
    # How the draft was chosen ("option": --draft, "pair": the config's pair, "auto": models/pairing.py, None:
    # no draft) and, where chosen, why: said by the run, not part of what it computes.
    draft_chosen_by: str | None = field(default=None, compare=False)
    draft_choice: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        """What a run gets where a setting is unset: the drafter from the draft, -k from the drafter, every
        core; a draft that the drafter never drafts with is not kept. Then every option's rules."""
        derive = object.__setattr__  # frozen: the unset values become what the run gets, once
        if self.drafter is None:
            derive(self, "drafter", drafting.default(self.draft is not None))
        rule = BY_KEY["drafter"].problem(self.drafter)
        if rule:
            raise OptionError("drafter", rule)
        kind = DRAFTERS[self.drafter]
        if not kind.uses_model:
            derive(self, "draft", None)
        if self.draft is None:
            derive(self, "draft_chosen_by", None)
        if self.draft_tokens is ...:
            derive(self, "draft_tokens", kind.k)
        if self.p_min is ...:
            derive(self, "p_min", kind.p_min)
        if self.threads == 0:
            derive(self, "threads", default_threads())
        for o in OPTIONS:
            rule = o.problem(getattr(self, o.key))
            if rule:
                raise OptionError(o.key, rule)
        for key in ("gpu_layers", "gpu_layers_draft"):  # "17" as the command line gives it: 17
            derive(self, key, devices.layers(getattr(self, key)))
        if self.json_schema is not None and self.grammar is not None:
            raise UsageError("--json-schema and --grammar each constrain the answer: give one of them")
        if kind.model == NEEDS and self.draft is None:
            raise OptionError("drafter", f"{self.drafter} needs a draft model: --draft PATH")
        if self.branches > 1 and not (self.draft is not None and kind.trees):
            why = "no --draft given" if kind.trees else f"--drafter {self.drafter}"
            raise UsageError(f"--branches {self.branches} needs a draft model: only the draft model forks ({why})")

    def override(self, **changes: Any) -> RunConfig:
        """This configuration with some settings changed (a request's, a bench row's), by the same rules; the
        others keep their values (a request for another drafter keeps the server's -k)."""
        if "drafter" in changes and "p_min" not in changes and self.p_min == DRAFTERS[self.drafter].p_min:
            changes = {**changes, "p_min": ...}  # the drafter's own floor (Kind.p_min), as a run of it would get
        return replace(self, **changes) if changes else self

    @property
    def sampler(self) -> Sampler:
        return Sampler(self.temp, self.top_k, self.top_p, self.min_p)

    def settings(self, *, prompt_kernels: bool = True, constraint: Any = None) -> Settings:
        """The engine's settings for this run (-k auto: drafts of up to AUTO_K_MAX, as auto chooses);
        `constraint`: the grammar's start state, where the run is constrained."""
        return Settings(
            self.draft_tokens or AUTO_K_MAX,
            self.max_tokens,
            self.sampler,
            self.seed,
            self.debug,
            ordered_cells=self.exact,
            prompt_kernels=prompt_kernels,
            constraint=constraint,
            logprobs=self.logprobs,
        )

    def as_dict(self) -> dict:
        """The --json "config": every option shown there, paths as strings, -k auto as "auto"."""
        out = {}
        for o in OPTIONS:
            if o.in_json:
                v = getattr(self, o.key)
                out[o.key] = str(v) if isinstance(v, Path) else ("auto" if o.key == "draft_tokens" and v is None else v)
        return out | {"draft_chosen_by": self.draft_chosen_by, "draft_choice": self.draft_choice}


OPTIONS: tuple[Option, ...] = tuple(replace(f.metadata["option"], key=f.name) for f in fields(RunConfig) if f.metadata)
BY_KEY = {o.key: o for o in OPTIONS}
# llama.cpp's names for the options (those taken and those not): an unknown one is pointed at specdec's
LLAMA_NAMES = {name: o for o in OPTIONS for name in (*o.aliases, *o.llama)}
# Where the models' layers go: every command that loads them takes these (bench's rows share them).
OFFLOAD = ("gpu_layers", "gpu_layers_draft", "device", "device_draft", "split_mode", "tensor_split", "main_gpu")
PAIR_KEYS = {o.key: o.config if len(o.config) > 1 else o.config[0] for o in OPTIONS if o.config}


def with_options(*keys: str) -> Callable:
    """Give a command function (ending in **settings) a Typer parameter for each named option."""

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        fn.__signature__ = sig.replace(parameters=params + [BY_KEY[k].parameter() for k in keys])
        return fn

    return wrap


def list_problem(key: str, values: list, option: str, auto: bool = False) -> str | None:
    """`bench`'s check of a comma-separated list of an option's values (None: auto), from its bounds."""
    lo, hi = BY_KEY[key].bounds
    if not all(v is None or math.isfinite(v) for v in values):
        return f"{option} must be finite numbers"
    if all(v is None or lo <= v <= hi for v in values):
        return None
    if hi == math.inf:
        return f"{option} must be >= {lo:g}"
    return f"{option} must be between {lo} and {hi}" + (", or auto" if auto else "")


def flag_problem(key: str, value: Any) -> str | None:
    """The message for one value of an option that breaks its rule, or None."""
    rule = BY_KEY[key].problem(value)
    return f"{BY_KEY[key].flag} {rule}" if rule else None
