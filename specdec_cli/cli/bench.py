"""`specdec bench`: sweep drafters, draft lengths and temperatures; measure, predict, recommend.

Three steps, in bench/: `plan` reads and checks everything before a model loads (a bad option or output path
costs nothing), `run` loads the sessions, measures the cost curve and sweeps the rows (runner.py), rewriting
the files after each, and `finish` writes the files and tables whole at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from .. import config, options, signals
from ..declaration import DRAFTING, PROMPT, SAMPLING
from ..drafting import DRAFTERS
from ..bench import plan as bench_plan
from ..bench import run as bench_run
from ..bench import suite
from .common import CONFIG, PAIR, assemble

# --- bench's defaults, one per line (its own: lists to sweep, shorter answers) ----------------------
BENCH_DRAFT_TOKENS = "2,3,4"  # fixed lengths for model and lookup around llama.cpp's 3; add 8,15 or auto to see more
BENCH_BRANCHES = "1"  # chains only; 1,2,3 adds tree-drafting rows for the draft model and auto
BENCH_TEMPS = "0"  # greedy: the speed-up question without sampling noise; add 0.7 to see sampling
BENCH_MAX_TOKENS = 64  # long enough for steady state, short enough that 21 prompts take a minute per pass
BENCH_SEED = 0  # sampled rows use seed + prompt index: reproducible by default
RUNS = 1  # median of R per prompt; raise it on a noisy machine

DRAFTERS_OPTION = typer.Option(
    None,
    "--drafters",
    help=f"Comma list of {', '.join(DRAFTERS)} (all of them; those that need a draft model only with one).",
    rich_help_panel=DRAFTING,
)
DRAFT_TOKENS_OPTION = typer.Option(
    BENCH_DRAFT_TOKENS,
    "--draft-tokens",
    help="Comma list of draft lengths k for model and lookup ('auto' too); auto chooses its own.",
    rich_help_panel=DRAFTING,
)
BRANCHES_OPTION = typer.Option(
    BENCH_BRANCHES,
    "--branches",
    help="Comma list of branch counts for the draft model and auto rows (tree drafting, e.g. 1,2,3).",
    rich_help_panel=DRAFTING,
)
EXACT_OPTION = typer.Option(
    None,
    "--exact",
    help="Exact mode for the rows: on, off, or both (side by side: exact rows get a 'vs fast' column, "
    "their speed against fast target-only) \\[the config's exact, else off].",
    rich_help_panel=DRAFTING,
)
PROMPTS_OPTION = typer.Option(
    suite.SUITE_NAME, "--prompts", help="The built-in suite, or a JSONL / plain-text file.", rich_help_panel=PROMPT
)
CATEGORIES_OPTION = typer.Option(
    None, "--categories", help=f"Comma list of categories ({', '.join(suite.CATEGORIES)}).", rich_help_panel=PROMPT
)


# a row's other settings, and where the models go
@options.with_options("target", "draft", "threads", "ctx_size", "rpc", "lookup_cache", *options.OFFLOAD)
def bench(
    pair: Optional[str] = PAIR,
    config_path: Optional[Path] = CONFIG,
    drafters: Optional[str] = DRAFTERS_OPTION,
    draft_tokens: str = DRAFT_TOKENS_OPTION,
    branches: str = BRANCHES_OPTION,
    temps: str = typer.Option(
        BENCH_TEMPS, "--temps", help="Comma list of temperatures (0 = greedy).", rich_help_panel=SAMPLING
    ),
    exact: Optional[str] = EXACT_OPTION,
    prompts: str = PROMPTS_OPTION,
    categories: Optional[str] = CATEGORIES_OPTION,
    max_tokens: int = typer.Option(
        BENCH_MAX_TOKENS, "-n", "--max-tokens", help="Tokens generated per prompt.", rich_help_panel=SAMPLING
    ),
    runs: int = typer.Option(RUNS, "--runs", help="Runs per prompt and configuration (median), after one warm-up."),
    seed: int = typer.Option(
        BENCH_SEED, "--seed", help="Base seed for sampled rows (prompt i uses seed + i).", rich_help_panel=SAMPLING
    ),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write the results as JSON (after every row)."),
    csv_file: Optional[Path] = typer.Option(None, "--csv", help="Write one CSV row per configuration and category."),
    plot_file: Optional[Path] = typer.Option(None, "--plot", help="Write an SVG chart of speed-up vs draft length."),
    **given: Any,
) -> None:
    """Measure what pays on this machine: speed-up, acceptance and the cost model, per configuration."""
    cfg_file = config.config_file(config_path)
    cfg = config.resolve(given, pair, cfg_file)
    plan = bench_plan.plan(
        cfg,
        drafters=drafters,
        draft_tokens=draft_tokens,
        branches=branches,
        temps=temps,
        exact=exact,
        prompts=prompts,
        categories=categories,
        max_tokens=max_tokens,
        runs=runs,
        seed=seed,
        outputs={"--json": json_file, "--csv": csv_file, "--plot": plot_file},
        config_file=cfg_file,
    )
    assemble(plan.cfg)
    doc, curve, interrupted = bench_run.run(plan)
    bench_run.finish(plan, doc, curve, interrupted)
    if interrupted:
        raise typer.Exit(signals.exit_code())
