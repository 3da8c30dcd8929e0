"""Statistics as data, folded from the event stream. Definitions follow the field (Spec-Bench, vLLM v1)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import Event, Prefilled, Round, Stopped, Token


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
    accepted_at: list[int] = field(default_factory=list)  # accepted_at[i]: rounds whose draft token i was accepted
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    generation_seconds: float = 0.0
    stop_reason: str | None = None

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
            if event.drafted:
                self.rounds_with_draft += 1
                self.rejections += event.accepted < event.drafted
                if len(self.accepted_at) < event.drafted:
                    self.accepted_at += [0] * (event.drafted - len(self.accepted_at))
                for i in range(event.accepted):
                    self.accepted_at[i] += 1
        elif isinstance(event, Prefilled):
            self.prompt_tokens = event.prompt_tokens
            self.prefill_seconds = event.seconds
        elif isinstance(event, Stopped):
            self.stop_reason = event.reason

    @classmethod
    def combine(cls, parts: list[Stats]) -> Stats:
        """Totals over several generations (e.g. a benchmark's prompts): counts and times add up."""
        total = cls()
        for s in parts:
            for name in ("prompt_tokens", "generated_tokens", "rounds", "drafted", "accepted", "emitted",
                         "rounds_with_draft", "rejections", "prefill_seconds", "draft_seconds", "verify_seconds",
                         "generation_seconds"):  # fmt: skip
                setattr(total, name, getattr(total, name) + getattr(s, name))
            if len(total.accepted_at) < len(s.accepted_at):
                total.accepted_at += [0] * (len(s.accepted_at) - len(total.accepted_at))
            for i, a in enumerate(s.accepted_at):
                total.accepted_at[i] += a
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
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds else 0.0

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
            "prefill_seconds": round(self.prefill_seconds, 4),
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
            "generation_seconds": round(self.generation_seconds, 4),
            "wall_seconds": round(self.prefill_seconds + self.generation_seconds, 4),
        }
