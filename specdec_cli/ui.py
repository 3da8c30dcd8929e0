"""Everything the user sees. All Rich code lives here; the rest of specdec returns data.

Data (generated text, JSON) goes to stdout; the legend, statistics and errors go to stderr.
"""

from __future__ import annotations

import json
import os
import sys

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .engine.events import Origin, Token
from .engine.stats import Stats

STYLES = {
    Origin.DRAFT: "green",
    Origin.CORRECTION: "bold red",
    Origin.BONUS: "bold cyan",
    Origin.PLAIN: "",
}
LEGEND = [
    (Origin.DRAFT, "accepted draft"),
    (Origin.CORRECTION, "correction (target overruled the draft)"),
    (Origin.BONUS, "bonus (whole draft accepted)"),
]

_err = Console(stderr=True, highlight=False)


def live_terminal() -> bool:
    """Colour stream only for a person at a terminal; pipes and NO_COLOR get plain text."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def error(message: str, hint: str | None = None) -> None:
    # soft_wrap: one logical line each, however narrow the terminal (scripts grep for "error:")
    _err.print(Text(f"error: {message}", style="bold red"), soft_wrap=True)
    if hint:
        _err.print(Text(f"hint: {hint}", style="dim"), soft_wrap=True)


def note(message: str) -> None:
    _err.print(Text(message, style="dim"))


class TokenStream:
    """Writes tokens as they arrive: coloured by origin on a terminal, raw bytes-as-text otherwise."""

    def __init__(self, live: bool):
        self.live = live
        self._out = Console(highlight=False, soft_wrap=True) if live else None

    def start(self) -> None:
        if self.live:
            legend = Text("legend: ", style="dim")
            for origin, label in LEGEND:
                legend.append("■ ", style=STYLES[origin]).append(label + "  ", style="dim")
            _err.print(legend)

    def token(self, event: Token) -> None:
        self.text(event.text, STYLES[event.origin])

    def text(self, text: str, style: str = "") -> None:
        if not text:
            return
        if self._out is not None:
            self._out.print(Text(text, style=style), end="")
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    def end(self) -> None:
        if self._out is not None:
            self._out.print()
        else:
            sys.stdout.write("\n")
            sys.stdout.flush()


def stat_rows(stats: Stats) -> list[tuple[str, str]]:
    pos = " ".join(f"{x:.0%}" for x in stats.per_position_accept) or "-"
    other = stats.generation_seconds - stats.draft_seconds - stats.verify_seconds
    return [
        ("generated", f"{stats.generated_tokens} tokens (stop: {stats.stop_reason or 'interrupted'})"),
        ("speed", f"{stats.tokens_per_second:.2f} tokens/s over {stats.generation_seconds:.2f} s of generation"),
        ("prefill", f"{stats.prompt_tokens} prompt tokens in {stats.prefill_seconds:.2f} s"),
        ("rounds", f"{stats.rounds} target verifications"),
        ("drafted / accepted", f"{stats.drafted} / {stats.accepted}  (accept rate {stats.accept_rate:.1%})"),
        ("mean accepted", f"{stats.mean_accepted:.2f} tokens per verification (plain decoding: 1.00)"),
        ("per position", pos),
        ("time split", f"draft {stats.draft_seconds:.2f} s, verify {stats.verify_seconds:.2f} s, other {other:.2f} s"),
    ]


def show_stats(stats: Stats, title: str, live: bool) -> None:
    rows = stat_rows(stats)
    if live:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for name, value in rows:
            table.add_row(name, value)
        _err.print(Panel(table, title=title, title_align="left", expand=False))
    else:
        width = max(len(name) for name, _ in rows)
        print(f"-- {title}", file=sys.stderr)
        for name, value in rows:
            print(f"{name:<{width}}  {value}", file=sys.stderr)


def print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


# --- models --------------------------------------------------------------------------------------
class byte_progress:
    """`with byte_progress("assembling x", total) as advance: advance(n)`: a progress bar with ETA on stderr."""

    def __init__(self, label: str, total: int):
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            TimeRemainingColumn(), console=_err, transient=False,
        )  # fmt: skip
        self._task = self._progress.add_task(label, total=total)

    def __enter__(self):
        self._progress.start()
        return lambda n: self._progress.advance(self._task, n)

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


def models_table(rows: list[dict]) -> None:
    table = Table(title="specdec models", title_justify="left")
    for col in ("name", "role", "size", "status", "file"):
        table.add_column(col, overflow="fold")
    colours = {"assembled": "green", "installed": "yellow", "not installed": "dim", "corrupt": "bold red"}
    for r in rows:
        table.add_row(r["name"], r["role"], f"{r['size'] / 1e6:,.0f} MB", Text(r["status"], colours[r["status"]]), r["path"].rsplit("/", 1)[-1])
    Console(highlight=False).print(table)


def key_values(title: str, rows: list[tuple[str, str]]) -> None:
    """A two-column table on stdout (it is the command's data), plain when piped."""
    if live_terminal():
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for k, v in rows:
            table.add_row(k, v)
        Console(highlight=False).print(Panel(table, title=title, title_align="left", expand=False))
    else:
        width = max(len(k) for k, _ in rows)
        print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
