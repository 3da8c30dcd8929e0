"""`specdec bench`: sweep drafters, draft lengths and temperatures; measure, predict, recommend."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer

from . import config, options, signals, ui
from .cli_common import model_location, run_config
from .bench import report, runner, suite
from .drafting import cost as costmodel
from .errors import UsageError
from .outputs import output_path, write_atomic
from .options import DRAFTERS
from .session import open_session

T = TypeVar("T")
EXACT_MODES = {"off": (False,), "on": (True,), "both": (False, True)}  # bench --exact

# --- bench's defaults, one per line (its own: lists to sweep, shorter answers) ----------------------
BENCH_DRAFT_TOKENS = "2,3,4"  # fixed lengths for model and lookup around llama.cpp's 3; add 8,15 or auto to see more
BENCH_BRANCHES = "1"  # chains only; 1,2,3 adds tree-drafting rows for the draft model and auto
BENCH_TEMPS = "0"  # greedy: the speed-up question without sampling noise; add 0.7 to see sampling
BENCH_MAX_TOKENS = 64  # long enough for steady state, short enough that 21 prompts take a minute per pass
BENCH_SEED = 0  # sampled rows use seed + prompt index: reproducible by default
RUNS = 1  # median of R per prompt; raise it on a noisy machine


def _draft_length(value: str) -> int | None:
    return None if value.lower() == "auto" else int(value)


def _parse_list(value: str, cast: Callable[[str], T], option: str) -> list[T]:
    try:
        items = [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option}: cannot read {value!r} as a comma-separated list") from None
    if not items:
        raise UsageError(f"{option} is empty")
    return list(dict.fromkeys(items))  # keep order, drop repeats


@options.with_options(
    "target", "draft", "threads", "ctx_size", "rpc", "lookup_cache"
)  # as for generate, one row of settings each
def bench(
    pair: Optional[str] = typer.Option(None, "--pair", help="A named pair from the config (default: 'default')."),
    config_path: Optional[Path] = typer.Option(None, "--config", help="Config file with named pairs."),
    drafters: Optional[str] = typer.Option(
        None, "--drafters", help="Comma list of none,model,lookup,auto (all of them; model only with a draft)."
    ),
    draft_tokens: str = typer.Option(
        BENCH_DRAFT_TOKENS,
        "--draft-tokens",
        help="Comma list of draft lengths k for model and lookup ('auto' too); auto chooses its own.",
    ),
    branches: str = typer.Option(
        BENCH_BRANCHES,
        "--branches",
        help="Comma list of branch counts for the draft model and auto rows (tree drafting, e.g. 1,2,3).",
    ),
    temps: str = typer.Option(BENCH_TEMPS, "--temps", help="Comma list of temperatures (0 = greedy)."),
    exact: Optional[str] = typer.Option(
        None,
        "--exact",
        help="Exact mode for the rows: on, off, or both (side by side: exact rows get a 'vs fast' column, "
        "their speed against fast target-only) [the config's exact, else off].",
    ),
    prompts: str = typer.Option(
        suite.SUITE_NAME, "--prompts", help="The built-in suite, or a JSONL / plain-text file."
    ),
    categories: Optional[str] = typer.Option(
        None, "--categories", help=f"Comma list of categories ({','.join(suite.CATEGORIES)})."
    ),
    max_tokens: int = typer.Option(BENCH_MAX_TOKENS, "-n", "--max-tokens", help="Tokens generated per prompt."),
    runs: int = typer.Option(RUNS, "--runs", help="Runs per prompt and configuration (median), after one warm-up."),
    seed: int = typer.Option(BENCH_SEED, "--seed", help="Base seed for sampled rows (prompt i uses seed + i)."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write the results as JSON (after every row)."),
    csv_file: Optional[Path] = typer.Option(None, "--csv", help="Write one CSV row per configuration and category."),
    plot_file: Optional[Path] = typer.Option(None, "--plot", help="Write an SVG chart of speed-up vs draft length."),
    **settings_given: Any,
) -> None:
    """Measure what pays on this machine: speed-up, acceptance and the cost model, per configuration."""
    ks = _parse_list(draft_tokens, _draft_length, "--draft-tokens")
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
        if plot_file is None or plot_file.suffix.lower() == ".svg"
        else "--plot writes SVG: give a file ending in .svg",
    ]
    for message in problems:
        if message:
            raise UsageError(message)
    prompt_list = suite.load(prompts, cats)

    cfg_file = config.config_file(config_path)
    settings = config.resolve(options.given(settings_given), pair, cfg_file)
    has_draft = bool(settings.get("draft"))
    names = (
        _parse_list(drafters, str, "--drafters")
        if drafters
        else ["none"] + (["model"] if has_draft else []) + ["lookup", "auto"]
    )
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
    # One session serves every row: load the draft if a row may use it; rows pick their drafter.
    uses_model = has_draft and bool({"model", "auto"} & set(names))
    speculates = set(names) != {"none"}
    drafter = options.default_drafter(uses_model) if uses_model or not speculates else "lookup"
    # Before any model loads, or is assembled: a bad output path should cost nothing, and must never
    # destroy an input (the draft as given counts, whether or not a row loads it).
    inputs = {
        "--prompts": None if prompts == suite.SUITE_NAME else Path(prompts),
        "the config file": cfg_file, "the target model": model_location(settings["target"]),
        "the draft model": model_location(settings["draft"]) if settings.get("draft") else None,
    }  # fmt: skip
    json_file, csv_file, plot_file = _outputs({"--json": json_file, "--csv": csv_file, "--plot": plot_file}, inputs)
    cfg = run_config({**settings, "drafter": drafter, "max_tokens": max_tokens}, debug=False)
    modes = EXACT_MODES[exact] if exact else (cfg.exact,)
    configs = runner.plan(names, ks, temp_list, branch_list, modes)
    curve_max = max([costmodel.CURVE_MAX] + [k + 1 for k in ks if k is not None])
    longest = None if None in ks or "auto" in names else max(ks)  # a recurrent target's snapshots (Session)
    need = costmodel.CONTEXT + curve_max
    why = f"the cost curve decodes {curve_max} tokens after {costmodel.CONTEXT} of context"
    if cfg.ctx_size is not None and cfg.ctx_size < need:
        raise UsageError(f"-c/--ctx-size must be at least {need} for bench (got {cfg.ctx_size}): {why}")
    rows: list[dict] = []
    interrupted = False
    with ExitStack() as stack:
        sessions = {mode: stack.enter_context(open_session(replace(cfg, exact=mode), longest)) for mode in modes}
        n_ctx = sessions[modes[0]].target_ctx.n_ctx
        sessions[modes[0]].check_branches(max(branch_list))  # trees on a recurrent model: refused before any row
        if n_ctx < need:  # fitted to a target trained for fewer tokens
            raise UsageError(
                f"bench needs a context of at least {need} tokens, and {cfg.target.name} has {n_ctx}: {why}"
            )
        for message in {m for s in sessions.values() for m in s.warnings}:
            ui.warning(message)
        curves = {}
        for mode, session in sessions.items():
            ui.note(
                f"measuring the cost curve of {cfg.target.name}" + (f" and {cfg.draft.name}" if cfg.draft else "")
                + (" (exact mode)" if mode else "")
            )  # fmt: skip
            tokens = session.prompt_tokens(prompt_list[0].text)
            curves[mode] = costmodel.measure(session.target_ctx, session.draft_ctx, tokens, curve_max, thorough=True)
            session.costs(tokens, measured=curves[mode])  # auto starts from this measurement: the predictions' one
        curve = curves[modes[0]]
        doc = {
            "machine": {**report.machine(), "threads": cfg.threads},
            "models": {"target": str(cfg.target), "draft": str(cfg.draft) if cfg.draft else None,
                       "target_on": sessions[modes[0]].where},
            "cost_curve": report.cost_curve(curve),
            **({"cost_curve_exact": report.cost_curve(curves[True])} if len(modes) > 1 else {}),
            "settings": {"max_tokens": max_tokens, "runs": runs, "seed": seed, "ctx_size": n_ctx, "prompts": prompts,
                         "categories": sorted({p.category for p in prompt_list}), "prompt_count": len(prompt_list),
                         "exact": list(modes)},
            "rows": rows,
        }  # fmt: skip
        _write(doc, json_file, csv_file, plot_file)
        view = ui.BenchView(runner.generations(configs, prompt_list, runs))
        try:
            with view:
                for result in runner.sweep(
                    sessions, prompt_list, configs, max_tokens=max_tokens, runs=runs, seed=seed,
                    sampler=cfg.sampler, tick=view.tick, notice=_once(ui.warning),
                ):  # fmt: skip
                    new = report.rows_for(result, prompt_list, curves[result.config.exact])
                    rows += new
                    _write(doc, json_file, csv_file, plot_file)
                    view.add(new)
        except signals.INTERRUPTS:
            interrupted = True
    with signals.held():  # the files and the tables are written whole
        doc["recommendation"] = report.recommendation(rows, curve) if rows else "interrupted before any row finished"
        doc["interrupted"] = interrupted
        _write(doc, json_file, csv_file, plot_file)
        header = (
            f"specdec bench: {cfg.target.name}" + (f" <- {cfg.draft.name}" if cfg.draft else "")
            + (f" (target on {sessions[modes[0]].where})" if cfg.rpc else "")
            + f", {len(prompt_list)} prompts, {max_tokens} tokens each, {cfg.threads} threads, {doc['machine']['cpu']}"
            + f" ({doc['machine']['cpu_features']})"
        )  # fmt: skip
        ui.show_bench(rows, doc["cost_curve"], doc["recommendation"], header, doc.get("cost_curve_exact"))
        if interrupted:
            ui.note("interrupted: every finished row is kept" + (f" in {json_file}" if json_file else ""))
    if interrupted:
        raise typer.Exit(signals.exit_code())


def _outputs(files: dict[str, Path | None], inputs: dict[str, Path | None]) -> list[Path | None]:
    """Each output's file (symlinks resolved), checked in order: none is an input or an earlier output."""
    checked: dict[str, Path] = {}
    for option, given in files.items():
        if given is not None:
            checked[option] = output_path(given, option, {**inputs, **checked})
    return [checked.get(option) for option in files]


def _once(say: Callable[[str], None]) -> Callable[[str], None]:
    """`say`, for each distinct message once (every generation of a sweep would repeat it)."""
    said: set[str] = set()

    def once(message: str) -> None:
        if message not in said:
            said.add(message)
            say(message)

    return once


def _write(doc: dict, json_file: Path | None, csv_file: Path | None, plot_file: Path | None) -> None:
    if json_file:
        write_atomic(json_file, report.to_json(doc))
    if csv_file:
        write_atomic(csv_file, report.to_csv(doc["rows"]))
    if plot_file:
        write_atomic(plot_file, report.to_svg(doc["rows"]))
