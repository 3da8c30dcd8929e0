"""bench's views: the table filling in as rows finish, the final tables, the chart."""

from __future__ import annotations

import sys

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ..drafting import is_plain
from . import _err, label


COLUMNS = [  # (name, justify): the main table's, one row per configuration
    ("drafter", "left"), ("k", "right"), ("b", "right"), ("temp", "right"), ("speedup", "right"),
    ("ttft", "right"), ("gen tok/s", "right"), ("gen", "right"), ("predicted", "right"), ("accept", "right"),
    ("mean acc", "right"), ("per position", "left"), ("draft/verify", "right"), ("identical", "right"),
]  # fmt: skip


def _bench_table(rows: list[dict], title: str | None = None) -> Table:
    """speedup: by wall time (prefill and generation); ttft: time to first token against target-only's; gen:
    generation's speed-up alone, and what the cost model predicted of it."""
    table = Table(title=title, title_justify="left")
    for col, justify in COLUMNS:
        table.add_column(col, justify=justify)
    if any(r.get("speedup_vs_fast") is not None for r in rows):
        table.add_column("vs fast", justify="right")  # an exact row against the fast target-only
    for r in rows:
        if r["category"] == "all":
            table.add_row(*_cells(r, with_fast=len(table.columns) > len(COLUMNS)))
    return table


def _cells(r: dict, with_fast: bool) -> list:
    plain = is_plain(r["drafter"])
    speed = Text(f"{r['speedup']:.2f}x", style="bold green" if r["speedup"] >= 1.03 else ("" if plain else "red"))
    pred = (
        "-" if r["predicted_speedup"] is None else f"{r['predicted_speedup']:.2f}x" + (" !" if r["model_gap"] else "")
    )
    cells = [
        r["drafter"] + (" (exact)" if r.get("exact") else ""),
        str(r["draft_tokens"] or "-"),
        str(r.get("branches", 1)),
        f"{r['temp']:g}",
        speed,
        f"{r.get('ttft_ratio', 1.0):.2f}x",
        f"{r['tokens_per_second']:.1f}",
        f"{r.get('generation_speedup', r['speedup']):.2f}x",
        pred,
        "-" if plain else f"{r['accept_rate']:.0%}",
        f"{r['mean_accepted']:.2f}",
        " ".join(f"{x:.0%}" for x in r["per_position_accept"]) or "-",
        f"{r['draft_share']:.0%} / {r['verify_share']:.0%}",
        "-" if r["identical_to_baseline"] is None else f"{r['identical_to_baseline']:.0%}",
    ]
    if with_fast:
        cells.append("-" if r.get("speedup_vs_fast") is None else f"{r['speedup_vs_fast']:.2f}x")
    return cells


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
        return Group(self._progress.get_renderable(), _bench_table(self.rows))

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
    rows: list[dict], curve_dict: dict, recommendation: str, header: str, exact_curve: dict | None = None
) -> None:
    # The tables are wide: keep them whole in a file or a pipe rather than folding them to 80 columns.
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
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
    out.print(_bench_table(rows))
    categories = sorted({r["category"] for r in rows} - {"all"})
    if len(categories) > 1:
        out.print(_category_table(rows, categories))
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
    """Speed-up (by wall time) against draft length, one block per temperature; '|' marks target-only (1.0x)."""
    width = 40
    pts = [r for r in rows if r["category"] == "all" and not is_plain(r["drafter"])]
    text = Text("speed-up by wall time vs draft length (| = target-only)\n")
    if not pts:
        return text
    top = max(1.2, max(r["speedup"] for r in pts))
    one = round(width / top)
    for temp in sorted({r["temp"] for r in pts}):
        text.append(f"temp {temp:g}\n")
        order = lambda r: (r.get("exact", False), r["drafter"], str(r["draft_tokens"]).zfill(4), r.get("branches", 1))  # noqa: E731
        for r in sorted((r for r in pts if r["temp"] == temp), key=order):
            n = round(width * r["speedup"] / top)
            bar = "".join("|" if i == one - 1 and i >= n else ("█" if i < n else " ") for i in range(width))
            text.append(f"  {_label(r, k_for_auto=True):<26}")
            text.append(bar, style="green" if r["speedup"] >= 1.0 else "red")
            text.append(f" {r['speedup']:.2f}x\n")
    return text


def _label(r: dict, k_for_auto: bool = False) -> str:
    """A bench row's configuration in words (the JSON rows of older runs have no "branches" or "exact")."""
    return label(r["drafter"], r["draft_tokens"], r.get("branches", 1), k_for_auto, r.get("exact", False))


def _category_table(rows: list[dict], categories: list[str]) -> Table:
    """Speed-up per configuration and category: a column per category, or, with many (a schema each), a row
    per category and a column per configuration."""
    configs: list[tuple[str, float]] = []
    for r in rows:
        if (_label(r), r["temp"]) not in configs:
            configs.append((_label(r), r["temp"]))
    cells = {(_label(r), r["temp"], r["category"]): f"{r['speedup']:.2f}x" for r in rows}
    names = [f"{label} temp {temp:g}" for label, temp in configs]
    table = Table(title="speed-up by category (wall time)", title_justify="left")
    if len(categories) > 6:
        table.add_column("category")
        for name in names:
            table.add_column(name, justify="right")
        for cat in categories:
            table.add_row(cat, *(cells.get((*key, cat), "-") for key in configs))
        return table
    table.add_column("configuration")
    for cat in categories:
        table.add_column(cat, justify="right")
    for name, key in zip(names, configs):
        table.add_row(name, *(cells.get((*key, cat), "-") for cat in categories))
    return table
