"""Every setting of a run, declared once: flags, type, default, help, checks and config key.

`generate`'s parameters, the config file's keys and types (config.PAIR_KEYS), RunConfig's fields,
defaults and validation, the `--json` config, and the options `bench` shares with `generate` are all
derived from OPTIONS. Adding a setting is one entry here plus the code that uses it.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, field, make_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from .backend.rpc import problem as rpc_problem
from .engine.sampling import Sampler
from .errors import UsageError

# --- defaults and limits, one per line -----------------------------------------------------------
DRAFT_TOKENS = 4  # llama.cpp uses 3, mlx-lm 3, HF starts at 5; 4 suits a draft that is right ~80% of the time
MAX_TOKENS = 256  # long enough for a code answer, short enough to come back quickly
CTX_SIZE = 4096  # unless -c says or the target was trained for less: a page of prompt plus the answer, a small KV cache
MAX_DRAFT_TOKENS = 63  # a verify batch has k+1 logits rows; contexts reserve output room for 64
MAX_BRANCHES = 8  # --branches: a tree verify batch holds every branch's nodes, and llama.cpp a seq id per branch
P_SPLIT = 0.1  # fork where the draft's runner-up has >= 10% (llama.cpp's --draft-p-split)
MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS: more threads crash llama.cpp
MIN_CTX = 16  # below this not even a prompt and one verify batch fit
AUTO_K_MAX = 31  # -k auto drafts at most this many: verifying 32 tokens costs ~11x one here, 15 often pays more
DRAFTERS = ("auto", "model", "lookup", "none")

DrafterName = Enum("DrafterName", {d: d for d in DRAFTERS}, type=str)  # the command line's choice


def default_drafter(has_draft: bool) -> str:
    """The drafter when none is named: auto with a draft model (it drafts only where that pays), else none."""
    return "auto" if has_draft else "none"


def default_threads() -> int:
    """The cores this process may use (llama.cpp's decode scales with physical cores)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


Check = tuple[Callable[[Any], bool], str]  # (ok(value), the rule, with {v} for the value); None passes


def finite() -> Check:
    return math.isfinite, "must be a finite number (got {v})"


def at_least(lo: float, why: str = "") -> Check:
    return (lambda v: v >= lo), f"must be at least {lo} (got {{v}}){why}"


def within(lo: float, hi: float, text: str, why: str = "", lo_open: bool = False) -> Check:
    return (lambda v: (lo < v if lo_open else lo <= v) and v <= hi), f"must be in {text} (got {{v}}){why}"


@dataclass(frozen=True)
class Option:
    key: str  # RunConfig field, [pairs.NAME] key and --json config key
    flags: tuple[str, ...]  # on the command line ("-k", "--draft-tokens")
    type: Any  # the command line's type
    default: Any  # RunConfig's default
    help: str
    config: tuple[type, ...] = ()  # the TOML types a pair may set it with; () when a pair cannot
    checks: tuple[Check, ...] = ()
    in_json: bool = True  # shown in --json's "config"
    bounds: tuple[float, float] | None = None  # the range, for `bench`'s comma-separated lists of it
    env: str | None = None  # an environment variable that sets it when the command line does not

    @property
    def flag(self) -> str:
        return "/".join(f for f in self.flags if "/" not in f) or self.flags[0].split("/")[0]

    def problem(self, value: Any) -> str | None:
        """The first rule `value` breaks, or None."""
        if value is None:
            return None
        return next((rule.format(v=value) for ok, rule in self.checks if not ok(value)), None)

    def parameter(self) -> inspect.Parameter:
        """This option as a Typer parameter: unset (None) unless given, so that config values can fill in."""
        return inspect.Parameter(
            self.key, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[self.type],
            default=typer.Option(None, *self.flags, help=self.help),
        )  # fmt: skip


OPTIONS: tuple[Option, ...] = (
    Option(
        key="target",
        flags=("--target",),
        type=str,
        default=None,
        help="Target GGUF (a path or a known model name): the model whose output you get.",
        config=(str,),
    ),
    Option(
        key="draft",
        flags=("--draft",),
        type=str,
        default=None,
        help="Draft GGUF: a small model with the same tokenizer.",
        config=(str,),
    ),
    Option(
        key="drafter",
        flags=("--drafter",),
        type=DrafterName,
        default="none",
        help="Who drafts: 'auto' (default with a draft: each round plain, lookup or the model, whichever pays), "
        "'model' (the draft model), 'lookup' (copy from the prompt and text so far) or 'none' (target-only).",
        config=(str,),
        checks=((lambda v: v in DRAFTERS, f"must be one of {', '.join(DRAFTERS)} (got {{v!r}})"),),
    ),
    Option(
        key="draft_tokens",
        flags=("-k", "--draft-tokens"),
        type=str,
        default=DRAFT_TOKENS,
        help=f"Tokens drafted per round, or 'auto' to choose every round (up to {AUTO_K_MAX}) "
        f"(auto with --drafter auto or lookup, else {DRAFT_TOKENS}).",
        config=(int, str),
        checks=(at_least(1), (lambda v: v <= MAX_DRAFT_TOKENS, f"must be at most {MAX_DRAFT_TOKENS} (got {{v}})")),
        bounds=(1, MAX_DRAFT_TOKENS),
    ),
    Option(
        key="p_min",
        flags=("--p-min",),
        type=float,
        default=0.0,
        help="Draft model: stop drafting when its probability for its own token is below this [0: off].",
        config=(int, float),
        checks=(finite(), within(0, 1, "[0, 1]", "; 0 turns it off")),
    ),
    Option(
        key="branches",
        flags=("--branches",),
        type=int,
        default=1,
        help=f"Draft model: draft up to N branches per round as a tree, verified in one target pass (1..{MAX_BRANCHES}) [1].",
        config=(int,),
        checks=(within(1, MAX_BRANCHES, f"1..{MAX_BRANCHES}"),),
        bounds=(1, MAX_BRANCHES),
    ),
    Option(
        key="p_split",
        flags=("--p-split",),
        type=float,
        default=P_SPLIT,
        help=f"Tree drafting: fork where the draft's runner-up token has at least this probability [{P_SPLIT}].",
        config=(int, float),
        checks=(finite(), within(0, 1, "(0, 1]", lo_open=True)),
    ),
    Option(
        key="max_tokens",
        flags=("-n", "--max-tokens"),
        type=int,
        default=MAX_TOKENS,
        help=f"Stop after this many tokens [{MAX_TOKENS}].",
        config=(int,),
        checks=(at_least(1),),
    ),
    Option(
        key="temp",
        flags=("--temp",),
        type=float,
        default=0.0,
        help="Sampling temperature; 0 is greedy [0].",
        config=(int, float),
        checks=(finite(), (lambda v: v >= 0, "must be >= 0 (got {v}); 0 means greedy")),
        bounds=(0, math.inf),
    ),
    Option(
        key="top_k",
        flags=("--top-k",),
        type=int,
        default=0,
        help="Keep the k most likely tokens; 0 is off [0].",
        config=(int,),
        checks=((lambda v: v >= 0, "must be >= 0 (got {v}); 0 turns it off"),),
    ),
    Option(
        key="top_p",
        flags=("--top-p",),
        type=float,
        default=1.0,
        help="Nucleus sampling mass in (0, 1]; 1 is off [1].",
        config=(int, float),
        checks=(finite(), within(0, 1, "(0, 1]", "; 1 turns it off", lo_open=True)),
    ),
    Option(
        key="min_p",
        flags=("--min-p",),
        type=float,
        default=0.0,
        help="Drop tokens below min-p x the top probability [0].",
        config=(int, float),
        checks=(finite(), within(0, 1, "[0, 1]", "; 0 turns it off")),
    ),
    Option(
        key="seed",
        flags=("--seed",),
        type=int,
        default=None,
        help="Random seed: the same seed gives the same text.",
        config=(int,),
        checks=((lambda v: v >= 0, "must be >= 0 (got {v})"),),
    ),
    Option(
        key="ctx_size",
        flags=("-c", "--ctx-size"),
        type=int,
        default=None,
        help=f"Context size in tokens [the smaller of {CTX_SIZE} and what the target was trained for].",
        config=(int,),
        checks=(at_least(MIN_CTX),),
    ),
    Option(
        key="threads",
        flags=("-t", "--threads"),
        type=int,
        default=None,
        help="CPU threads; 0 means every core this process may use.",
        config=(),
        checks=(
            at_least(1),
            (
                lambda v: v <= MAX_THREADS,
                f"must be at most {MAX_THREADS}, llama.cpp's limit (got {{v}}; this machine has {os.cpu_count()} cores)",
            ),
        ),
    ),
    Option(
        key="exact",
        flags=("--exact/--no-exact",),
        type=bool,
        default=False,
        help="Exact mode: the target computes each row of a verify batch as it computes that token alone, so "
        "greedy output is target-only output token for token, on quantized models too (CPU; slower, see README).",
        config=(bool,),
    ),
    Option(
        key="lookup_cache",
        flags=("--lookup-cache/--no-lookup-cache",),
        type=bool,
        default=True,
        help="Lookup (auto or lookup drafter) also drafts from earlier answers of this target, kept in the specdec "
        "cache (bounded; `specdec cache clear` empties it; in bench, a row's answers to the prompts before). "
        "Off: nothing is read or written.",
        config=(bool,),
    ),
    Option(
        key="rpc",
        flags=("--rpc",),
        type=str,
        default=None,
        help="Run the target's layers on llama.cpp RPC servers (specdec rpc-server), HOST:PORT[,HOST:PORT...]; "
        "the draft stays on this machine (default: $SPECDEC_RPC, else the pair's rpc).",
        config=(str,),
        checks=((lambda v: rpc_problem(v) is None, "must be HOST:PORT[,HOST:PORT...], each server once (got {v!r})"),),
        env="SPECDEC_RPC",
    ),
    Option(
        key="chat",
        flags=("--chat/--no-chat",),
        type=bool,
        default=None,
        help="Wrap the prompt in the target's chat template (default: on when it has one). With the template your "
        "text is only text; with --no-chat control tokens written in it (e.g. <|im_start|>) are parsed as such.",
        config=(bool,),
        in_json=False,
    ),
    Option(
        key="system",
        flags=("--system",),
        type=str,
        default=None,
        help="System prompt for the chat template (needs one).",
        config=(str,),
        in_json=False,
    ),
)
BY_KEY = {o.key: o for o in OPTIONS}
PAIR_KEYS = {o.key: o.config if len(o.config) > 1 else o.config[0] for o in OPTIONS if o.config}


def with_options(*keys: str) -> Callable:
    """Give a command function (ending in **settings) a Typer parameter for each named option."""

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        fn.__signature__ = sig.replace(parameters=params + [BY_KEY[k].parameter() for k in keys])
        return fn

    return wrap


def given(settings: dict[str, Any]) -> dict[str, Any]:
    """The options' values as the command line gave them (choices as plain strings), and as the
    environment sets those it did not (an environment variable wins over the config file)."""
    out = {k: v.value if isinstance(v, Enum) else v for k, v in settings.items() if k in BY_KEY}
    for o in OPTIONS:
        if o.env and o.key in settings and out.get(o.key) is None and os.environ.get(o.env):
            out[o.key] = os.environ[o.env]
    return out


class OptionError(UsageError):
    """One setting breaks its rule; `key` names the option (and config key)."""

    def __init__(self, key: str, rule: str):
        super().__init__(f"{BY_KEY[key].flag} {rule}")
        self.key = key
        self.rule = rule


def _validate(cfg: Any) -> None:
    for o in OPTIONS:
        rule = o.problem(getattr(cfg, o.key))
        if rule:
            raise OptionError(o.key, rule)
    usage = [
        (cfg.drafter != "model" or cfg.draft is not None, "--drafter model needs --draft PATH"),
        (
            cfg.branches == 1 or (cfg.draft is not None and cfg.drafter in ("model", "auto")),
            f"--branches {cfg.branches} needs a draft model: only the draft model forks "
            f"({'--drafter ' + cfg.drafter if cfg.drafter in ('lookup', 'none') else 'no --draft given'})",
        ),
    ]
    for ok, message in usage:
        if not ok:
            raise UsageError(message)


def _as_dict(cfg: Any) -> dict:
    """The --json "config": every option shown there, paths as strings, -k auto as "auto"."""
    out = {}
    for o in OPTIONS:
        if o.in_json:
            v = getattr(cfg, o.key)
            out[o.key] = str(v) if isinstance(v, Path) else ("auto" if o.key == "draft_tokens" and v is None else v)
    return out


def _sampler(cfg: Any) -> Sampler:
    return Sampler(cfg.temp, cfg.top_k, cfg.top_p, cfg.min_p)


# RunConfig: everything a run needs, resolved and validated in one place; its fields are the options
# (target a Path, draft a Path or None, draft_tokens None for auto) plus debug.
_FIELD_TYPES = {"target": Path, "draft": Optional[Path], "draft_tokens": Optional[int], "drafter": str}
RunConfig = make_dataclass(
    "RunConfig",
    [("target", Path)]
    + [
        (o.key, _FIELD_TYPES.get(o.key, Optional[o.type]),
         field(default_factory=default_threads) if o.key == "threads" else field(default=o.default))
        for o in OPTIONS if o.key != "target"
    ]
    + [("debug", bool, field(default=False))],
    frozen=True,
    namespace={"__post_init__": _validate, "as_dict": _as_dict, "sampler": property(_sampler),
               "__doc__": "Everything a run needs, resolved and validated in one place (fields: the OPTIONS).",
               "__module__": __name__},
)  # fmt: skip


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
