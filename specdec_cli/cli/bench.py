"""`specdec bench`: sweep drafters, draft lengths and temperatures; measure, predict, recommend.

Three steps: `_plan` reads and checks everything before a model loads (a bad option or output path costs
nothing), `_run` loads the sessions, measures the cost curve and sweeps the rows (bench/runner.py),
rewriting the files after each, and `_render` writes the files and tables whole at the end."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer

from .. import config, options, signals, ui
from ..bench import report, runner, suite
from ..drafting import cost as costmodel
from ..errors import UsageError
from ..options import DRAFTERS, RunConfig, parse_draft_tokens
from ..outputs import output_path, write_atomic
from ..session import Session, open_session
from .common import CONFIG, PAIR, model_location, run_config

T = TypeVar("T")
EXACT_MODES = {"off": (False,), "on": (True,), "both": (False, True)}  # bench --exact

# --- bench's defaults, one per line (its own: lists to sweep, shorter answers) ----------------------
BENCH_DRAFT_TOKENS = "2,3,4"  # fixed lengths for model and lookup around llama.cpp's 3; add 8,15 or auto to see more
BENCH_BRANCHES = "1"  # chains only; 1,2,3 adds tree-drafting rows for the draft model and auto
BENCH_TEMPS = "0"  # greedy: the speed-up question without sampling noise; add 0.7 to see sampling
BENCH_MAX_TOKENS = 64  # long enough for steady state, short enough that 21 prompts take a minute per pass
BENCH_SEED = 0  # sampled rows use seed + prompt index: reproducible by default
RUNS = 1  # median of R per prompt; raise it on a noisy machine

DRAFTERS_OPTION = typer.Option(
    None, "--drafters", help="Comma list of none,model,lookup,auto (all of them; model only with a draft)."
)
DRAFT_TOKENS_OPTION = typer.Option(
    BENCH_DRAFT_TOKENS, "--draft-tokens",
    help="Comma list of draft lengths k for model and lookup ('auto' too); auto chooses its own.",
)  # fmt: skip
BRANCHES_OPTION = typer.Option(
    BENCH_BRANCHES, "--branches",
    help="Comma list of branch counts for the draft model and auto rows (tree drafting, e.g. 1,2,3).",
)  # fmt: skip
EXACT_OPTION = typer.Option(
    None, "--exact",
    help="Exact mode for the rows: on, off, or both (side by side: exact rows get a 'vs fast' column, "
    "their speed against fast target-only) [the config's exact, else off].",
)  # fmt: skip
PROMPTS_OPTION = typer.Option(suite.SUITE_NAME, "--prompts", help="The built-in suite, or a JSONL / plain-text file.")
CATEGORIES_OPTION = typer.Option(None, "--categories", help=f"Comma list of categories ({','.join(suite.CATEGORIES)}).")


@options.with_options("target", "draft", "threads", "ctx_size", "rpc", "lookup_cache")  # a row's other settings
def bench(
    pair: Optional[str] = PAIR,
    config_path: Optional[Path] = CONFIG,
    drafters: Optional[str] = DRAFTERS_OPTION,
    draft_tokens: str = DRAFT_TOKENS_OPTION,
    branches: str = BRANCHES_OPTION,
    temps: str = typer.Option(BENCH_TEMPS, "--temps", help="Comma list of temperatures (0 = greedy)."),
    exact: Optional[str] = EXACT_OPTION,
    prompts: str = PROMPTS_OPTION,
    categories: Optional[str] = CATEGORIES_OPTION,
    max_tokens: int = typer.Option(BENCH_MAX_TOKENS, "-n", "--max-tokens", help="Tokens generated per prompt."),
    runs: int = typer.Option(RUNS, "--runs", help="Runs per prompt and configuration (median), after one warm-up."),
    seed: int = typer.Option(BENCH_SEED, "--seed", help="Base seed for sampled rows (prompt i uses seed + i)."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write the results as JSON (after every row)."),
    csv_file: Optional[Path] = typer.Option(None, "--csv", help="Write one CSV row per configuration and category."),
    plot_file: Optional[Path] = typer.Option(None, "--plot", help="Write an SVG chart of speed-up vs draft length."),
    **given: Any,
) -> None:
    """Measure what pays on this machine: speed-up, acceptance and the cost model, per configuration."""
    cfg_file = config.config_file(config_path)
    plan = _plan(
        drafters, draft_tokens, branches, temps, exact, prompts, categories, max_tokens, runs, seed,
        outputs={"--json": json_file, "--csv": csv_file, "--plot": plot_file},
        merged=config.resolve(given, pair, cfg_file), config_file=cfg_file,
    )  # fmt: skip
    doc, curve, interrupted = _run(plan)
    _render(plan, doc, curve, interrupted)
    if interrupted:
        raise typer.Exit(signals.exit_code())


@dataclass(frozen=True)
class Plan:
    """What a bench runs, checked before any model loads."""

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
        return costmodel.CONTEXT + self.curve_max

    @property
    def why(self) -> str:
        return f"the cost curve decodes {self.curve_max} tokens after {costmodel.CONTEXT} of context"


def _plan(drafters, draft_tokens, branches, temps, exact, prompts, categories, max_tokens, runs, seed, *,
          outputs: dict[str, Path | None], merged: dict[str, Any], config_file: Path | None) -> Plan:  # fmt: skip
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
        None if outputs["--plot"] is None or outputs["--plot"].suffix.lower() == ".svg"
        else "--plot writes SVG: give a file ending in .svg",
    ]  # fmt: skip
    for message in problems:
        if message:
            raise UsageError(message)
    prompt_list = suite.load(prompts, cats)
    names = _drafters(drafters, bool(merged.get("draft")), branch_list, branches)
    # One session serves every row: load the draft if a row may use it; rows pick their drafter.
    uses_model = bool(merged.get("draft")) and bool({"model", "auto"} & set(names))
    drafter = options.default_drafter(uses_model) if uses_model or set(names) == {"none"} else "lookup"
    # Before any model loads, or is assembled: a bad output path should cost nothing, and must never
    # destroy an input (the draft as given counts, whether or not a row loads it).
    inputs = {
        "--prompts": None if prompts == suite.SUITE_NAME else Path(prompts),
        "the config file": config_file, "the target model": model_location(merged["target"]),
        "the draft model": model_location(merged["draft"]) if merged.get("draft") else None,
    }  # fmt: skip
    files = _outputs(outputs, inputs)
    cfg = run_config({**merged, "drafter": drafter, "max_tokens": max_tokens, "draft_tokens": None})
    modes = EXACT_MODES[exact] if exact else (cfg.exact,)
    curve_max = max([costmodel.CURVE_MAX] + [k + 1 for k in ks if k is not None])
    plan = Plan(
        cfg, prompt_list, runner.plan(names, ks, temp_list, branch_list, modes), modes, curve_max,
        longest=None if None in ks or "auto" in names else max(ks), files=files,
        settings={"max_tokens": max_tokens, "runs": runs, "seed": seed, "prompts": prompts,
                  "categories": sorted({p.category for p in prompt_list}), "prompt_count": len(prompt_list),
                  "exact": list(modes)},
    )  # fmt: skip
    if cfg.ctx_size is not None and cfg.ctx_size < plan.need:
        raise UsageError(f"-c/--ctx-size must be at least {plan.need} for bench (got {cfg.ctx_size}): {plan.why}")
    return plan


def _drafters(given: str | None, has_draft: bool, branch_list: list[int], branches: str) -> list[str]:
    """The drafters to sweep (all of them by default; the draft model only with a draft)."""
    names = _parse_list(given, str, "--drafters") if given else ["none"] + ["model"] * has_draft + ["lookup", "auto"]
    for name in names:
        if name not in DRAFTERS:
            raise UsageError(f"--drafters: unknown drafter {name!r}", hint=f"drafters: {', '.join(DRAFTERS)}")
    if "model" in names and not has_draft:
        raise UsageError("--drafters model needs a draft model", hint="pass --draft PATH or a --pair with a draft")
    if max(branch_list) > 1 and not (has_draft and {"model", "auto"} & set(names)):
        raise UsageError(
            f"--branches {branches} needs a draft model: only the draft model forks",
            hint="pass --draft PATH and include model or auto in --drafters",
        )
    return names


def _run(plan: Plan) -> tuple[dict, costmodel.Costs, bool]:
    """Load a session per mode, measure the cost curve, then sweep the rows: (the JSON document with its rows
    as far as they got, the cost curve, whether Ctrl-C or SIGTERM ended it; every finished row is kept)."""
    cfg, modes = plan.cfg, plan.modes
    with ExitStack() as stack:
        sessions = {mode: stack.enter_context(open_session(cfg.override(exact=mode), plan.longest)) for mode in modes}
        first = sessions[modes[0]]
        first.check_branches(max(c.branches for c in plan.configs))  # trees on a recurrent model: before any row
        if first.target_ctx.n_ctx < plan.need:  # fitted to a target trained for fewer tokens
            raise UsageError(
                f"bench needs a context of at least {plan.need} tokens, and {cfg.target.name} has "
                f"{first.target_ctx.n_ctx}: {plan.why}"
            )
        for message in {m for s in sessions.values() for m in s.warnings}:
            ui.warning(message)
        curves = {mode: _measure(plan, session, mode) for mode, session in sessions.items()}
        doc = {
            "machine": {**report.machine(), "threads": cfg.threads},
            "models": {"target": str(cfg.target), "draft": str(cfg.draft) if cfg.draft else None,
                       "target_on": first.where},
            "cost_curve": report.cost_curve(curves[modes[0]]),
            **({"cost_curve_exact": report.cost_curve(curves[True])} if len(modes) > 1 else {}),
            "settings": {**plan.settings, "ctx_size": first.target_ctx.n_ctx},
            "rows": [],
        }  # fmt: skip
        _write(doc, plan.files)
        view = ui.BenchView(runner.generations(plan.configs, plan.prompts, plan.settings["runs"]))
        try:
            with view:
                for result in runner.sweep(
                    sessions, plan.prompts, plan.configs, runs=plan.settings["runs"], seed=plan.settings["seed"],
                    tick=view.tick, notice=_once(ui.warning),
                ):  # fmt: skip
                    new = report.rows_for(result, plan.prompts, curves[result.config.exact])
                    doc["rows"] += new
                    _write(doc, plan.files)
                    view.add(new)
        except signals.INTERRUPTS:
            return doc, curves[modes[0]], True
    return doc, curves[modes[0]], False


def _measure(plan: Plan, session: Session, exact: bool) -> costmodel.Costs:
    """The cost curve, thoroughly: the predictions' and auto's starting point."""
    draft = plan.cfg.draft
    ui.note(
        f"measuring the cost curve of {plan.cfg.target.name}" + (f" and {draft.name}" if draft else "")
        + (" (exact mode)" if exact else "")
    )  # fmt: skip
    tokens = session.prompt_tokens(plan.prompts[0].text)
    curve = costmodel.measure(session.target_ctx, session.draft_ctx, tokens, plan.curve_max, thorough=True)
    return session.costs(tokens, measured=curve)  # auto starts from this measurement: the predictions' one


def _render(plan: Plan, doc: dict, curve: costmodel.Costs, interrupted: bool) -> None:
    """The files and the tables, written whole (a signal now waits for them)."""
    cfg, rows = plan.cfg, doc["rows"]
    with signals.held():
        doc["recommendation"] = report.recommendation(rows, curve) if rows else "interrupted before any row finished"
        doc["interrupted"] = interrupted
        _write(doc, plan.files)
        machine = doc["machine"]
        header = (
            f"specdec bench: {cfg.target.name}" + (f" <- {cfg.draft.name}" if cfg.draft else "")
            + (f" (target on {doc['models']['target_on']})" if cfg.rpc else "")
            + f", {len(plan.prompts)} prompts, {plan.settings['max_tokens']} tokens each, {cfg.threads} threads, "
            + f"{machine['cpu']} ({machine['cpu_features']})"
        )  # fmt: skip
        ui.show_bench(rows, doc["cost_curve"], doc["recommendation"], header, doc.get("cost_curve_exact"))
        if interrupted:
            json_file = plan.files["--json"]
            ui.note("interrupted: every finished row is kept" + (f" in {json_file}" if json_file else ""))


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


def _once(say: Callable[[str], None]) -> Callable[[str], None]:
    """`say`, for each distinct message once (every generation of a sweep would repeat it)."""
    said: set[str] = set()

    def once(message: str) -> None:
        if message not in said:
            said.add(message)
            say(message)

    return once


def _write(doc: dict, files: dict[str, Path | None]) -> None:
    if files["--json"]:
        write_atomic(files["--json"], report.to_json(doc))
    if files["--csv"]:
        write_atomic(files["--csv"], report.to_csv(doc["rows"]))
    if files["--plot"]:
        write_atomic(files["--plot"], report.to_svg(doc["rows"]))
