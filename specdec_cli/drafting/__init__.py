"""The drafting strategies, each declared once with its traits (`Kind`, in DRAFTERS), and `build`: the drafter
for a run, in one call.

model.py drafts with a small model (a chain is a tree of one branch) over a window of the text (window.py);
mtp.py with the target's own draft heads (MTP), from its hidden states; lookup.py copies from the predicted answer
(prediction.py), the text, the user's instruction (hints.py) and earlier answers (corpus.py, kept on disk by
cache.py); auto.py chooses among them every round by the cost model
(cost.py). Adding a drafter: a `Drafter` subclass and one `declare(Kind(...))`. The command line's choices, the
options' rules, the config, the statistics, the bench and the server read the traits; nothing outside this
package compares drafter names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..engine.drafter import Drafter, NoDrafter
from ..engine.kv import Sequence
from ..errors import SpecdecError
from .auto import AutoDrafter
from .corpus import Corpus
from .cost import Costs
from .forced import Forced
from .lookup import LookupDrafter, line_ends
from .model import ModelDrafter
from .mtp import HeadCache, MtpDrafter
from .prediction import Prediction

DRAFT_TOKENS = 4  # llama.cpp uses 3, mlx-lm 3, HF starts at 5; 4 suits a draft that is right ~80% of the time
DRAFT_WINDOW = 2048  # the draft model's window: the text's first 512 tokens and its last 1,536 (window.py)


@dataclass(frozen=True, kw_only=True)
class Sources:
    """What a run can draft from. Costs and the draft's sequence are asked for only by a drafter that uses
    them: measuring the costs takes about a second (and clears the caches), and comes first; the draft's
    sequence is taken (the draft model loaded, where it was not) at its first draft."""

    k: int | None  # tokens per draft; None: auto (the cost model chooses every round)
    costs: Callable[[], Costs]
    draft: Callable[[], Sequence] | None  # takes the draft model's sequence; None: no draft model
    draft_loaded: Callable[[], bool] = lambda: True  # whether taking it loads nothing (the draft model is loaded)
    heads: Callable[[], HeadCache] | None = None  # the target's MTP heads (opened on first use); None: it has none
    is_eog: Callable[[int], bool] = lambda token: False
    p_min: float = 0.0
    branches: int = 1  # the draft model's tree: at most this many branches
    p_split: float = 0.1
    max_nodes: int = 63  # a tree's nodes + 1 must fit the target's output rows
    vocab: int | None = None  # the target's vocabulary: ids a draft may propose
    window: int | None = DRAFT_WINDOW  # the draft model's window (None: the whole text)
    max_tokens: int | None = None  # the answer's bound
    lookup_branches: int = 1  # a lookup tree's leaves (each forks the target's state)
    instruction: str = ""
    corpus: Corpus | None = None  # earlier answers (the lookup cache)
    prediction: tuple[int, ...] = ()  # the predicted answer's tokens (OpenAI's `prediction`), tokenized as `tokenize`
    grammar: Callable[[], Any] | None = None  # a constrained run: the grammar's start state (a new one per call)
    tokenize: Callable[[str], list[int]] = lambda text: []
    piece: Callable[[int], bytes] = lambda token: b""

    def draft_model(self) -> ModelDrafter | None:
        if self.draft is None:
            return None
        grammar = self.grammar() if self.grammar is not None else None  # its rows masked as the target's
        return ModelDrafter(
            self.draft,
            self.p_min,
            self.branches,
            self.p_split,
            self.max_nodes,
            self.vocab,
            grammar,
            self.window,
            self.draft_loaded,
        )

    def mtp(self) -> MtpDrafter | None:
        if self.heads is None:
            return None
        grammar = self.grammar() if self.grammar is not None else None
        return MtpDrafter(self.heads(), self.p_min, self.vocab, grammar, self.is_eog)

    def model_source(self, heads: bool = False) -> ModelDrafter | MtpDrafter | None:
        """Auto's model source: the draft model where there is one (and `heads` does not ask for the heads), else
        the target's own heads where they open (llama.cpp may refuse them a context: auto then drafts without
        them), else none."""
        if self.draft is not None and not heads:
            return self.draft_model()
        try:
            return self.mtp()
        except SpecdecError:
            return None

    def lookup(self) -> LookupDrafter:
        return LookupDrafter.for_instruction(self.instruction, self.corpus, self.tokenize, self.piece, self.predicted())

    def predicted(self) -> Prediction | None:
        """The predicted answer as lookup's first source (a new cursor per drafter); None without one."""
        return Prediction(self.prediction, line_ends(self.piece)) if self.prediction else None

    def auto(self, lookup: bool = True, model: bool = True, heads: bool = False) -> AutoDrafter:
        """heads: the target's heads as the model source even where there is a draft model (mtp -k auto)."""
        costs = self.costs()
        forced = Forced(self.grammar(), self.tokenize, self.piece) if self.grammar is not None else None
        source = self.model_source(heads) if model else None
        if isinstance(source, MtpDrafter) and costs.draft is None:  # a head's decode: measured once (milliseconds)
            costs.draft = source.cache.time_one()
        return AutoDrafter(
            costs,
            self.lookup() if lookup else None,
            source,
            self.lookup_branches,
            forced=forced,
            max_tokens=self.max_tokens,
        )


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
    cost: str = "free"  # a drafted token's cost: "free" (no decode), "model" (a draft-model decode, after its
    # window's prefill at its first draft), "heads" (a decode of the target's MTP heads), "chosen" (whichever the
    # cost model chose, each weighed), "none"
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


def build(name: str, sources: Sources) -> Drafter:
    """The drafter called `name` (one of DRAFTERS) over what the run offers."""
    return DRAFTERS[name].build(sources)


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
        name="lookup",
        build=lambda s: LookupDrafter(prediction=s.predicted()) if s.k is not None else s.auto(model=False),
        lookup=True,
        k=None,
        help="copy from the prompt and the text so far",
    )
)
declare(Kind(name="none", build=lambda s: NoDrafter(), plain=True, cost="none", rounds="plain", help="target-only"))
