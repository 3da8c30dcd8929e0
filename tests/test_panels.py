"""What a person reads: the statistics panel, the token stream's colours, bench's table, recommendation and chart.
Pure data in, text out: no model runs."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from specdec_cli import ui
from specdec_cli.bench import chart, report
from specdec_cli.drafting.cost import Costs
from specdec_cli.engine.events import Origin, Round
from specdec_cli.engine.stats import Stats
from specdec_cli.ui.bench import _bench_table, _cells, show_bench


def _stats(*rounds: Round) -> Stats:
    stats = Stats(prompt_tokens=4, generated_tokens=10, stop_reason="eos")
    for r in rounds:
        stats.add(r)
    return stats


def _round(drafted: int, accepted: int, drafter: str = "lookup", **kw) -> Round:
    return Round(
        drafted=drafted, accepted=accepted, emitted=accepted + 1, draft_seconds=0.0, verify_seconds=0.01,
        seconds=0.02, drafter=drafter, k=drafted, rejected=accepted < drafted, **kw,
    )  # fmt: skip


def test_per_position_counts_only_the_rounds_that_drafted_that_far():
    """auto drafts 1 token in one round and 4 in another, all accepted: every position is 100%, not a falling
    share of all drafting rounds (which read as rejections)."""
    stats = _stats(_round(1, 1), _round(4, 4))
    row = dict(ui.stat_rows(stats))["per position"]
    assert row == "100% 100% 100% 100%"
    many = dict(ui.stat_rows(_stats(_round(14, 3))))["per position"]
    assert many.count("%") == ui.POSITIONS_SHOWN and "(14 in all)" in many


def test_the_panel_shows_what_was_asked_and_a_predicted_line_against_the_target_alone():
    stats = _stats(_round(3, 2), _round(0, 0, "none"))
    rows = dict(ui.stat_rows(stats, ui.Asked("auto", None, plain_seconds=0.02)))
    assert rows["asked"] == "--drafter auto, -k auto (chosen each round)"
    ratio = stats.tokens_per_second * 0.02
    assert rows["vs target alone"].startswith(f"{ratio:.2f}x, predicted")
    alone = dict(ui.stat_rows(stats, ui.Asked("none", None, plain_seconds=0.02)))
    assert alone["asked"] == "--drafter none" and "vs target alone" not in alone  # it is the target alone
    unknown = dict(ui.stat_rows(stats, ui.Asked("model", 3)))  # no cost curve: nothing to predict from
    assert unknown["asked"] == "--drafter model, -k 3" and "vs target alone" not in unknown


def test_a_run_with_plain_rounds_enough_compares_with_them_not_with_the_curves_t1():
    """t(1) leaves out the loop's own work per token (sampling, the events): a run of mostly plain rounds read ~5%
    below 1.00x against it. Its own plain rounds are the target alone as it ran."""
    plain = [Round(drafted=0, accepted=0, emitted=1, draft_seconds=0.0, verify_seconds=0.02, seconds=0.025)] * 9
    stats = _stats(_round(3, 3), *plain)  # 4 + 9 tokens in 0.02 + 9 * 0.025 s
    row = dict(ui.stat_rows(stats, ui.Asked("auto", None, plain_seconds=0.02)))["vs target alone"]
    assert (
        row
        == f"{stats.tokens_per_second * 0.025:.2f}x, against this run's 9 plain rounds (target alone: 25.0 ms a token here)"
    )
    few = dict(ui.stat_rows(_stats(_round(3, 3), *plain[:7]), ui.Asked("auto", None, plain_seconds=0.02)))
    assert few["vs target alone"].endswith("predicted (target alone: 20.0 ms a token here)")


def test_a_branches_line_without_branches_says_it_is_autos_lookup_trees():
    stats = _stats(_round(3, 2, "auto", branches=2, winner=1))
    asked_one = dict(ui.stat_rows(stats, ui.Asked("auto", None)))["branches"]
    assert "auto's lookup trees" in asked_one
    assert "auto's lookup trees" not in dict(ui.stat_rows(stats, ui.Asked("auto", None, branches=2)))["branches"]


def test_corrections_are_not_coloured_as_errors():
    assert "red" not in ui.STYLES[Origin.CORRECTION] and "bold" not in " ".join(ui.STYLES.values())
    assert ui.STYLES[Origin.CORRECTION] == ui.STYLES[Origin.PLAIN]  # the target's own token, either way


@pytest.mark.parametrize("drafter, shown", [("none", False), ("auto", True), ("lookup", True)])
def test_the_legend_is_printed_only_where_something_drafts(capsys, drafter, shown):
    ui.TokenStream(True, drafter).start()
    assert ("legend:" in capsys.readouterr().err) == shown


# --- bench ---------------------------------------------------------------------------------------


def _row(drafter, k, speedup, low=None, high=None, runs=None, **kw) -> dict:
    """A bench row as report.rows_for makes it; without low/high the band is the assumed one (--runs 1)."""
    plain = drafter == "none"
    band = (
        {"speedup_low": 1.0, "speedup_high": 1.0, "noise": "none"}
        if plain
        else {"speedup_low": low, "speedup_high": high, "noise": f"{runs} repeats"}
        if low is not None
        else {
            "speedup_low": speedup / 1.03,  # report.ASSUMED_NOISE
            "speedup_high": speedup * 1.03,
            "noise": "assumed",
        }
    )
    return {
        "drafter": drafter, "draft_tokens": k, "branches": 1, "temp": 0.0, "category": "all", "speedup": speedup,
        "generation_speedup": speedup * 1.05, "ttft_ratio": 0.98, "tokens_per_second": 44.9,
        "predicted_speedup": None if k == "auto" else 1.1, "model_gap": False, "accept_rate": 0.62,
        "mean_accepted": 1.85, "per_position_accept": [0.9, 0.7, 0.5, 0.4] * 3, "draft_share": 0.02,
        "verify_share": 0.93, "identical_to_baseline": 1.0, "exact": False, "speedup_vs_fast": None, **band, **kw,
    }  # fmt: skip


def _many_rows() -> list[dict]:
    rows = [_row("none", 0, 1.0)]
    rows += [_row("lookup", k, 1.0 + k / 50) for k in (2, 3, 4, 8)]
    rows += [_row("model", k, 0.6 + k / 20, branches=b) for k in (2, 4) for b in (1, 3)]
    rows += [_row("auto", "auto", 1.12), _row("model", 3, 0.8, exact=True, speedup_vs_fast=0.7)]
    return rows


@pytest.mark.parametrize("width", [80, 120])
def test_the_bench_table_fits_the_terminal_a_line_a_setting(width):
    rows = _many_rows()
    console = Console(width=width, record=True, force_terminal=True)
    console.print(_bench_table(rows, console))
    text = console.export_text()
    assert "…" not in text
    assert all(len(line.rstrip()) <= width for line in text.splitlines())
    body = [line for line in text.splitlines() if line.strip() and not line.strip().startswith("─")]
    settings = [line for line in body if line.split()[0] in ("none", "lookup", "model", "auto")]
    assert len(settings) == len(rows)  # each setting on one line: none folded onto a second
    assert "x" in body[0].split() and "noise" in body[0].split()  # the speed-up and its band, at any width


def test_a_speed_up_is_coloured_only_beyond_its_noise_band():
    def style(row: dict) -> str:
        return str(_cells(row, False)[1].style)

    assert style(_row("lookup", 3, 1.01)) == ""  # +-3% assumed: 1.01x may be 0.98x
    assert style(_row("lookup", 3, 0.99)) == ""
    assert "green" in style(_row("lookup", 3, 1.08))
    assert "red" in style(_row("lookup", 3, 0.9))
    assert "green" in style(_row("lookup", 3, 1.02, low=1.01, high=1.03, runs=3))  # measured: narrower


CURVE = Costs({n: 0.03 * (1 + 0.05 * (n - 1)) for n in range(1, 17)}, draft=0.003)


def test_the_recommendation_says_when_the_top_settings_are_within_noise():
    """1.04x and 1.01x, one run each: their bands overlap, and the next run may order them the other way."""
    rows = [_row("none", 0, 1.0), _row("lookup", 3, 1.04), _row("lookup", 4, 1.01)]
    text = report.recommendation(rows, CURVE)
    assert "within noise" in text.lower() and "--drafter lookup -k 4 (1.01x)" in text
    apart = [_row("none", 0, 1.0), _row("lookup", 3, 1.3, 1.25, 1.35, 3), _row("lookup", 4, 1.1, 1.05, 1.15, 3)]
    assert "within noise" not in report.recommendation(apart, CURVE).lower()


def test_a_best_setting_within_noise_of_the_target_alone_does_not_pay():
    text = report.recommendation([_row("none", 0, 1.0), _row("lookup", 3, 1.02)], CURVE)
    assert text.startswith("Speculation does not pay here") and "within noise of target-only" in text


def test_show_bench_fits_80_columns(capsys):
    console = Console(width=80, record=True)
    curve = report.cost_curve(CURVE)
    show_bench(_many_rows(), curve, report.recommendation(_many_rows(), CURVE), "specdec bench: header", out=console)
    text = console.export_text()
    assert "…" not in text and all(len(line.rstrip()) <= 80 for line in text.splitlines())


def test_the_chart_plots_speed_up_per_setting_with_its_noise_band():
    doc = {
        "models": {"target": "/m/qwen2.5-coder-1.5b.gguf", "draft": "/m/qwen2.5-coder-0.5b.gguf"},
        "machine": {"cpu": "AMD EPYC", "threads": 2},
        "settings": {"prompt_count": 6, "max_tokens": 64, "runs": 3},
        "rows": [_row("none", 0, 1.0), _row("lookup", 3, 1.2, 1.1, 1.3, 3), _row("auto", "auto", 0.9, 0.85, 0.95, 3)],
    }
    svg = ET.fromstring(chart.to_svg(doc))
    texts = [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert any("qwen2.5-coder-1.5b.gguf" in t and "qwen2.5-coder-0.5b.gguf" in t for t in texts)  # the title
    assert any("AMD EPYC" in t and "2 threads" in t for t in texts)  # the machine
    assert "speed-up vs target alone (wall time)" in texts  # the y axis's label
    ticks = [t for t in texts if t.endswith("x") and t[:-1].replace(".", "").isdigit()]
    assert {"1.00x", "1.20x"} <= set(ticks)  # ticks at round steps, 1.00x among them
    assert any("lookup -k 3" in t for t in texts) and any(t == "auto" for t in texts)  # a bar per setting
    whiskers = [e for e in svg.iter("{http://www.w3.org/2000/svg}line") if e.get("stroke") == "black"]
    assert len(whiskers) >= 2 * 3  # per setting: the band and its two ends
