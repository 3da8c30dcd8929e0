"""`specdec models list` and `models pair` as tables on stdout (their data; --json is the same as JSON)."""

from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..models.store import CORRUPT, DOWNLOADED, MEANING, NOT_DOWNLOADED, READY
from . import live_terminal

STATUS = {READY: "green", DOWNLOADED: "yellow", NOT_DOWNLOADED: "dim", CORRUPT: "bold red"}
COLUMNS = ("name", "source", "size", "params", "quant", "arch", "path")
# Dropped in this order where the names (never wrapped) and a readable path do not fit; then the path (a note says
# where it is), and the size last.
NARROW_DROPS = ("arch", "quant", "params", "path", "size")
MIN_PATH = 24  # characters: a path folded narrower than this reads as noise


def size(n: int | None) -> str:
    return "-" if not n else f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.0f} MB"


def params(n: int | None) -> str:
    return "-" if not n else f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _console() -> Console:
    """Piped, a line per model (no terminal's width to fold paths into)."""
    return Console(highlight=False, width=None if live_terminal() else 400)


def short(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home) :] if home not in ("", "/") and path.startswith(home + os.sep) else path


def models_table(rows: list[dict]) -> None:
    """Every model found: the catalogue's (with its status, explained in the caption) and the stores'. The name,
    which the user types, never wraps; at narrow widths the path folds and the least needed columns go."""
    fold = "\n" if live_terminal() else " "  # a status under its source on a terminal; piped, a line per model
    cells = [
        {
            "name": r["name"],
            "source": r["source"] if r.get("status") in (None, READY) else f"{r['source']}{fold}({r['status']})",
            "size": size(r["size"]),
            "params": params(r["params"]),
            "quant": r["quant"] or "-",
            "arch": r["arch"] or "-",
            "path": short(r["path"]),
        }
        for r in rows
    ]
    console = _console()
    columns = _fitting(cells, console.width)
    states = [s for s in MEANING if any(r.get("status") == s for r in rows)]
    caption = Text("\n".join(f"{s}: {MEANING[s]}" for s in states)) if states else None  # (not markup: [models])
    table = Table(title="specdec models", title_justify="left", caption=caption, caption_justify="left")
    for col in columns:
        table.add_column(col, no_wrap=col != "path", overflow="fold")
    for r, c in zip(rows, cells):
        style = STATUS.get(r.get("status"), "") if r.get("status") != READY else ""
        table.add_row(*(Text(c[col], style if col == "source" else "") for col in columns))
    console.print(table)
    if "path" not in columns:
        console.print(Text("(paths: `specdec models list --json`, or a wider terminal)", "dim"))


def _fitting(cells: list[dict], width: int) -> list[str]:
    """COLUMNS less those NARROW_DROPS takes away until the unwrapped columns and MIN_PATH fit in `width`."""

    def need(col: str) -> int:
        if col == "path":
            return min(MIN_PATH, max(len(c["path"]) for c in cells)) if cells else len(col)
        longest = max((len(line) for c in cells for line in c[col].splitlines()), default=0)
        return max(len(col), longest)

    columns = list(COLUMNS)
    for drop in NARROW_DROPS:
        if sum(need(col) + 3 for col in columns) + 1 <= width:  # each column: its text, two of padding, a rule
            break
        columns.remove(drop)
    return columns  # (names longer than the terminal still fold: nothing else can give them room)


def pair_table(target: str, rows: list[dict]) -> None:
    """The local models as drafts for `target`, best first: why each cannot, where it cannot."""
    table = Table(title=f"drafts for {target}", title_justify="left")
    for col in ("#", "name", "source", "params", "quant", "size", "expected", "why"):
        table.add_column(col, overflow="fold")
    for i, r in enumerate(rows, 1):
        expected = "-" if r["expected_speedup"] is None else f"{r['expected_speedup']:.2f}x"
        if r["draft_tokens"] == 0:
            expected += ": does not pay here"
        why = Text(r["shares"], "green") if r["can_draft"] else Text(f"cannot: {r['problem']}", "dim")
        table.add_row(
            str(i) if r["can_draft"] else "",
            r["name"],
            r["source"],
            params(r["params"]),
            r["quant"] or "-",
            size(r["size"]),
            expected,
            why,
        )
    _console().print(table)
