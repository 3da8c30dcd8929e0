"""The drafting strategies, each declared once with its traits (`Kind`, in DRAFTERS), and `build`: the drafter
for a run, in one call.

model.py drafts with a small model (a chain is a tree of one branch) over a window of the text (window.py);
mtp.py with the target's own draft heads (MTP), from its hidden states; eagle3.py and dflash.py with drafts trained on
those (hidden.py: what they share); lookup.py copies from the predicted answer
(prediction.py), the text, the user's instruction (hints.py) and earlier answers (corpus.py, kept on disk by
cache.py); auto.py chooses among them every round by the cost model
(cost.py). Adding a drafter: a `Drafter` subclass and one `declare(Kind(...))`. The command line's choices, the
options' rules, the config, the statistics, the bench and the server read the traits; nothing outside this
package compares drafter names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from ..backend.mtp import unusable
from ..engine.drafter import Drafter, NoDrafter
from ..errors import UsageError
from .lookup import LookupDrafter
from .sources import DRAFT_WINDOW, Sources, for_run  # noqa: F401 (options reads DRAFT_WINDOW; the session for_run)

DRAFT_TOKENS = 4  # llama.cpp uses 3, mlx-lm 3, HF starts at 5; 4 suits a draft that is right ~80% of the time


NEEDS, USES, NEVER = "needs", "uses", "never"  # Kind.model: how a drafter relates to the draft model


@dataclass(frozen=True, kw_only=True)
class Kind:
    """A drafter, declared once: what it is built from and the traits everything else reads."""

    name: str
    help: str  # --drafter's help for it
    build: Callable[[Sources], Drafter]
    model: str = NEVER  # NEEDS: refused without a draft model; USES: drafts with one where there is one; NEVER
    heads: str = NEVER  # the target's MTP heads: NEEDS (refused on a model without them), USES (where it has them
    # and there is no draft model), NEVER
    p_min: float = 0.0  # its --p-min when none is given
    lookup: bool = False  # reads the text and the lookup cache's earlier answers (and keeps answers there)
    k: int | None = DRAFT_TOKENS  # its draft length when -k is not given; None: chosen every round (-k auto)
    chooses_k: bool = False  # chooses every round's length itself (-k only caps it): the bench sweeps no -k for it
    trees: bool = False  # --branches applies: the draft model forks
    plain: bool = False  # drafts nothing: target-only decoding (every comparison's baseline)
    falls_back: bool = False  # on a target that cannot roll back: decodes plainly with a warning (else refused)
    native: str | None = None  # drafts with a draft trained on the target's hidden states, of this architecture
    # (general.architecture: "eagle3", "dflash"); None: not one of those
    cost: str = "free"  # a drafted token's cost: "free" (no decode), "model" (a draft-model decode, after its
    # window's prefill at its first draft), "heads" (a decode of the target's MTP heads), "hidden" (a decode of an
    # EAGLE-3 step or a DFlash block), "chosen" (whichever the cost model chose, each weighed), "none"
    rounds: str = ""  # what its rounds are called in the statistics (default: its name)

    @property
    def uses_model(self) -> bool:
        return self.model != NEVER

    @property
    def label(self) -> str:
        return self.rounds or self.name


DRAFTERS: dict[str, Kind] = {}


def declare(kind: Kind) -> Kind:
    """Register a drafter: from here on the command line, the config, the server and the bench know it."""
    DRAFTERS[kind.name] = kind
    return kind


def kind(name: str) -> Kind:
    return DRAFTERS[name]


def native_kind(arch: str) -> str:
    """The drafter of a draft file of this architecture (an EAGLE-3 or DFlash draft)."""
    return next(k.name for k in DRAFTERS.values() if k.native == arch)


def plain() -> str:
    """The drafter that drafts nothing (target-only decoding)."""
    return next(k.name for k in DRAFTERS.values() if k.plain)


def default(has_draft: bool) -> str:
    """The drafter when none is named: auto with a draft model (it drafts only where that pays), else none."""
    return "auto" if has_draft else "none"


def round_label(source: str) -> str:
    """A round's source (Draft.source: the drafter that drafted it) as the statistics name it."""
    return DRAFTERS[source].label if source in DRAFTERS else source


def is_plain(source: str) -> bool:
    """Whether rounds (or rows) of this drafter draft nothing: plain decoding, the baseline."""
    return source in DRAFTERS and DRAFTERS[source].plain


