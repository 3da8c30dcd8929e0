"""A bench's run: load a session per mode, measure the cost curve thoroughly, sweep the rows (runner.py),
rewriting the files after each; then the recommendation and the files, whole."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from .. import signals, ui
from ..backend import neighbours
from ..drafting import cost as costmodel
from ..drafting import measure
from ..errors import UsageError
from ..outputs import write_atomic
from ..session import Session, open_session
from . import chart, report, runner
from .plan import Plan


def run(plan: Plan) -> tuple[dict, costmodel.Costs, bool]:
    """(the JSON document with its rows as far as they got, the cost curve, whether Ctrl-C or SIGTERM ended it;
    every finished row is kept)."""
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
        curves = {mode: _curve(plan, session, mode) for mode, session in sessions.items()}
        doc = {
            "machine": {**report.machine(), "threads": cfg.threads},
            "models": {
                "target": str(cfg.target),
                "draft": str(cfg.draft) if cfg.draft else None,
                "target_on": first.where,
            },
            "cost_curve": report.cost_curve(curves[modes[0]]),
            **({"cost_curve_exact": report.cost_curve(curves[True])} if len(modes) > 1 else {}),
            "settings": {**plan.settings, "ctx_size": first.target_ctx.n_ctx},
            "rows": [],
        }
        write(doc, plan.files)
        before = neighbours.sample()  # (what other programs take while the rows run: finish says it)
        view = ui.BenchView(runner.generations(plan.configs, plan.prompts, plan.settings["runs"]))
        try:
            with view:
                sweep = runner.sweep(
                    sessions,
                    plan.prompts,
                    plan.configs,
                    runs=plan.settings["runs"],
                    seed=plan.settings["seed"],
                    tick=view.tick,
                    notice=_once(ui.warning),
                )
                for result in sweep:
                    new = report.rows_for(result, plan.prompts, curves[result.config.exact])
                    doc["rows"] += new
                    doc["machine"]["other_programs_cores"] = _others(before)
                    write(doc, plan.files)
                    view.add(new)
        except signals.INTERRUPTS:
            return doc, curves[modes[0]], True
    return doc, curves[modes[0]], False


def _others(before: neighbours.Sample | None) -> float | None:
    others = neighbours.others(before, neighbours.sample())
    return round(others, 2) if others is not None else None


def finish(plan: Plan, doc: dict, curve: costmodel.Costs, interrupted: bool) -> None:
    """The recommendation, then the files and the tables, written whole (a signal now waits for them)."""
    cfg, rows = plan.cfg, doc["rows"]
    with signals.held():
        doc["recommendation"] = report.recommendation(rows, curve) if rows else "interrupted before any row finished"
        doc["interrupted"] = interrupted
        write(doc, plan.files)
        machine = doc["machine"]
        header = (
            f"specdec bench: {cfg.target.name}"
            + (f" <- {cfg.draft.name}" if cfg.draft else "")
            + (f" (target on {doc['models']['target_on']})" if cfg.rpc else "")
            + f", {len(plan.prompts)} prompts, {plan.settings['max_tokens']} tokens each, {cfg.threads} thread{'s' if cfg.threads > 1 else ''}, "
            + f"{machine['cpu']} ({machine['cpu_features']})"
        )
        ui.show_bench(rows, doc["cost_curve"], doc["recommendation"], header, doc.get("cost_curve_exact"))
        others = machine.get("other_programs_cores")
        if measure.shared(others, cfg.threads):
            ui.warning(
                f"other programs took {others:.1f} of this machine's CPUs while the rows ran at -t {cfg.threads}: these "
                "timings are of a shared machine; rerun on an idle one (or with fewer threads) before deciding by them"
            )
        if interrupted:
            json_file = plan.files["--json"]
            ui.note("interrupted: every finished row is kept" + (f" in {json_file}" if json_file else ""))


def _curve(plan: Plan, session: Session, exact: bool) -> costmodel.Costs:
    """The cost curve, thoroughly: the predictions' and auto's starting point."""
    draft = plan.cfg.draft
    ui.note(
        f"measuring the cost curve of {plan.cfg.target.name}"
        + (f" and {draft.name}" if draft else "")
        + (" (exact mode)" if exact else "")
    )
    tokens = session.prompt_tokens(plan.prompts[0].text)
    ctx = session.draft_context() if session.has_draft else None
    curve = measure.measure(session.target_ctx, ctx, tokens, plan.curve_max, thorough=True)
    return session.costs(tokens, measured=curve)  # auto starts from this measurement: the predictions' one


def _once(say: Callable[[str], None]) -> Callable[[str], None]:
    """`say`, for each distinct message once (every generation of a sweep would repeat it)."""
    said: set[str] = set()

    def once(message: str) -> None:
        if message not in said:
            said.add(message)
            say(message)

    return once


def write(doc: dict, files: dict[str, Path | None]) -> None:
    if files["--json"]:
        write_atomic(files["--json"], report.to_json(doc))
    if files["--csv"]:
        write_atomic(files["--csv"], report.to_csv(doc["rows"]))
    if files["--plot"]:
        write_atomic(files["--plot"], chart.to_svg(doc))
