"""`specdec models list` and `models pair` as tables on stdout (their data; --json is the same as JSON)."""

from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import live_terminal

STATUS = {"assembled": "green", "installed": "yellow", "not installed": "dim", "corrupt": "bold red"}


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
    """Every model found: the catalogue's (with its status) and the stores'."""
    table = Table(title="specdec models", title_justify="left")
    for col in ("name", "source", "size", "arch", "params", "quant", "path"):
        table.add_column(col, overflow="fold")
    for r in rows:
        status = r.get("status")
        source = (
            Text(r["source"]) if status in (None, "assembled") else Text(f"{r['source']} ({status})", STATUS[status])
        )
        table.add_row(
            r["name"],
            source,
            size(r["size"]),
            r["arch"] or "-",
            params(r["params"]),
            r["quant"] or "-",
            short(r["path"]),
        )
    _console().print(table)


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
