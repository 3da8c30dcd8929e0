"""A session's llama.cpp contexts, as the layout (layout.py) says: how many slots fit this machine's memory, the
contexts opened with their sizes (one assembly of a context's arguments, the target's and the draft's alike), and the
companions each target context's decodes feed."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace

from . import drafts, fit
from .backend import draft_files, mtp, native
from .backend.context import Context
from .backend.native import Model
from .batching.slots import Companions
from .errors import UsageError
from .layout import DEFAULT_SLOTS, Layout, Shape, layout
from .once import Once


def fitted(
    slots: int,
    sizes: tuple[int, int | None],
    target: Model,
    draft: Model | None,
    plan: fit.Plan,
    hidden: bool = False,
    exact: bool = False,
    snapshots: int = 0,
    heads: int = 0,
) -> tuple[Layout, int]:
    """The layout for `slots` slots of `sizes` (the target's and the draft's n_ctx) and the draft's bytes, once the
    pair fits the plan's memory (fit.check_pair: else its error). slots=0: as many as fit, up to DEFAULT_SLOTS, as
    llama-server chooses its own (each with a whole context; fewer where memory is short, one at least). heads:
    the target's MTP layers (their cache counts too)."""
    for n in [slots] if slots else range(DEFAULT_SLOTS, 0, -1):
        shaped = layout(n, *sizes, target, draft, hidden, exact, snapshots)
        heads_bytes = n * mtp.kv_bytes(target, sizes[0], heads) if target.heads else 0
        states = (draft, n * shaped.draft_n_ctx, n * shaped.seqs[1]) if draft else None
        try:
            return shaped, fit.check_pair(
                plan, (target, *shaped.cells), states, heads_bytes, parked(shaped, target, draft)
            )
        except UsageError:
            if slots or n == 1:
                raise


def parked(shaped: Layout, target: Model, draft: Model | None) -> int:
    """The bytes idle slots may park in memory (engine/kv.py's Kept): all but one slot's whole share of each context
    that slots share (the target's, unless each slot has its own; a draft model's)."""
    idle = shaped.slots - 1
    cells = 0 if shaped.own else idle * shaped.n_ctx * target.kv_bytes_per_token()
    if shaped.draft is not None and draft is not None:
        cells += idle * shaped.draft_n_ctx * draft.kv_bytes_per_token()
    return cells


def opened(
    model: Model, shape: Shape, threads: int, stack: ExitStack, snapshots: int = 0
) -> tuple[list[Context], dict]:
    """`shape.count` contexts of `model` shaped as the layout says, and where llama.cpp put their layers."""
    sizes = dict(n_ctx=shape.n_ctx, n_seq=shape.n_seq, max_outputs=shape.max_outputs, n_threads=threads)
    with native.capture() as made:
        contexts = [stack.enter_context(Context(model, **sizes, snapshots=snapshots)) for _ in range(shape.count)]
    return contexts, fit.placement(model, made)


def target(model: Model, shaped: Layout, threads: int, stack: ExitStack) -> tuple[Layout, list[Context], dict]:
    """The target's contexts, the layout as they came out (llama.cpp may pad a context, exact mode's twin takes a
    cell: a slot's n_ctx is what its share holds), and where the layers went."""
    contexts, placed = opened(model, shaped.target, threads, stack, shaped.snapshots)
    own = contexts[0].n_ctx // (1 if shaped.own else shaped.slots)
    return replace(shaped, n_ctx=min(shaped.n_ctx, own)), contexts, placed


def companions(
    contexts: list[Context],
    shaped: Layout,
    hidden: draft_files.DraftFile | None,
    plan: fit.Plan,
    draft_bytes: int,
    threads: int,
    stack: ExitStack,
) -> Companions:
    """What each target context's decodes feed, opened on first use (for the slots that share it): the target's MTP
    heads (where it has them), a draft of its hidden states (where `hidden` names one)."""
    per, n_ctx = 1 if shaped.own else shaped.slots, shaped.n_ctx
    heads = [Once(lambda c=c: stack.enter_context(mtp.Heads(c, threads, per))) for c in contexts]
    drafts_ = [
        Once(lambda c=c: drafts.open_hidden(hidden, c, plan, n_ctx * per, draft_bytes, threads, stack, per))
        for c in contexts
    ]
    return Companions(
        (lambda i: heads[i]()) if contexts[0].model.heads else None,
        (lambda i: drafts_[i]()) if hidden is not None else None,
    )


def exact_caveat(target: Model, ctx: Context) -> list[str]:
    """What exact mode cannot promise where the target also runs on backends other than the CPU (README: Exact
    output): their kernels are their own (a context counts them only in exact mode)."""
    if not ctx.other_backends:
        return []
    return [
        f"--exact holds on CPU backends only; {target.name} also runs on {ctx.other_backends} other backend(s) (GPU "
        "or RPC), whose kernels depend on the batch: greedy output may still differ from --drafter none at near-ties"
    ]
