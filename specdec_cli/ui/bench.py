"""bench's views: the table filling in as rows finish, the final tables, the chart."""

from __future__ import annotations

import sys

from rich import box
from rich.console import Console, Group
from rich.measure import Measurement
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ..bench import report
from ..drafting import is_plain
from . import _err, label


# The main table's columns, most wanted first: at a narrow terminal the last are left out (the caption says which;
# every figure is in --json and --csv). Short headers, so that a row is one line; the caption says the units.
COLUMNS = [  # (header, justify, what the caption says of it)
    ("setting", "left", None),
    ("x", "right", "speed-up by wall time vs target alone (median)"),
    ("noise", "right", "{band}; green/red only beyond it"),
    ("gen", "right", "generation alone"),
    ("pred", "right", "the cost model's for gen (! >10% off)"),
    ("acc", "right", "accept rate"),
    ("mean", "right", "tokens per verification"),
    ("ttft", "right", "time to first token vs target alone's"),
    ("tok/s", "right", "generation"),
    ("same", "right", "greedy outputs identical to target alone's"),
    ("d/v", "right", "draft / verify shares of generation time"),
]
FAST = ("vs fast", "right", "an exact row vs fast target alone")


def _bench_table(rows: list[dict], console: Console, title: str | None = None) -> Table:
    """One row per setting ('all' prompts), one line each, as many columns as the console's width holds. A speed-up
    is coloured only where its noise band clears 1.0x (report.beyond_noise)."""
    rows = [r for r in rows if r["category"] == "all"]
    temps = len({r["temp"] for r in rows}) > 1
    columns = COLUMNS + ([FAST] if any(r.get("speedup_vs_fast") is not None for r in rows) else [])
    cells = [dict(zip((c[0] for c in columns), _cells(r, temps))) for r in rows]
    shown = list(columns)
    while True:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
        for name, justify, _ in shown:
            table.add_column(name, justify=justify, no_wrap=True)
        for row in cells:
            table.add_row(*(row[name] for name, _, _ in shown))
        if len(shown) <= 3 or _width(console, table) <= console.width:
            break
        shown.pop()
    table.caption = _caption(shown, [c for c in columns if c not in shown], rows, temps)
    table.caption_justify = "left"
    return table


def _width(console: Console, table: Table) -> int:
    """The width a table takes unfolded (measured as if the console were unbounded: Rich clamps to its width)."""
    return Measurement.get(console, console.options.update_width(10_000), table).maximum


def _caption(shown: list, left_out: list, rows: list[dict], temps: bool) -> str:
    said = [f"{name}: {what.format(band=report.noise_words(rows))}" for name, _, what in shown if what]
    out = "; ".join(said) + ("" if temps else f". temp {rows[0]['temp']:g}" if rows else "")
    return out + (f". Wider terminal or --json: {', '.join(c[0] for c in left_out)}" if left_out else "")


def _cells(r: dict, temps: bool) -> list:
    plain = is_plain(r["drafter"])
    style = {1: "bold green", -1: "red", 0: ""}[report.beyond_noise(r)]
    pred = "-" if r["predicted_speedup"] is None else f"{r['predicted_speedup']:.2f}x" + ("!" if r["model_gap"] else "")
    noise = "-" if plain else f"{report.band_low(r):.2f}-{report.band_high(r):.2f}"
    return [
        _label(r, k_for_auto=True) + (f" t={r['temp']:g}" if temps else ""),
        Text(f"{r['speedup']:.2f}x", style=style),
        noise,
        f"{r.get('generation_speedup', r['speedup']):.2f}x",
        pred,
        "-" if plain else f"{r['accept_rate']:.0%}",
        f"{r['mean_accepted']:.2f}",
        f"{r.get('ttft_ratio', 1.0):.2f}x",
        f"{r['tokens_per_second']:.1f}",
        "-" if r["identical_to_baseline"] is None else f"{r['identical_to_baseline']:.0%}",
        f"{r['draft_share']:.0%}/{r['verify_share']:.0%}",
        "-" if r.get("speedup_vs_fast") is None else f"{r['speedup_vs_fast']:.2f}x",
    ]


