"""The one stream every consumer reads: the CLI's live view, --json, and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Iterator


class Origin(str, Enum):
    DRAFT = "draft"  # a draft token the target accepted
    CORRECTION = "correction"  # the target's own token where it rejected a draft token
    BONUS = "bonus"  # the target's extra token after it accepted the whole draft
    PLAIN = "plain"  # nothing was drafted this round: ordinary decoding


@dataclass(frozen=True, slots=True)
class Prefilled:
    prompt_tokens: int
    seconds: float  # the prompt's prefill and the run's set-up, the measurement below left out
    cached: int = 0  # of the prompt's tokens, how many the target's cache already held (a server's reuse)
    prediction: int | None = None  # the predicted answer's length in tokens, where the run was given one
    measure_seconds: float = 0.0  # before it, auto measured this machine's costs (its first run here; 0: it did not)


@dataclass(frozen=True, slots=True)
class Token:
    id: int
    origin: Origin
    text: str = ""  # added by whoever knows the model (text.with_text); "" while a character is incomplete
    # Where the run asked for them (Settings.logprobs): the target's log probability of this token, from the row
    # that chose it (raw logits, after the grammar's mask), and its `logprobs` best tokens as (id, logprob).
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Round:
    """One round in numbers. Keyword-only: of fifteen fields several are floats side by side, and a
    swapped pair would pass silently."""

    drafted: int  # draft tokens the target verified
    accepted: int  # of those, how many became output
    emitted: int  # tokens this round produced, the target's correction/bonus included
    draft_seconds: float
    verify_seconds: float
    seconds: float  # the whole round: drafting, verification, acceptance, rollback
    drafter: str = "none"  # who drafted this round: "none" (plain decoding) | "lookup" | "model"
    k: int = 0  # the draft length chosen for the round; `drafted` is less when the draft ran out early
    predicted: float | None = None  # tokens the cost model expected this round to emit (auto only)
    entropy: float | None = None  # the draft model's mean entropy over its drafted tokens, in nats
    rejected: bool = False  # the round ended in a correction (not a bonus, not plain decoding)
    branches: int = 1  # tree drafting: branches verified this round (`drafted` counts every node)
    winner: int = 0  # the branch whose accepted prefix was kept (0: the main one)
    # Of `drafted`, those the predicted answer proposed (OpenAI's `prediction`), and of those, the accepted.
    from_prediction: int = 0
    prediction_accepted: int = 0
    draft_fed: int | None = None  # another tokenizer's draft: its own tokens decoded this round (None: same tokens)
    step_rows: int = 0  # tokens of the target decode that verified it: its own and other requests' (--parallel)
    shared: bool = False  # that decode carried other requests' rows too


@dataclass(frozen=True, slots=True)
class Stopped:
    reason: str  # "eos" | "max_tokens" | "context"
    tail: str = ""  # text the detokenizer still held (bytes that never completed a character)
    complete: bool | None = None  # a grammar's constraint: whether the text is a whole sentence of it (None: none)


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the user should know that does not stop generation (a drafter that stopped drafting)."""

    message: str


Event = Prefilled | Token | Round | Notice | Stopped


def with_setup(
    events: Iterator[Event],
    seconds: float,
    predicted: tuple[int, ...] | None,
    measured: float = 0.0,
    doubted: str | None = None,
) -> Iterator[Event]:
    """The engine's events, the run's set-up before the engine started counted in its prefill, the machine's
    measurement (`measured` seconds) beside it, and the predicted answer's length (None: none) told with it: the engine
    sees token ids only, not where a drafter's came from. `doubted`: why that measurement is not kept, a Notice."""
    n = len(predicted) if predicted is not None else None
    for event in events:
        if isinstance(event, Prefilled):
            yield replace(event, seconds=event.seconds + seconds, prediction=n, measure_seconds=measured)
            if doubted:
                yield Notice(doubted)
        else:
            yield event
