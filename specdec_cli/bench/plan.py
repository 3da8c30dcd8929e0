"""What a bench runs, read and checked before any model loads: a bad option or output path costs nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from .. import drafting, options
from ..backend import draft_files, mtp
from ..drafting import measure
from ..errors import UsageError
from ..options import RunConfig, parse_draft_tokens
from ..outputs import output_path
from . import runner, suite

T = TypeVar("T")
EXACT_MODES = {"off": (False,), "on": (True,), "both": (False, True)}  # bench --exact


@dataclass(frozen=True)
class Plan:
    """What a bench runs."""

    cfg: RunConfig  # the sessions' configuration (a row changes its drafter, k, branches and temperature)
    prompts: list[suite.Prompt]
    configs: list[runner.Config]
    modes: tuple[bool, ...]  # exact mode off, on, or both side by side
    curve_max: int  # the cost curve's longest batch
    longest: int | None  # the longest draft a row sends (a recurrent target's snapshots); None: auto's
    files: dict[str, Path | None]  # --json, --csv, --plot
    settings: dict[str, Any]  # what the JSON's "settings" shows

    @property
    def need(self) -> int:
        return measure.CONTEXT + self.curve_max

    @property
    def why(self) -> str:
        return f"the cost curve decodes {self.curve_max} tokens after {measure.CONTEXT} of context"


def plan(
    cfg: RunConfig,
    *,
    drafters: str | None,
    draft_tokens: str,
    branches: str,
    temps: str,
    exact: str | None,
    prompts: str,
    categories: str | None,
    max_tokens: int,
    runs: int,
    seed: int,
    outputs: dict[str, Path | None],
    config_file: Path | None,
) -> Plan:
    """The bench over `cfg` (the command line's and the config's settings, resolved) and its own lists."""
    ks = _parse_list(draft_tokens, parse_draft_tokens, "--draft-tokens")
    temp_list = _parse_list(temps, float, "--temps")
    branch_list = _parse_list(branches, int, "--branches")
    cats = _parse_list(categories, str, "--categories") if categories else None
    if exact is not None and exact not in EXACT_MODES:
        raise UsageError(f"--exact must be on, off or both (got {exact!r})")
    # The lists are checked with their options' bounds, the single values with their options' rules.
    problems = [
        options.list_problem("draft_tokens", ks, "--draft-tokens", auto=True),
        options.list_problem("temp", temp_list, "--temps"),
        options.list_problem("branches", branch_list, "--branches"),
        None if runs >= 1 else f"--runs must be at least 1 (got {runs})",
        *(options.flag_problem(key, value) for key, value in (("max_tokens", max_tokens), ("seed", seed))),
        None
        if outputs["--plot"] is None or outputs["--plot"].suffix.lower() == ".svg"
        else "--plot writes SVG: give a file ending in .svg",
    ]
    for message in problems:
        if message:
            raise UsageError(message)
    prompt_list = suite.load(prompts, cats)
    has_heads = mtp.usable(cfg.target)
    file = draft_files.read(cfg.draft) if cfg.draft else None
    native = file.arch if file is not None else None
    names = _drafters(drafters, cfg.draft is not None, branch_list, branches, has_heads, native)
    # One session serves every row: with the draft loaded if a row may use it; rows pick their drafter.
    kinds = [drafting.kind(n) for n in names]
    if cfg.draft is not None and any(k.uses_model for k in kinds):
        session_drafter = drafting.default(True)
    else:
        session_drafter = next((n for n, k in zip(names, kinds) if not k.plain), drafting.plain())
    # Before any model loads, or is assembled: a bad output path should cost nothing, and must never destroy
    # an input (the draft as given counts, whether or not a row loads it).
    inputs = {
        "--prompts": None if prompts == suite.SUITE_NAME else Path(prompts),
        "the config file": config_file,
        "the target model": cfg.target,
        "the draft model": cfg.draft,
    }
    files = _outputs(outputs, inputs)
    cfg = cfg.override(drafter=session_drafter, max_tokens=max_tokens, draft_tokens=None)
    modes = EXACT_MODES[exact] if exact else (cfg.exact,)
    curve_max = max([measure.CURVE_MAX] + [k + 1 for k in ks if k is not None])
    configs = runner.plan(names, ks, temp_list, branch_list, modes)
    longest = None if None in ks or any(k.chooses_k for k in kinds) else max(ks)
    settings = {
        "max_tokens": max_tokens,
        "runs": runs,
        "seed": seed,
        "prompts": prompts,
        "categories": sorted({p.category for p in prompt_list}),
        "prompt_count": len(prompt_list),
        "exact": list(modes),
    }
    result = Plan(cfg, prompt_list, configs, modes, curve_max, longest, files, settings)
    if cfg.ctx_size is not None and cfg.ctx_size < result.need:
        raise UsageError(f"-c/--ctx-size must be at least {result.need} for bench (got {cfg.ctx_size}): {result.why}")
    return result


def _drafters(
    given: str | None,
    has_draft: bool,
    branch_list: list[int],
    branches: str,
    has_heads: bool = False,
    native: str | None = None,
) -> list[str]:
    """The drafters to sweep (all of them by default, the baseline first; those that need a draft model only
    with one, those that need the target's MTP heads only where it has them; with an EAGLE-3 or DFlash draft
    (`native`, its architecture), its own drafter in the draft model's place)."""
    if given:
        names = _parse_list(given, str, "--drafters")
    else:
        every = sorted(drafting.DRAFTERS.values(), key=lambda k: not k.plain)
        names = [
            k.name
            for k in every
            if (has_draft or k.model != drafting.NEEDS)
            and (has_heads or k.heads != drafting.NEEDS)
            and k.native == (native if k.model == drafting.NEEDS else None)
        ]
    for name in names:
        if name not in drafting.DRAFTERS:
            raise UsageError(f"--drafters: unknown drafter {name!r}", hint=f"drafters: {', '.join(drafting.DRAFTERS)}")
        if drafting.kind(name).model == drafting.NEEDS and not has_draft:
            raise UsageError(
                f"--drafters {name} needs a draft model", hint="pass --draft PATH or a --pair with a draft"
            )
    if max(branch_list) > 1 and not (has_draft and any(drafting.kind(n).trees for n in names)):
        trees = ", ".join(k.name for k in drafting.DRAFTERS.values() if k.trees)
        raise UsageError(
            f"--branches {branches} needs a draft model: only the draft model forks",
            hint=f"pass --draft PATH and include one of {trees} in --drafters",
        )
    return names


def _parse_list(value: str, cast: Callable[[str], T], option: str) -> list[T]:
    try:
        items = [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option}: cannot read {value!r} as a comma-separated list") from None
    if not items:
        raise UsageError(f"{option} is empty")
    return list(dict.fromkeys(items))  # keep order, drop repeats


def _outputs(files: dict[str, Path | None], inputs: dict[str, Path | None]) -> dict[str, Path | None]:
    """Each output's file (symlinks resolved), checked in order: none is an input or an earlier output."""
    checked: dict[str, Path] = {}
    for option, given in files.items():
        if given is not None:
            checked[option] = output_path(given, option, {**inputs, **checked})
    return {option: checked.get(option) for option in files}