class BenchView:
    """While a bench runs: a progress bar with ETA and the table filling in, on stderr."""

    def __init__(self, total: int):
        self.rows: list[dict] = []
        self.live_mode = _err.is_terminal
        self._progress = Progress(
            TextColumn("bench"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("generations"),
            TimeRemainingColumn(),
            console=_err,
        )
        self._task = self._progress.add_task("bench", total=total)
        self._live = Live(console=_err, refresh_per_second=4, transient=True) if self.live_mode else None

    def __enter__(self) -> BenchView:
        if self._live:
            self._live.update(self._render())
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._live.stop()

    def _render(self):
        return Group(self._progress.get_renderable(), _bench_table(self.rows, _err))

    def tick(self) -> None:
        self._progress.advance(self._task)
        if self._live:
            self._live.update(self._render())

    def add(self, rows: list[dict]) -> None:
        self.rows += rows
        if self._live:
            self._live.update(self._render())
        else:
            r = rows[0]
            done = self._progress.tasks[0]
            print(
                f"[{int(done.completed)}/{int(done.total)}] {_label(r)} temp={r['temp']:g}: {r['speedup']:.2f}x by wall "
                f"time, {r['tokens_per_second']:.1f} tok/s generating",
                file=sys.stderr,
            )


def show_bench(
    rows: list[dict],
    curve_dict: dict,
    recommendation: str,
    header: str,
    exact_curve: dict | None = None,
    out: Console | None = None,
) -> None:
    # A file or a pipe gets the tables 120 columns wide: every column, whatever the terminal that ran it.
    out = out or Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    out.print(header)
    rel = curve_dict["target_relative"]
    c = curve_dict["c"]
    out.print(
        "cost curve: one target decode of n tokens costs, relative to n = 1 "
        f"({curve_dict['plain_seconds_per_token'] * 1000:.1f} ms, plain decoding):"
    )
    out.print("  " + "  ".join(f"{n}:{v:.2f}" for n, v in rel.items()))
    if exact_curve:
        out.print(f"  exact mode ({exact_curve['plain_seconds_per_token'] * 1000:.1f} ms, plain decoding):")
        out.print("  " + "  ".join(f"{n}:{v:.2f}" for n, v in exact_curve["target_relative"].items()))
    if c is not None:
        out.print(
            f"  draft: {curve_dict['draft_seconds_per_token'] * 1000:.1f} ms per token, c = t_draft / t_target(1) = {c:.2f}"
        )
    out.print(_bench_table(rows, out))
    categories = sorted({r["category"] for r in rows} - {"all"})
    if len(categories) > 1:
        out.print(_category_table(rows, categories, out))
    out.print(_chart(rows))
    gaps = [r for r in rows if r["category"] == "all" and r["model_gap"]]
    for r in gaps:
        out.print(
            f"note: {_label(r)} temp {r['temp']:g}: measured {r['speedup']:.2f}x but the cost "
            f"model predicts {r['predicted_speedup']:.2f}x (more than 10% apart: the machine was busy, acceptance "
            "is far from independent per token, or fixed per-round costs dominate, as with tiny models)",
            style="yellow",
        )
    out.print(Text(recommendation, style="bold"))


def _chart(rows: list[dict]) -> Text:
    """Each setting's speed-up by wall time against the target alone, one block per temperature: a bar from the
    1.00x mark ('│') to its speed-up, its noise band ('─') around it; coloured only beyond the band, as the table.
    The scale spans the settings' bands, so that 1.04x and 1.16x differ on it."""
    width = 40
    pts = [r for r in rows if r["category"] == "all" and not is_plain(r["drafter"])]
    if not pts:
        return Text("")
    lo = min([1.0] + [report.band_low(r) for r in pts])
    hi = max([1.0] + [report.band_high(r) for r in pts])
    col = lambda v: round((v - lo) / ((hi - lo) or 1.0) * (width - 1))  # noqa: E731
    text = Text(f"speed-up by wall time, {lo:.2f}x to {hi:.2f}x (│ = target alone, ─ = noise band)\n")
    for temp in sorted({r["temp"] for r in pts}):
        text.append(f"temp {temp:g}\n")
        order = lambda r: (r.get("exact", False), r["drafter"], str(r["draft_tokens"]).zfill(4), r.get("branches", 1))  # noqa: E731
        for r in sorted((r for r in pts if r["temp"] == temp), key=order):
            one, at = col(1.0), col(r["speedup"])
            low, high = col(report.band_low(r)), col(report.band_high(r))
            cells = ["─" if low <= i <= high else " " for i in range(width)]
            for i in range(min(one, at), max(one, at) + 1):
                cells[i] = "█"
            cells[one] = "│"  # the bar's foot, at 1.00x on every line
            text.append(f"  {_label(r, k_for_auto=True):<24}")
            text.append("".join(cells), style={1: "green", -1: "red", 0: ""}[report.beyond_noise(r)])
            text.append(f" {r['speedup']:.2f}x\n")
    return text


def _label(r: dict, k_for_auto: bool = False) -> str:
    """A bench row's configuration in words (the JSON rows of older runs have no "branches" or "exact")."""
    return label(r["drafter"], r["draft_tokens"], r.get("branches", 1), k_for_auto, r.get("exact", False))


def _category_table(rows: list[dict], categories: list[str], console: Console | None = None) -> Group:
    """Speed-up per configuration and category: a column per category, or, with many (a schema each), a row
    per category and a column per configuration; split into tables of fewer columns where the console is
    narrower than one."""
    configs: list[tuple[str, float]] = []
    for r in rows:
        if (_label(r), r["temp"]) not in configs:
            configs.append((_label(r), r["temp"]))
    cells = {(_label(r), r["temp"], r["category"]): f"{r['speedup']:.2f}x" for r in rows}
    names = [f"{label} temp {temp:g}" for label, temp in configs]
    # (the first column's header, its rows as (label, key), the other columns as (header, key))
    if len(categories) > 6:
        first, lines, columns = "category", [(c, c) for c in categories], list(zip(names, configs))
        cell = lambda cat, config: cells.get((*config, cat), "-")  # noqa: E731
    else:
        first, lines, columns = "configuration", list(zip(names, configs)), [(c, c) for c in categories]
        cell = lambda config, cat: cells.get((*config, cat), "-")  # noqa: E731

    def table(cols: list) -> Table:
        t = Table(title="speed-up by category (wall time)", title_justify="left", box=box.SIMPLE_HEAD)
        t.add_column(first, no_wrap=True)
        for name, _ in cols:
            t.add_column(name, justify="right", no_wrap=True)
        for name, key in lines:
            t.add_row(name, *(cell(key, col) for _, col in cols))
        return t

    console = console or Console(width=120)
    groups: list[list] = [[]]
    for col in columns:
        if groups[-1] and _width(console, table(groups[-1] + [col])) > console.width:
            groups.append([])
        groups[-1].append(col)
    return Group(*(table(cols) for cols in groups))
