"""Statistics as data, folded from the event stream. Definitions follow the field (Spec-Bench, vLLM v1)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Iterable, NamedTuple

from .events import Event, Prefilled, Round, Stopped, Token


@dataclass
class DrafterStats:
    """Per drafter (auto mixes them): rounds it ran, and what they drafted and yielded."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    chosen_k: int = 0  # sum of the draft lengths chosen; / rounds = mean chosen k
    predicted: float = 0.0  # sum of the tokens the cost model expected, over rounds that had a prediction
    predicted_rounds: int = 0
    emitted_predicted: int = 0  # tokens those same rounds emitted: compare with `predicted`
    entropy: float = 0.0  # sum of per-round mean draft entropies (model rounds)
    entropy_rounds: int = 0
    draft_seconds: float = 0.0  # its rounds' drafting time (/ drafted: its cost per drafted token)
    seconds: float = 0.0  # its rounds' whole time (plain decoding's / emitted: the target alone's cost per token)
    # Another tokenizer's draft: the rounds it drafted in, and its own tokens decoded in them (drafted and accepted
    # count the target's tokens: what it verified).
    foreign_rounds: int = 0
    draft_fed: int = 0

    def add(self, r: Round) -> None:
        self.rounds += 1
        self.draft_seconds += r.draft_seconds
        self.seconds += r.seconds
        self.drafted += r.drafted
        self.accepted += r.accepted
        self.emitted += r.emitted
        self.chosen_k += r.k
        if r.predicted is not None:
            self.predicted += r.predicted
            self.predicted_rounds += 1
            self.emitted_predicted += r.emitted
        if r.entropy is not None:
            self.entropy += r.entropy
            self.entropy_rounds += 1
        if r.draft_fed is not None:
            self.foreign_rounds += 1
            self.draft_fed += r.draft_fed

    def merge(self, other: DrafterStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict:
        pr = self.predicted_rounds
        return {
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "mean_k": round(self.chosen_k / self.rounds, 3) if self.rounds else 0.0,
            "predicted_tokens_per_round": round(self.predicted / pr, 4) if pr else None,
            "realised_tokens_per_round": round(self.emitted_predicted / pr, 4) if pr else None,
            "mean_entropy": round(self.entropy / self.entropy_rounds, 4) if self.entropy_rounds else None,
            "accept_rate": round(self.accepted / self.drafted, 4) if self.drafted else None,
            "draft_ms_per_token": round(1000 * self.draft_seconds / self.drafted, 4) if self.drafted else None,
        } | (self._foreign() if self.foreign_rounds else {})

    def _foreign(self) -> dict:
        per = round(self.draft_fed / self.accepted, 4) if self.accepted else None
        return {"another_tokenizer": True, "draft_tokens_fed": self.draft_fed, "draft_tokens_fed_per_accepted": per}


@dataclass
class Stats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens produced by rounds, an end-of-generation token included
    rounds_with_draft: int = 0
    rejections: int = 0  # rounds in which the target rejected a draft token (the round ended in a correction)
    branches: int = 0  # branches verified, summed over rounds (/ rounds = mean branches per round)
    tree_rounds: int = 0  # rounds that verified more than one branch
    branch_wins: list[int] = field(default_factory=list)  # branch_wins[b]: tree rounds won by branch b
    accepted_at: list[int] = field(default_factory=list)  # accepted_at[i]: rounds whose draft token i was accepted
    drafted_at: list[int] = field(default_factory=list)  # drafted_at[i]: rounds that drafted a token i (k varies: auto)
    by_drafter: dict[str, DrafterStats] = field(default_factory=dict)  # "none" | "lookup" | "model"
    prefill_seconds: float = 0.0
    measure_seconds: float = 0.0  # auto measuring this machine's costs before the prefill (once per model and -t)
    ttft_seconds: float = 0.0  # time to first token: the measurement, the prefill and the first round (which emits it)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    generation_seconds: float = 0.0
    stop_reason: str | None = None
    complete: bool | None = None  # a constrained text: whether it is a whole sentence of the grammar (None: none)
    # A predicted answer (OpenAI's `prediction`): its length in tokens (None: none was given), and of the draft
    # tokens it proposed, those accepted and those the target rejected (OpenAI's accepted_prediction_tokens and
    # rejected_prediction_tokens).
    prediction_tokens: int | None = None
    prediction_accepted: int = 0
    prediction_rejected: int = 0
    # --parallel: the tokens of the target decodes that verified its rounds (every request's), and of its rounds those
    # whose decode carried other requests' rows too.
    step_rows: int = 0
    shared_rounds: int = 0

    def add(self, event: Event) -> None:
        if isinstance(event, Token):
            self.generated_tokens += 1
        elif isinstance(event, Round):
            self.rounds += 1
            self.drafted += event.drafted
            self.accepted += event.accepted
            self.emitted += event.emitted
            self.draft_seconds += event.draft_seconds
            self.verify_seconds += event.verify_seconds
            self.generation_seconds += event.seconds
            if self.rounds == 1:
                self.ttft_seconds = self.measure_seconds + self.prefill_seconds + event.seconds
            self.by_drafter.setdefault(event.drafter, DrafterStats()).add(event)
            self.branches += event.branches
            self.step_rows += event.step_rows
            self.shared_rounds += event.shared
            self.prediction_accepted += event.prediction_accepted
            self.prediction_rejected += event.from_prediction - event.prediction_accepted
            if event.branches > 1:
                self.tree_rounds += 1
                _grow(self.branch_wins, event.branches)
                self.branch_wins[event.winner] += 1
            if event.drafted:
                self.rounds_with_draft += 1
                self.rejections += event.rejected
                # Positions are depths: a tree's nodes beyond the chosen k are siblings, not deeper positions.
                depth = event.drafted if event.branches == 1 else min(event.drafted, event.k or event.drafted)
                _grow(self.accepted_at, depth)
                _grow(self.drafted_at, depth)
                for i in range(event.accepted):
                    self.accepted_at[i] += 1
                for i in range(depth):
                    self.drafted_at[i] += 1
        elif isinstance(event, Prefilled):
            self.prompt_tokens = event.prompt_tokens
            self.prefill_seconds = event.seconds
            self.measure_seconds = event.measure_seconds
            self.prediction_tokens = event.prediction
        elif isinstance(event, Stopped):
            self.stop_reason, self.complete = event.reason, event.complete

    @classmethod
    def combine(cls, parts: list[Stats]) -> Stats:
        """Totals over several generations (e.g. a benchmark's prompts): counts and times add up,
        per-position and per-branch counts element by element, per-drafter statistics by drafter."""
        total = cls()
        for s in parts:
            for f in fields(cls):
                mine, theirs = getattr(total, f.name), getattr(s, f.name)
                if isinstance(theirs, list):
                    _grow(mine, len(theirs))
                    for i, x in enumerate(theirs):
                        mine[i] += x
                elif isinstance(theirs, dict):
                    for name, d in theirs.items():
                        mine.setdefault(name, DrafterStats()).merge(d)
                elif isinstance(theirs, (int, float)) and not isinstance(theirs, bool):  # counts and seconds (not
                    # stop_reason, a string, nor `complete`, a verdict; prediction_tokens where a part had one)
                    setattr(total, f.name, (mine or 0) + theirs)
        return total

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_token_accept(self) -> float:
        """Estimated probability that a draft token is accepted given that the one before it was:
        each round shows `accepted` successes and, unless it accepted everything, one failure."""
        n = self.accepted + self.rejections
        return self.accepted / n if n else 0.0

    @property
    def mean_accepted(self) -> float:
        """Tokens per target verification, the correction or bonus included; plain decoding has 1.0."""
        return self.emitted / self.rounds if self.rounds else 0.0

    @property
    def per_position_accept(self) -> list[float]:
        n = self.rounds_with_draft
        return [a / n for a in self.accepted_at] if n else []

    @property
    def per_position_drafted_accept(self) -> list[float]:
        """Entry i: of the rounds that drafted a token i, the share that had it accepted. Where k varies (auto) a
        round that drafted fewer tokens is no rejection at i, as per_position_accept would count it."""
        return [a / d for a, d in zip(self.accepted_at, self.drafted_at) if d]

    @property
    def tokens_per_second(self) -> float:
        """Generation only: what the rounds produced over the time they took (the prefill left out)."""
        return self.generated_tokens / self.generation_seconds if self.generation_seconds else 0.0

    @property
    def wall_seconds(self) -> float:
        """What the whole request took: a measurement of the machine, the prefill (and the run's set-up) and the
        generation."""
        return self.measure_seconds + self.prefill_seconds + self.generation_seconds

    @property
    def wall_tokens_per_second(self) -> float:
        """Over the whole request, as the user waits for it: the prefill counted."""
        return self.generated_tokens / self.wall_seconds if self.wall_seconds else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "accept_rate": round(self.accept_rate, 4),
            "mean_accepted": round(self.mean_accepted, 4),
            "per_position_accept": [round(x, 4) for x in self.per_position_accept],
            "tokens_per_second": round(self.tokens_per_second, 3),
            "wall_tokens_per_second": round(self.wall_tokens_per_second, 3),
            "ttft_seconds": round(self.ttft_seconds, 4) if self.rounds else None,
            "prefill_seconds": round(self.prefill_seconds, 4),
            "measure_seconds": round(self.measure_seconds, 4),
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
            "generation_seconds": round(self.generation_seconds, 4),
            "wall_seconds": round(self.wall_seconds, 4),
            "by_drafter": {name: d.as_dict() for name, d in sorted(self.by_drafter.items())},
            "mean_branches": round(self.branches / self.rounds, 4) if self.rounds else 0.0,
            "tree_rounds": self.tree_rounds,
            "branch_wins": list(self.branch_wins),
            "mean_step_rows": round(self.step_rows / self.rounds, 4) if self.rounds else 0.0,
            "shared_rounds": self.shared_rounds,
        } | (self._prediction() if self.prediction_tokens is not None else {})

    def _prediction(self) -> dict:
        """A run given a predicted answer: its tokens, and its draft tokens accepted and rejected (OpenAI's usage
        calls the counts accepted_prediction_tokens and rejected_prediction_tokens)."""
        return {
            "prediction_tokens": self.prediction_tokens,
            "prediction_accepted": self.prediction_accepted,
            "prediction_rejected": self.prediction_rejected,
        }

    def predicted_vs_realised(self) -> tuple[float, float] | None:
        """(predicted, realised) tokens per round over the rounds the cost model predicted (auto)."""
        n = sum(d.predicted_rounds for d in self.by_drafter.values())
        if not n:
            return None
        predicted = sum(d.predicted for d in self.by_drafter.values())
        return predicted / n, sum(d.emitted_predicted for d in self.by_drafter.values()) / n


