"""`specdec cache ...`: what specdec keeps between runs besides the models (caches.py): lookup answers, cost
curves, prompt blocks; where each is, what it holds, and clearing them, all or by kind."""

from __future__ import annotations

from typing import List, Optional

import typer

from .. import ui
from ..caches import CACHES
from ..errors import UsageError
from ..models.store import models_dir

KINDS = ", ".join(CACHES)

app = typer.Typer(
    help=f"What specdec keeps between runs besides the models ({KINDS}): show it, clear it.", no_args_is_help=True
)


@app.command("info")
def info(json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout.")) -> None:
    """Each cache: how many files, their size (and its bound), where.

    lookup: earlier answers that lookup drafts from (every namespace's); curves: auto's measured cost curves;
    prefix: the server's KV cells of long prompts.
    """
    rows = {}
    for c in CACHES.values():
        count, size = c.usage()
        rows[c.kind] = {
            "path": str(c.folder()),
            "count": count,
            "unit": c.unit,
            "bytes": size,
            "max_bytes": c.max_bytes,
        }
    if json_out:
        ui.print_json(rows | {"models": {"path": str(models_dir())}})
        return
    for kind, r in rows.items():
        bound = f" of {_size(r['max_bytes'])}" if r["max_bytes"] else ""
        print(f"{kind:<7} {r['count']:>5} {r['unit']:<8} {_size(r['bytes']):>10}{bound:<11} {r['path']}")
    ui.note(f"models ({models_dir()}) are not a cache: `specdec models list`; never removed here")


@app.command("clear")
def clear(
    kinds: Optional[List[str]] = typer.Argument(
        None, metavar="KIND", help=f"Which caches ({KINDS}); every one when omitted."
    ),
) -> None:
    """Empty every cache, or those named (never a model).

    Only files each cache writes go, every namespace's (a server's clients' too); a run measures a curve again.
    """
    for kind in kinds or []:
        if kind not in CACHES:
            raise UsageError(f"no cache named {kind!r}", hint=f"the caches are {KINDS}; none named clears them all")
    for kind in dict.fromkeys(kinds or CACHES):
        c = CACHES[kind]
        count, size = c.clear()
        print(f"removed {count} {c.unit} ({_size(size)}) from {c.folder()}")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}".replace(".0 ", " ")
    return f"{n / 1024:.1f} KiB"
