"""A batch's loop: every request not yet in the results file, in order, through serve's own Service (the
same parsing, the same generation, the same response body), each result appended as it finishes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .. import signals
from ..errors import SpecdecError
from ..serve.api import ApiError
from ..serve.service import Service
from .requests import Line
from .results import Results, result


@dataclass
class Tally:
    """What a batch did, for its progress and summary."""

    total: int  # requests in the file
    earlier: int = 0  # finished by an earlier run (skipped now)
    earlier_failed: int = 0
    done: int = 0  # finished by this run, errors included
    failed: list[tuple[Line, ApiError]] = field(default_factory=list)
    prompt_tokens: int = 0
    tokens: int = 0
    prefill_seconds: float = 0.0
    generation_seconds: float = 0.0
    emitted: int = 0  # tokens the rounds produced: the generated ones and each answer's end-of-generation token
    rounds: dict[str, int] = field(default_factory=dict)  # by drafter ("none": plain rounds)
    drafted: int = 0
    accepted: int = 0
    predicted: int = 0  # requests given a predicted answer (--prediction), and what came of its draft tokens
    prediction_accepted: int = 0
    prediction_rejected: int = 0
    started: float = field(default_factory=time.monotonic)
    wall: float = 0.0
    interrupted: bool = False

    def add(self, body: dict) -> None:
        spec = body["speculative"]
        self.prompt_tokens += spec["prompt_tokens"]
        self.tokens += spec["generated_tokens"]
        self.prefill_seconds += spec["prefill_seconds"]
        self.generation_seconds += spec["generation_seconds"]
        self.drafted += spec["drafted"]
        self.accepted += spec["accepted"]
        if "prediction_tokens" in spec:
            self.predicted += 1
            self.prediction_accepted += spec["prediction_accepted"]
            self.prediction_rejected += spec["prediction_rejected"]
        for name, part in spec["by_drafter"].items():
            self.rounds[name] = self.rounds.get(name, 0) + part["rounds"]
            self.emitted += part["emitted"]

    def speedup(self, plain_seconds: float | None) -> float | None:
        """By wall time: what target-only decoding would have taken, the same prefill and a plain decode per token
        the rounds produced (auto's cost of one, refined as it runs), over what the requests took."""
        wall = self.prefill_seconds + self.generation_seconds
        if not plain_seconds or not wall:
            return None
        return (self.prefill_seconds + self.emitted * plain_seconds) / wall


def run(
    lines: list[Line], results: Results, service: Service, on_result: Callable[[Line, int, dict], None], tally: Tally
) -> Tally:
    """Answer every line that has no result yet. A request refused as serve would refuse it is that line's
    error result; a failure of the machinery (a lost RPC server, a target that writes NaN) ends the batch
    before its line is written, so that running it again retries it. Ctrl-C or SIGTERM stops it between
    two results or inside a generation (whose caches are rolled back); nothing finished is lost."""
    try:
        for line in lines:
            if line.custom_id in results.done:
                continue
            status, body = _answer(service, line)
            with signals.held():  # a result is written whole, and counted, or not at all
                results.append(result(line.custom_id, status, body))
                tally.done += 1
                if status == 200:
                    tally.add(body)
                else:
                    tally.failed.append((line, ApiError(status, body["error"]["message"])))
            on_result(line, status, body)
    except signals.INTERRUPTS:
        tally.interrupted = True
    finally:
        tally.wall = time.monotonic() - tally.started
    return tally


def _answer(service: Service, line: Line) -> tuple[int, dict]:
    if line.error is not None:
        return line.error.status, line.error.body()
    try:
        return 200, service.answer(line.request)
    except ApiError as e:
        if e.status >= 500:  # not the request's fault: stop, and leave it to the next run
            raise SpecdecError(
                f"request {line.custom_id!r} (line {line.number}) failed: {e.message}",
                hint="the results so far are kept; run the same command again to resume",
            ) from None
        return e.status, e.body()
