"""`specdec batch`: a file of requests (OpenAI's Batch format) answered by one loaded pair, each result
appended as it finishes; the same command again resumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from .. import config, options, signals, ui
from ..batch import requests as batch_requests
from ..batch.results import Results
from ..batch.runner import Tally, run
from ..errors import SpecdecError
from ..outputs import output_path
from ..serve.service import Service
from .common import CONFIG, PAIR, model_names, opened, resolve


class SomeFailed(SpecdecError):
    """The batch ran to its end and some requests have error results: exit 3, apart from not running (1, 2)."""

    exit_code = 3


@options.with_options(*options.BY_KEY)  # every run option: the defaults a request's body may change
def batch(
    requests: Path = typer.Argument(..., help='JSONL: OpenAI Batch lines, or {"prompt"} / {"messages"} lines.'),
    output: Path = typer.Option(..., "-o", "--output", help="Results JSONL, appended to; run again to resume."),
    pair: Optional[str] = PAIR,
    config_path: Optional[Path] = CONFIG,
    debug: bool = typer.Option(False, "--debug", help="Check the KV caches after every round; show tracebacks."),
    **given: Any,
) -> None:
    """Answer every request of a file with one model load; results are kept as they finish."""
    cfg = resolve(given, pair, config_path, debug=debug)
    inputs = {
        "REQUESTS": requests,
        "the config file": config.config_file(config_path),
        "the target model": cfg.target,
        "the draft model": cfg.draft,
    }
    out = output_path(output, "-o", inputs)  # before anything is read or loaded: a bad path costs nothing
    lines = batch_requests.read(requests)
    with Results(out, str(output)) as results:
        tally = _earlier(lines, results)
        if tally.earlier < tally.total:
            # The draft model is loaded if and when a request drafts with it.
            with opened(cfg, costs=True, lazy_draft=True) as session:
                title = "specdec batch · " + ui.label(
                    session.drafter, cfg.draft_tokens, cfg.branches, k_for_auto=True, exact=cfg.exact
                )
                speedup = _answer(Service(session, *model_names(cfg), 0), lines, results, tally)
        else:
            title, speedup = "specdec batch", None
    with signals.held():
        ui.batch_summary(tally, speedup, str(output), title)
    if tally.interrupted:
        raise typer.Exit(signals.exit_code())
    failed = len(tally.failed) + tally.earlier_failed
    if failed:
        raise SomeFailed(
            f"{failed} of {tally.total} requests failed: their results in {output} carry the error",
            hint="fix those lines, remove their results from the file, and run the same command again",
        )


def _answer(service: Service, lines: list[batch_requests.Line], results: Results, tally: Tally) -> float | None:
    """Run the batch with its progress view; the speed-up over plain decoding as auto measured it."""
    curve = service.session.curve

    def plain() -> float | None:
        return curve.costs.plain if curve.costs is not None else None

    with ui.BatchView(tally.total - tally.earlier) as view:
        run(lines, results, service, lambda line, status, body: view.add(line, status, body, tally, plain()), tally)
    return tally.speedup(plain())


def _earlier(lines: list[batch_requests.Line], results: Results) -> Tally:
    """The tally before this run: what the results file already holds of these requests."""
    mine = {line.custom_id for line in lines}
    earlier = {cid: status for cid, status in results.done.items() if cid in mine}
    foreign = len(results.done) - len(earlier)
    if results.dropped:
        ui.note(f"{results.shown}: dropped a cut last line (a run stopped while writing it); its request runs again")
    if foreign:
        ui.warning(
            f"{results.shown} holds {foreign} result(s) for custom_ids that {len(lines)} requests do not "
            "have (another batch's results?); appending to it"
        )
    if earlier:
        ui.note(f"resuming: {len(earlier)} of {len(lines)} requests have results in {results.shown}")
    return Tally(len(lines), len(earlier), sum(status != 200 for status in earlier.values()))
