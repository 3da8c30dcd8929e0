"""`specdec cache ...`: the lookup cache, earlier answers that lookup drafts from (specdec_cli/drafting/cache.py)."""

from __future__ import annotations

import typer

from .. import ui
from ..drafting import cache as lookup_cache

app = typer.Typer(help="The lookup cache: earlier answers that lookup drafts from.", no_args_is_help=True)


@app.command("info")
def info(json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout.")) -> None:
    """Where the lookup cache is, how many answers it keeps (every namespace's) and its size (and its bound)."""
    answers, size = lookup_cache.usage()
    where = lookup_cache.root()
    if json_out:
        ui.print_json({"path": str(where), "answers": answers, "bytes": size, "max_bytes": lookup_cache.MAX_BYTES})
    else:
        print(f"{where}: {answers} answers, {size / 1024:.1f} KiB of {lookup_cache.MAX_BYTES >> 20} MiB")


@app.command("clear")
def clear() -> None:
    """Remove every answer the lookup cache keeps, a server's clients' too (models are not touched)."""
    answers, size = lookup_cache.clear()
    print(f"removed {answers} answers ({size / 1024:.1f} KiB) from {lookup_cache.root()}")
