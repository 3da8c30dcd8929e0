"""Where a generation runs in a session: the contexts it decodes in, what they kept from its last run, its cache_salt,
and, in a server, the request that holds it (its claim) and its state.

A command's runs have the session's own slot (`Session.home`), whose contexts decode directly. A server has N slots
(`shares`), each a share of the same contexts (slot_context.py) whose decodes go through the steps (rendezvous.py),
and auto weighs a draft's rows against what the others put in the same step (drafting/cost.py's `Loaded`). In
exact mode each slot has a target context of its own: a shared cache interleaves the requests' cells, and attention
sums a row's cells in the order they lie (docs/exact.md), so a row would depend on the others' requests.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from .. import drafts
from ..backend.context import Run, direct
from ..backend.hidden import DraftContext, LayerTap
from ..backend.mtp import Heads, HeadSeqs
from ..drafting.cost import Costs, Loaded
from ..drafting.hidden import FeatureCache
from ..drafting.mtp import HeadCache
from ..engine.context import Context
from ..engine.kv import Kept
from ..once import Once
from ..layout import Layout
from .claim import Claim, State
from .rendezvous import Steps
from .slot_context import SlotContext

SIMILAR = 0.1  # the share of a prompt a slot's kept cells must serve to be chosen for it (llama-server's default)


@dataclass(eq=False)
class Slot:
    target: Context
    draft: Callable[[], Context] | None  # its draft context, opened at its first draft (None: no draft model)
    kept: Kept
    salt: str | None = None  # the cache_salt of the run whose cells its caches keep (reused by its own)
    claim: Claim = field(default_factory=Claim)  # the request that holds it (a command's: one that never leaves)
    state: State = State.FREE
    prompt_end: int = 0  # its run's prompt's tokens: rows before the last one read the prompt
    heads: Callable[[], HeadCache] | None = None  # its share of the target's MTP heads (None: it has none)
    hidden: Callable[[], FeatureCache] | None = None  # its share of a draft of the target's hidden states

    def bind(self, claim: Claim) -> None:
        """A request takes the slot: the steps read its claim from now on."""
        self.claim, self.state = claim, State.PROMPT

    def begin(self, prompt: int) -> None:
        """A run on a prompt of `prompt` tokens starts (its first decodes read it)."""
        self.prompt_end = prompt
        if self.state is not State.LEAVING:
            self.state = State.PROMPT

    def reuses(self, tokens: list[int], salt: str | None) -> int:
        """Prompt tokens a run on `tokens` in namespace `salt` would find in its target's cells; 0 where that is less
        than SIMILAR of the prompt (a template's opening shared by every chat does not make another's cells worth
        taking over: llama-server's slot_prompt_similarity)."""
        held = self.kept.held(self.target)
        n = held.shared(tokens[:-1]) if held is not None and salt == self.salt else 0
        return n if n >= SIMILAR * len(tokens) else 0

    def release(self) -> None:
        self.claim, self.state = Claim(), State.FREE

    def released(self) -> AbstractContextManager[None]:
        """Work that touches no context (a file read, a cache written): a server slot lets go of its turn meanwhile,
        and the other slots' steps go on."""
        return self.target.steps.released() if isinstance(self.target, SlotContext) else nullcontext()

    def costs(self, get: Callable[[], Costs]) -> Callable[[], Costs | Loaded]:
        """The costs its auto drafter weighs: with others in its steps, a draft's rows at the step's margin."""
        if isinstance(self.target, SlotContext):
            return lambda: Loaded(get(), self.target)
        return get


class Companions(NamedTuple):
    """What the target's decodes feed, per target context (opened on first use): its MTP heads (None: it has
    none), a draft of its hidden states (its context and the target's tap; None: none)."""

    heads: Callable[[int], Heads] | None
    hidden: Callable[[int], tuple[DraftContext, LayerTap]] | None


def home(target: Context, draft: Callable[[], Context] | None, kept: Kept, companions: Companions) -> Slot:
    """A command's slot: the session's own contexts, decoded directly."""
    slot = Slot(target, draft, kept, state=State.GENERATING)
    _accompany(slot, companions, 0, 0, direct)
    return slot


def shares(
    plan: Layout,
    targets: list[Context],
    draft: Callable[[], Context] | None,
    steps: Steps,
    kept: Callable[[Callable[[SlotContext], bool]], Kept],
    companions: Companions,
) -> list[Slot]:
    """A slot per share of the contexts: of the one target context (sequences i * seqs[0] ...), or of its own (exact
    mode's), of the draft model's (sequences i * seqs[1] ...), and of the companions of its target context (its
    sequences there: i, or 0 in a context of its own); every decode through the steps."""
    out, own, shared = [], plan.own, plan.slots > 1
    for i in range(plan.slots):
        slot = Slot(None, None, kept(lambda ctx: ctx.shared))  # (its contexts are shares that read it)
        base, draft_base = plan.base(i)
        ctx = targets[i if own else 0]
        slot.target = SlotContext(ctx, steps, base, plan.seqs[0], plan.n_ctx, slot, shared=shared and not own)
        if draft is not None:
            slot.draft = Once(
                lambda base=draft_base, slot=slot: SlotContext(
                    draft(), steps, base, plan.seqs[1], plan.draft_n_ctx, slot, True, shared
                )
            )
        _accompany(slot, companions, i if own else 0, 0 if own else i, slot.target.hand)
        out.append(slot)
    return out


def _accompany(slot: Slot, companions: Companions, ctx: int, index: int, run: Run) -> None:
    """The slot's shares of target context `ctx`'s companions: sequence `index` of them, their decodes by `run`."""
    if companions.heads is not None:
        slot.heads = Once(lambda: HeadCache(HeadSeqs(companions.heads(ctx), index, run)))
    if companions.hidden is not None:
        slot.hidden = Once(lambda: drafts.hidden_cache(companions.hidden(ctx), slot.target, index, run))