class Result(NamedTuple):
    """One generation folded from its events; unpacks as (stats, tokens, text, interrupted)."""

    stats: Stats
    tokens: list[int]
    text: str
    interrupted: bool = False


class Fold:
    """The one fold of a generation's events into statistics, token ids, text and the reused prompt tokens:
    `collect` runs one over a whole stream; a server keeps one beside its own streaming (stop strings)."""

    def __init__(self) -> None:
        self.stats = Stats()
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self.cached = 0  # prompt tokens the caches kept from the run before (Prefilled)

    def add(self, event: Event) -> None:
        self.stats.add(event)
        if isinstance(event, Token):
            self.tokens.append(event.id)
            self.pieces.append(event.text)
        elif isinstance(event, Stopped):
            self.pieces.append(event.tail)
        elif isinstance(event, Prefilled):
            self.cached = event.cached

    def result(self, interrupted: bool = False) -> Result:
        return Result(self.stats, self.tokens, "".join(self.pieces), interrupted)


def collect(
    events: Iterable[Event],
    on_event: Callable[[Event], None] | None = None,
    interrupts: tuple[type[BaseException], ...] = (),
) -> Result:
    """Fold events into statistics, token ids and text: what the CLI, the bench and the tests share.
    `on_event` sees each event once it is counted (a live view); one of `interrupts` ends the fold
    early, the statistics so far standing, with stop reason "interrupted"."""
    fold = Fold()
    try:
        for event in events:
            fold.add(event)
            if on_event is not None:
                on_event(event)
    except interrupts:
        fold.stats.stop_reason = "interrupted"
        return fold.result(interrupted=True)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()  # a generator walked away from runs its `finally` now: the engine's rollback
    return fold.result()


def _grow(counts: list[int], n: int) -> None:
    """Pad a list of counts with zeros to at least n entries."""
    counts += [0] * (n - len(counts))
