"""Everything the user sees. All Rich code lives here; the rest of specdec returns data.

Data (generated text, JSON) goes to stdout; the legend, statistics and errors go to stderr.
"""

from __future__ import annotations

import json
import os
import sys

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
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


def warning(message: str) -> None:
    _err.print(Text(f"warning: {message}", style="yellow"), soft_wrap=True)


def note(message: str) -> None:
    _err.print(Text(message, style="dim"), soft_wrap=True)


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
    return (
        [
            ("generated", f"{stats.generated_tokens} tokens (stop: {stats.stop_reason or 'interrupted'})"),
            ("speed", f"{stats.tokens_per_second:.2f} tokens/s over {stats.generation_seconds:.2f} s of generation"),
            ("prefill", f"{stats.prompt_tokens} prompt tokens in {stats.prefill_seconds:.2f} s"),
            ("rounds", f"{stats.rounds} target verifications"),
            ("drafted / accepted", f"{stats.drafted} / {stats.accepted}  (accept rate {stats.accept_rate:.1%})"),
            ("mean accepted", f"{stats.mean_accepted:.2f} tokens per verification (plain decoding: 1.00)"),
            ("per position", pos),
            (
                "time split",
                f"draft {stats.draft_seconds:.2f} s, verify {stats.verify_seconds:.2f} s, other {other:.2f} s",
            ),
        ]
        + _tree_rows(stats)
        + _drafter_rows(stats)
    )


def _tree_rows(stats: Stats) -> list[tuple[str, str]]:
    """Tree drafting, when a round forked: branches per round, which branch won, verified vs accepted."""
    if not stats.tree_rounds:
        return []
    wins = " ".join(f"{b}:{w}" for b, w in enumerate(stats.branch_wins))
    return [(
        "branches",
        f"{stats.branches / stats.rounds:.2f} per round; {stats.tree_rounds} rounds forked, won by branch {wins}; "
        f"verified {stats.drafted}, accepted {stats.accepted}",
    )]  # fmt: skip


def _drafter_rows(stats: Stats) -> list[tuple[str, str]]:
    """Per drafter, whenever one drafted: rounds, mean chosen k, yield, the draft model's entropy."""
    parts = stats.by_drafter
    if set(parts) <= {"none"}:
        return []
    rows = []
    for name in ("none", "lookup", "model"):
        d = parts.get(name)
        if d is None:
            continue
        text = f"{d.rounds} rounds ({d.rounds / stats.rounds:.0%})"
        if name != "none":
            text += f", mean k {d.chosen_k / d.rounds:.1f}, drafted {d.drafted}, accepted {d.accepted}"
        if d.entropy_rounds:
            text += f", draft entropy {d.entropy / d.entropy_rounds:.2f} nats"
        rows.append((f"  {'plain' if name == 'none' else name}", text))
    both = stats.predicted_vs_realised()
    if both:
        rows.append(("predicted / realised", f"{both[0]:.2f} / {both[1]:.2f} tokens per round"))
    return [("drafters", "")] + rows if rows else []


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
        table.add_row(
            r["name"],
            r["role"],
            f"{r['size'] / 1e6:,.0f} MB",
            Text(r["status"], colours[r["status"]]),
            r["path"].rsplit("/", 1)[-1],
        )
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


# --- bench -----------------------------------------------------------------------------------------
def _bench_table(rows: list[dict], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for col, justify in [("drafter", "left"), ("k", "right"), ("b", "right"), ("temp", "right"), ("tok/s", "right"),
                         ("speedup", "right"), ("predicted", "right"), ("accept", "right"), ("mean acc", "right"),
                         ("per position", "left"), ("draft", "right"), ("verify", "right"), ("identical", "right")]:  # fmt: skip
        table.add_column(col, justify=justify)
    if any(r.get("speedup_vs_fast") is not None for r in rows):
        table.add_column("vs fast", justify="right")  # an exact row against the fast target-only
    for r in rows:
        if r["category"] != "all":
            continue
        speed = Text(
            f"{r['speedup']:.2f}x",
            style="bold green" if r["speedup"] >= 1.03 else ("" if r["drafter"] == "none" else "red"),
        )
        pred = (
            "-"
            if r["predicted_speedup"] is None
            else f"{r['predicted_speedup']:.2f}x" + (" !" if r["model_gap"] else "")
        )
        ident = "-" if r["identical_to_baseline"] is None else f"{r['identical_to_baseline']:.0%}"
        table.add_row(
            r["drafter"] + (" (exact)" if r.get("exact") else ""), str(r["draft_tokens"] or "-"), str(r.get("branches", 1)), f"{r['temp']:g}", f"{r['tokens_per_second']:.1f}", speed, pred,
            f"{r['accept_rate']:.0%}" if r["drafter"] != "none" else "-", f"{r['mean_accepted']:.2f}",
            " ".join(f"{x:.0%}" for x in r["per_position_accept"]) or "-",
            f"{r['draft_share']:.0%}", f"{r['verify_share']:.0%}", ident,
            *([] if len(table.columns) == 13 else ["-" if r.get("speedup_vs_fast") is None else f"{r['speedup_vs_fast']:.2f}x"]),
        )  # fmt: skip
    return table


class BenchView:
    """While a bench runs: a progress bar with ETA and the table filling in, on stderr."""

    def __init__(self, total: int):
        self.rows: list[dict] = []
        self.live_mode = _err.is_terminal
        self._progress = Progress(
            TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TextColumn("generations"),
            TimeRemainingColumn(), console=_err,
        )  # fmt: skip
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
            print(f"[{int(done.completed)}/{int(done.total)}] {_label(r)} temp={r['temp']:g}: "
                  f"{r['tokens_per_second']:.1f} tok/s, {r['speedup']:.2f}x", file=sys.stderr)  # fmt: skip


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
        table = Table(title="speed-up by category", title_justify="left")
        table.add_column("configuration")
        for cat in categories:
            table.add_column(cat, justify="right")
        configs = []
        for r in rows:
            key = (_label(r), r["temp"])
            if key not in configs:
                configs.append(key)
        for key in configs:
            cells = {r["category"]: r["speedup"] for r in rows if (_label(r), r["temp"]) == key}
            table.add_row(f"{key[0]} temp {key[1]:g}", *(f"{cells[c]:.2f}x" if c in cells else "-" for c in categories))
        out.print(table)
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
    """Speed-up against draft length, one block per temperature; '|' marks target-only (1.0x)."""
    width = 40
    pts = [r for r in rows if r["category"] == "all" and r["drafter"] != "none"]
    text = Text("speed-up vs draft length (| = target-only)\n")
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


def label(
    drafter: str, draft_tokens: int | str | None, branches: int = 1, k_for_auto: bool = False, exact: bool = False
) -> str:
    """A configuration in words, as generate, serve and bench show it: 'model k=3 b=2', 'lookup k=auto',
    'auto', 'none', '... (exact)'. The auto drafter chooses its own k: named only where asked (`k_for_auto`)."""
    k = "auto" if draft_tokens is None else draft_tokens
    out = drafter + (f" k={k}" if k and drafter != "none" and (drafter != "auto" or k_for_auto) else "")
    return out + (f" b={branches}" if branches > 1 else "") + (" (exact)" if exact else "")


def _label(r: dict, k_for_auto: bool = False) -> str:
    """A bench row's configuration in words (the JSON rows of older runs have no "branches" or "exact")."""
    return label(r["drafter"], r["draft_tokens"], r.get("branches", 1), k_for_auto, r.get("exact", False))
