"""How a run option is declared: its Option (flags, type, help, checks, config types), the rules its checks
spell, and the Typer parameter it becomes. option_table.py declares every option with these."""

from __future__ import annotations

import inspect
import math
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, Optional

import typer

Check = tuple[Callable[[Any], bool], str]  # (ok(value), the rule, with {v} for the value); None passes

# The --help panels, grouped as llama.cpp groups its own options; a command's general options (--json, --debug,
# --help) stay in Typer's "Options", printed first. Panels print in the order a command's parameters reach them.
MODELS = "Models"
PROMPT = "Prompt"
DRAFTING = "Drafting"
CACHES = "Exact mode and caches"  # apart from DRAFTING: their --no-... column would narrow its help to ~15 characters
SAMPLING = "Sampling"
OFFLOAD = "Offload"
SERVER = "Server"


def finite() -> Check:
    return math.isfinite, "must be a finite number (got {v})"


def at_least(lo: float, why: str = "") -> Check:
    return (lambda v: v >= lo), f"must be at least {lo} (got {{v}}){why}"


def at_most(hi: float, why: str = "") -> Check:
    return (lambda v: v <= hi), f"must be at most {hi:,} (got {{v}}){why}"


def within(lo: float, hi: float, text: str, why: str = "", lo_open: bool = False) -> Check:
    return (lambda v: (lo < v if lo_open else lo <= v) and v <= hi), f"must be in {text} (got {{v}}){why}"


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]  # on the command line ("-k", "--draft-tokens"), as messages name the option
    type: Any  # the command line's type
    help: str
    panel: str | None = None  # the --help panel (None: the command's general "Options")
    aliases: tuple[str, ...] = ()  # llama.cpp's names for the same option, taken too ("--draft-max")
    llama: tuple[str, ...] = ()  # llama.cpp's names not taken (they would widen --help): an error points here
    config: tuple[type, ...] = ()  # the TOML types a pair may set it with; () when a pair cannot
    checks: tuple[Check, ...] = ()
    in_json: bool = True  # shown in --json's "config"
    bounds: tuple[float, float] | None = None  # the range, for `bench`'s comma-separated lists of it
    env: str | None = None  # an environment variable that sets it when the command line does not
    key: str = ""  # the RunConfig field (and [pairs.NAME] and --json config key): filled in from the field

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
            self.key,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Optional[self.type],
            default=typer.Option(None, *self.flags, *self.aliases, help=self.help, rich_help_panel=self.panel),
        )


class _Said(str):
    """A rule whose words depend on the value (Option.problem formats a rule with it): `said` gives one."""

    def __new__(cls, problem: Callable[[Any], str | None]) -> _Said:
        rule = super().__new__(cls, "{v}")
        rule.problem = problem
        return rule

    def format(self, *args: Any, v: Any = None, **kwargs: Any) -> str:
        return self.problem(v) or ""


def said(problem: Callable[[Any], str | None]) -> Check:
    """A check whose rule `problem(value)` words itself (None: the value passes), e.g. naming the devices there are."""
    return (lambda v: problem(v) is None), _Said(problem)


def option(*flags: str, type: Any, help: str, default: Any = None, default_factory: Any = MISSING, **rest: Any) -> Any:
    """A RunConfig field declared with its Option (`rest`: Option's other fields); default=MISSING: required."""
    meta = {"option": Option(flags, type, help, **rest)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)
