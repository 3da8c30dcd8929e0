"""`specdec bench`: sweep drafters, draft lengths and temperatures; measure, predict, recommend."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional, TypeVar

import typer

from . import config, signals, ui
from .cli_common import model_location, run_config
from .bench import costs, report, runner, suite
from .errors import UsageError
from .outputs import output_path, write_atomic
from .session import CTX_SIZE, DRAFTERS, MAX_BRANCHES, MAX_DRAFT_TOKENS, open_session

T = TypeVar("T")

# --- defaults, one per line ---------------------------------------------------------------------
DRAFT_TOKENS = "2,3,4"  # fixed lengths for model and lookup around llama.cpp's 3; add 8,15 or auto to see more
BRANCHES = "1"  # chains only; 1,2,3 adds tree-drafting rows for the draft model and auto
TEMPS = "0"  # greedy: the speed-up question without sampling noise; add 0.7 to see sampling
MAX_TOKENS = 64  # long enough for steady state, short enough that 21 prompts take a minute per pass
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


def bench(
    target: Optional[str] = typer.Option(None, "--target", help="Target GGUF (a path or a known model name)."),
    draft: Optional[str] = typer.Option(None, "--draft", help="Draft GGUF with the same tokenizer."),
    pair: Optional[str] = typer.Option(None, "--pair", help="A named pair from the config (default: 'default')."),
    config_path: Optional[Path] = typer.Option(None, "--config", help="Config file with named pairs."),
    drafters: Optional[str] = typer.Option(
        None, "--drafters", help="Comma list of none,model,lookup,auto [all of them; model only with a draft]."
    ),
    draft_tokens: str = typer.Option(
        DRAFT_TOKENS, "--draft-tokens", help="Comma list of draft lengths k for model and lookup ('auto' too); auto chooses its own."
    ),
    branches: str = typer.Option(
        BRANCHES, "--branches", help="Comma list of branch counts for the draft model and auto rows (tree drafting, e.g. 1,2,3)."
    ),
    temps: str = typer.Option(TEMPS, "--temps", help="Comma list of temperatures (0 = greedy)."),
    prompts: str = typer.Option(suite.SUITE_NAME, "--prompts", help="The built-in suite, or a JSONL / plain-text file."),
    categories: Optional[str] = typer.Option(None, "--categories", help=f"Comma list of categories [{','.join(suite.CATEGORIES)}]."),
    max_tokens: int = typer.Option(MAX_TOKENS, "-n", "--max-tokens", help="Tokens generated per prompt."),
    runs: int = typer.Option(RUNS, "--runs", help="Runs per prompt and configuration (median), after one warm-up."),
    threads: int = typer.Option(0, "-t", "--threads", help="CPU threads; 0 means every core this process may use."),
    seed: int = typer.Option(0, "--seed", help="Base seed for sampled rows (prompt i uses seed + i)."),
    ctx_size: Optional[int] = typer.Option(None, "-c", "--ctx-size", help=f"Context size in tokens [{CTX_SIZE}]."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write the results as JSON (after every row)."),
    csv_file: Optional[Path] = typer.Option(None, "--csv", help="Write one CSV row per configuration and category."),
    plot_file: Optional[Path] = typer.Option(None, "--plot", help="Write an SVG chart of speed-up vs draft length."),
) -> None:
    """Measure what pays on this machine: speed-up, acceptance and the cost model, per configuration."""
    ks = _parse_list(draft_tokens, _draft_length, "--draft-tokens")
    temp_list = _parse_list(temps, float, "--temps")
    branch_list = _parse_list(branches, int, "--branches")
    cats = _parse_list(categories, str, "--categories") if categories else None
    checks = [
        (all(k is None or 1 <= k <= MAX_DRAFT_TOKENS for k in ks), f"--draft-tokens must be between 1 and {MAX_DRAFT_TOKENS}, or auto"),
        (all(math.isfinite(t) for t in temp_list), "--temps must be finite numbers"),
        (all(t >= 0 for t in temp_list), "--temps must be >= 0"),
        (all(1 <= b <= MAX_BRANCHES for b in branch_list), f"--branches must be between 1 and {MAX_BRANCHES}"),
        (runs >= 1, f"--runs must be at least 1 (got {runs})"),
        (max_tokens >= 1, f"-n/--max-tokens must be at least 1 (got {max_tokens})"),
        (seed >= 0, f"--seed must be >= 0 (got {seed})"),
        (plot_file is None or plot_file.suffix.lower() == ".svg", "--plot writes SVG: give a file ending in .svg"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    prompt_list = suite.load(prompts, cats)

    cfg_file = config.config_file(config_path)
    settings = config.resolve(dict(target=target, draft=draft, ctx_size=ctx_size), pair, cfg_file)
    has_draft = bool(settings.get("draft"))
    names = _parse_list(drafters, str, "--drafters") if drafters else ["none"] + (["model"] if has_draft else []) + ["lookup", "auto"]
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
    settings = {**settings, "drafter": "auto" if uses_model else ("lookup" if speculates else "none"), "max_tokens": max_tokens}
    cfg = run_config(settings, threads=threads, debug=False)
    configs = runner.plan(names, ks, temp_list, branch_list)
    curve_max = max([costs.CURVE_MAX] + [k + 1 for k in ks if k is not None])
    if cfg.ctx_size < costs.CONTEXT + curve_max:
        raise UsageError(
            f"-c/--ctx-size must be at least {costs.CONTEXT + curve_max} for bench (got {cfg.ctx_size}): "
            f"the cost curve decodes {curve_max} tokens after {costs.CONTEXT} of context"
        )
    # Before any model loads: a bad output path should cost nothing, and must never destroy an input.
    inputs = {
        "--prompts": None if prompts == suite.SUITE_NAME else Path(prompts),
        "the config file": cfg_file, "the target model": cfg.target,
        # the draft as given, whether or not a row loads it: an input all the same
        "the draft model": cfg.draft or (model_location(settings["draft"]) if settings.get("draft") else None),
    }  # fmt: skip
    json_file, csv_file, plot_file = _outputs({"--json": json_file, "--csv": csv_file, "--plot": plot_file}, inputs)

    rows: list[dict] = []
    interrupted = False
    with open_session(cfg) as session:
        ui.note(f"measuring the cost curve of {cfg.target.name}" + (f" and {cfg.draft.name}" if cfg.draft else ""))
        curve = costs.measure(session.target_ctx, session.draft_ctx, session.prompt_tokens(prompt_list[0].text), curve_max)
        doc = {
            "machine": {**report.machine(), "threads": cfg.threads},
            "models": {"target": str(cfg.target), "draft": str(cfg.draft) if cfg.draft else None},
            "cost_curve": curve.as_dict(),
            "settings": {"max_tokens": max_tokens, "runs": runs, "seed": seed, "ctx_size": cfg.ctx_size, "prompts": prompts,
                         "categories": sorted({p.category for p in prompt_list}), "prompt_count": len(prompt_list)},
            "rows": rows,
        }  # fmt: skip
        _write(doc, json_file, csv_file, plot_file)
        view = ui.BenchView(runner.generations(configs, prompt_list, runs))
        try:
            with view:
                for result in runner.sweep(
                    session, prompt_list, configs, max_tokens=max_tokens, runs=runs, seed=seed,
                    sampler=cfg.sampler, tick=view.tick,
                ):  # fmt: skip
                    new = report.rows_for(result, prompt_list, curve)
                    rows += new
                    _write(doc, json_file, csv_file, plot_file)
                    view.add(new)
        except signals.INTERRUPTS:
            interrupted = True
    doc["recommendation"] = report.recommendation(rows, curve) if rows else "interrupted before any row finished"
    doc["interrupted"] = interrupted
    _write(doc, json_file, csv_file, plot_file)
    header = (
        f"specdec bench: {cfg.target.name}" + (f" <- {cfg.draft.name}" if cfg.draft else "")
        + f", {len(prompt_list)} prompts, {max_tokens} tokens each, {cfg.threads} threads, {doc['machine']['cpu']}"
    )  # fmt: skip
    ui.show_bench(rows, doc["cost_curve"], doc["recommendation"], header)
    if interrupted:
        ui.note("interrupted: every finished row is kept" + (f" in {json_file}" if json_file else ""))
        raise typer.Exit(signals.exit_code())


def _outputs(files: dict[str, Path | None], inputs: dict[str, Path | None]) -> list[Path | None]:
    """Each output's file (symlinks resolved), checked in order: none is an input or an earlier output."""
    checked: dict[str, Path] = {}
    for option, given in files.items():
        if given is not None:
            checked[option] = output_path(given, option, {**inputs, **checked})
    return [checked.get(option) for option in files]


def _write(doc: dict, json_file: Path | None, csv_file: Path | None, plot_file: Path | None) -> None:
    if json_file:
        write_atomic(json_file, report.to_json(doc))
    if csv_file:
        write_atomic(csv_file, report.to_csv(doc["rows"]))
    if plot_file:
        write_atomic(plot_file, report.to_svg(doc["rows"]))