def source_order(source: str) -> tuple[bool, int]:
    """Where a round source's statistics go: plain rounds first, then as declared."""
    names = list(DRAFTERS)
    return (not is_plain(source), names.index(source) if source in DRAFTERS else len(names))


class Recurrent(Protocol):
    """What `check_branches` reads of a model (backend/native.Model)."""

    name: str
    architecture: str
    recurrent: bool  # keeps a recurrent state (no cells to fork per branch)


class Target(Protocol):
    """What `able` reads of a target model (backend/native.Model)."""

    name: str
    heads: bool  # loaded with its MTP heads

    def rollback_problem(self) -> str | None: ...  # why its cache cannot drop a rejected draft (None: it can)


def able(name: str, target: Target, mtp_layers: int) -> str:
    """The drafter `name` where `target` (with `mtp_layers` MTP heads) can draft with it; where it cannot roll back,
    plain decoding for a drafter that falls back to it (auto), and an error for the others."""
    k = DRAFTERS[name]
    why = unusable(target.name, mtp_layers, target.heads) if k.heads == NEEDS else None
    if why:  # (auto drafts without them)
        raise UsageError(f"--drafter {name}: {why[0]}", hint=why[1])
    problem = not k.plain and target.rollback_problem()
    if problem and not k.falls_back:
        raise UsageError(
            f"--drafter {name}: target {target.name} cannot speculate: {problem}",
            hint=f"use --drafter {plain()} (or one that decodes it plainly: "
            + ", ".join(d.name for d in DRAFTERS.values() if d.falls_back)
            + ")",
        )
    return plain() if problem else name


def check_branches(branches: int, models: list[Recurrent]) -> None:
    """A tree forks every branch's state: refused on a model that keeps a recurrent state (chains speculate on it)."""
    recurrent = [m for m in models if m.recurrent]
    if branches > 1 and recurrent:
        raise UsageError(
            f"--branches {branches}: tree drafting forks every branch's state, and {recurrent[0].name} "
            f"({recurrent[0].architecture}) keeps a recurrent state that specdec does not fork for trees",
            hint="use --branches 1 (chains speculate on it)",
        )


def build(name: str, sources: Sources) -> Drafter:
    """The drafter called `name` (one of DRAFTERS) over what the run offers."""
    return DRAFTERS[name].build(sources)


def _hidden(s: Sources) -> Drafter:
    # -k auto: the cost model chooses each round's length, the draft as auto's model source
    return s.hidden_drafter() if s.k is not None else s.auto(lookup=False)


def _model(s: Sources) -> Drafter:
    # -k auto: the cost model chooses each round's length (and may decode plainly)
    return s.draft_model() if s.k is not None else s.auto(lookup=False)


declare(
    Kind(
        name="auto",
        build=Sources.auto,
        model=USES,
        heads=USES,
        lookup=True,
        k=None,
        chooses_k=True,
        trees=True,
        falls_back=True,
        cost="chosen",
        help="each round plain, lookup or the model, whichever the cost model expects to be fastest (default with a draft)",
    )
)
declare(Kind(name="model", build=_model, model=NEEDS, trees=True, cost="model", help="the draft model"))
declare(
    Kind(
        name="mtp",
        build=lambda s: s.mtp() if s.k is not None else s.auto(lookup=False, heads=True),
        heads=NEEDS,
        k=2,  # llama.cpp's MTP users found 2 tokens with a 0.6 floor ~1.9x where its defaults (3, none) lost
        p_min=0.6,
        cost="heads",
        help="the target's own draft heads (MTP / NextN), on models that carry them (`models info`)",
    )
)
declare(
    Kind(
        name="eagle3",
        build=_hidden,
        model=NEEDS,
        native="eagle3",
        cost="hidden",
        help="an EAGLE-3 draft (--draft FILE): a chain from the target's own hidden states (`--drafter model` "
        "and auto take such a file by themselves)",
    )
)
declare(
    Kind(
        name="dflash",
        build=_hidden,
        model=NEEDS,
        native="dflash",
        k=15,  # its trained block less the anchor: 15 for the published drafts (a file's own block caps it)
        cost="hidden",
        help="a DFlash (or DFlash2) draft (--draft FILE): a whole block in one decode, from the target's hidden states",
    )
)
declare(
    Kind(
        name="lookup",
        build=lambda s: LookupDrafter(prediction=s.predicted()) if s.k is not None else s.auto(model=False),
        lookup=True,
        k=None,
        help="copy from the prompt and the text so far",
    )
)
declare(Kind(name="none", build=lambda s: NoDrafter(), plain=True, cost="none", rounds="plain", help="target-only"))
