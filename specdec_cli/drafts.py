"""What drafts beside a session's target, read before any weights load: a draft model (its vocabulary and sizes), or a
draft trained on the target's hidden states (EAGLE-3, DFlash: backend/hidden.py), checked against the target here,
where llama.cpp would abort inside the pair; and such a draft opened beside the target's context."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import llama_cpp.llama_cpp as L

from . import fit
from .backend import draft_files, hidden, native, vocab
from .backend.context import Context, Run
from .backend.native import Model
from .drafting import DRAFTERS, able, native_kind
from .drafting.dflash import DFlashCache
from .drafting.eagle3 import Eagle3Cache
from .drafting.hidden import FeatureCache
from .errors import UsageError


@dataclass(frozen=True)
class Draft:
    """A session's draft: `info`, its vocabulary and sizes (vocab_only; None: no draft); `model`, the file of a draft
    model (None where there is none, or the draft reads hidden states); `hidden`, such a draft's description."""

    info: Model | None = None
    model: Path | None = None
    hidden: draft_files.DraftFile | None = None
    foreign: bool = False  # a draft model of another vocabulary: it drafts text (drafting/foreign.py)

    @property
    def native(self) -> str | None:
        """The architecture of a draft that reads hidden states (its drafter's `Kind.native`); None otherwise."""
        return self.hidden.arch if self.hidden is not None else None


def read(cfg, target: Model, stack: ExitStack, speculates: bool, warn: Callable[[str], None]) -> Draft:
    """The draft of `cfg`, where the run drafts at all: a draft model (of the target's vocabulary, llama.cpp's rule,
    or of another whose tokens spell text: it drafts through text), or a draft of the target's hidden states that
    fits it. A draft chosen by `--draft auto` that does not fit is dropped with a warning (its header had the last
    word); one given is refused, in one line."""
    path = cfg.draft if cfg.draft and speculates else None
    if path is None:
        return Draft()
    file = draft_files.read(path)
    info = stack.enter_context(Model(path, vocab_only=True))
    other = vocab.incompatibility(target, info)
    why = vocab.no_text(info) if other and file is None else other
    if file is not None and why is None:
        why = draft_files.problem(file, target.name, target.architecture, _n_embd(target), target.n_layer)
    if why and cfg.draft_chosen_by == "auto":
        warn(f"{info.name}, the draft chosen for {target.name}, cannot draft for it: {why}")
        return Draft()
    if why:
        what = f"{file.label} draft" if file is not None else "draft"
        hint = _hint(file) if file is not None else "`--drafter lookup` needs no draft model"
        raise UsageError(f"{what} {info.name} cannot draft for target {target.name}: {why}", hint=hint)
    if file is not None:
        return Draft(info, None, file)
    return Draft(info, path, None, foreign=other is not None)


def _hint(file: draft_files.DraftFile) -> str:
    return f"`specdec models info {file.path.name}` says what it reads; `specdec models pair TARGET` lists the drafts that fit"


def _n_embd(model: Model) -> int:
    return int(L.llama_model_n_embd(model._ptr))


def drafter(name: str, draft: Draft, branches: int = 1) -> str:
    """The drafter a run named `name` gets with this draft: `model` with an EAGLE-3 or DFlash draft is that draft's
    drafter; one named for another kind of draft is refused, as are trees from a draft that drafts a chain."""
    kind, native = DRAFTERS[name], draft.native
    if native is not None and name == "model":
        kind = DRAFTERS[native_kind(native)]
    if kind.native is not None and kind.native != native:
        what = f"a {draft.hidden.label} draft" if draft.hidden else "a draft model" if draft.model else "no draft"
        wanted = {"eagle3": "an EAGLE-3", "dflash": "a DFlash"}[kind.native]
        raise UsageError(
            f"--drafter {kind.name} drafts with {wanted} draft (--draft FILE), and {what} was given",
            hint=f"use --drafter {native_kind(native) if native else 'model'} or auto for this draft",
        )
    if draft.foreign and branches > 1 and kind.name == "model":
        raise UsageError(
            f"--branches {branches}: draft {draft.info.name} has another tokenizer than the target's and drafts a "
            "chain of text (its branches would be texts the target tokenizes apart)",
            hint="use --branches 1 with this draft, or a draft of the target's family for trees",
        )
    if kind.native is not None and branches > 1:
        raise UsageError(
            f"--branches {branches}: {draft.hidden.label} drafts a chain; only a draft model forks into a tree",
            hint="use --branches 1 with this draft",
        )
    return kind.name


def open_hidden(
    file: draft_files.DraftFile,
    target: Context,
    plan: fit.Plan,
    n_ctx: int,
    n_bytes: int,
    threads: int,
    stack: ExitStack,
    slots: int = 1,
) -> tuple[hidden.DraftContext, hidden.LayerTap]:
    """The draft loaded (placed as -ngld / -devd ask), its context beside the target's (a sequence per slot that
    shares the target's), and the target's tap."""
    want = plan.draft_want
    placed = fit.offload(want, file.path, n_ctx, n_bytes)[0] if want else None
    model = stack.enter_context(Model(file.path, offload=placed))
    with native.capture():
        ctx = stack.enter_context(hidden.DraftContext(model, file, target, threads, slots))
    tap = hidden.LayerTap(target, file.layers, slots)
    stack.callback(tap.detach)  # (runs before the contexts close: the stack unwinds in reverse)
    return ctx, tap


def hidden_cache(
    opened: tuple[hidden.DraftContext, hidden.LayerTap], target, slot: int = 0, run: Run | None = None
) -> FeatureCache:
    """A slot's cache of the draft (its sequence of the draft's context, its rows of the target's `target`)."""
    ctx, tap = opened
    cls = Eagle3Cache if ctx.file.arch == "eagle3" else DFlashCache
    return cls(hidden.DraftSeqs(ctx, slot, run), hidden.TapSeqs(tap, target, slot))


def speculation(cfg, target: Model, mtp_layers: int, warn: Callable[[str], None]) -> str:
    """The drafter, once the target's cache is known: auto decodes plainly where it cannot roll back (said by
    `warn`); exact mode refuses a recurrent target. The draft is read after (`drafter`)."""
    if cfg.exact and target.recurrent:
        raise UsageError(
            f"--exact: {target.name} ({target.architecture}) keeps a recurrent state, whose batched and one-token "
            "kernels exact mode does not cover",
            hint="run without --exact (README: Models)",
        )
    drafter = able(cfg.drafter, target, mtp_layers)
    if drafter != cfg.drafter:
        warn(f"{target.name} cannot speculate: {target.rollback_problem()}; auto decodes it plainly")
    return drafter
