"""Several generations' decodes in one llama_decode (a server's --parallel slots): continuous batching.

Each generation runs on a thread of its own, and only one of them runs at a time (the turn): between decodes
a generation samples, drafts, rolls back (llama.cpp's seq_rm and seq_cp need no lock of their own then). Where
it decodes, it hands its rows over (`decode`) and lets go of the turn. The decoding thread, the one that owns
llama.cpp's OpenMP team (a second team, on another thread, spins against the first for the same cores), waits
until every running generation has handed something over, then decodes in one batch what it chooses of it
(`step`): every generating request's rows (its next token, or its draft to verify), and a prompt's chunk
where the batch has room, the more urgent prompts first (an editor's fill-in before an agent's long turn).
Generations join and leave between steps; one that leaves frees its slot for the next request.
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import numpy as np

# A prompt's chunk: tokens of a prompt decoded in one step beside the others' rows. A step waits for its slowest
# part, so a chunk bounds how long a prompt delays everyone else (256 tokens: about 2 s for the 1.5B target on
# 2 cores) and how long a more urgent prompt waits for the chunk already under way.
CHUNK = 256
SERVED = 1024  # generations whose last prompt chunk's step is remembered (more are forgotten, the oldest first)
URGENT, NORMAL = 0, 1  # a request's priority: an editor's (/infill, /completion) goes first; a chat turn's after


class Left(Exception):
    """A generation's client left: its next decode is not made (a long prompt stops at its next chunk)."""


class Decodes(Protocol):
    """A context that decodes several generations' parts in one batch (backend/context.py's Context)."""

    n_batch: int
    max_outputs: int

    def decode_parts(self, parts: list[Part]) -> list[np.ndarray]: ...


@dataclass(eq=False)
class Part:
    """One generation's rows in a step: tokens at their positions in their sequences (the context's own seq ids),
    logits rows for tokens[first_out:]."""

    tokens: list[int]
    pos: list[int]
    seqs: list[tuple[int, ...]]
    first_out: int
    prompt: bool = False  # a prompt's chunk: it may wait a step for more urgent ones
    target: bool = True  # the target's (else a draft model's: its short decodes go first)
    priority: int = NORMAL
    order: int = 0  # when its generation started: among equals the earlier prompt goes first
    rows: np.ndarray | None = None
    error: BaseException | None = None
    step_rows: int = 0  # tokens of the step that carried it (every generation's), and its seconds
    step_seconds: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def outputs(self) -> int:
        return len(self.tokens) - min(max(self.first_out, 0), len(self.tokens) - 1)


class Steps:
    """The turn, the parts handed over, and the steps that decode them (module docstring). Counts what the steps
    carried: `steps`, `rows` (tokens in all), `shared` (steps that carried more than one generation's rows), and
    the `seconds` they took."""

    def __init__(self, chunk: int = CHUNK):
        self.chunk = chunk
        self._cond = threading.Condition()
        self._turn = threading.Lock()
        self._waiting: list[tuple[Decodes, Part]] = []
        self._running = 0  # generation threads between `joined` and its end
        self._closed: BaseException | None = None
        self._poked = False
        self._orders = itertools.count()
        self._served: dict[int, int] = {}  # a generation's (its order's) last step that took a chunk of its prompt
        self.steps = self.rows = self.shared = 0
        self.seconds = 0.0  # in the steps' decodes

    @property
    def running(self) -> int:
        return self._running

    def order(self) -> int:
        """A generation's place in line among prompts of its priority (its start)."""
        return next(self._orders)

    @contextmanager
    def joined(self) -> Iterator[None]:
        """A generation thread's whole run: it holds the turn except while a decode of its rows is under way."""
        with self._cond:
            self._running += 1
        self._turn.acquire()
        try:
            yield
        finally:
            self._turn.release()
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    @contextmanager
    def turn(self) -> Iterator[None]:
        """The decoding thread's own use of the contexts (a cache written to disk): no generation runs meanwhile."""
        with self._turn:
            yield

    def decode(self, ctx: Decodes, part: Part) -> Part:
        """On a generation's thread, holding the turn: the part decoded in the next step that takes it."""
        with self._cond:
            if self._closed is not None:
                raise self._closed
            self._waiting.append((ctx, part))
            self._cond.notify_all()
        self._turn.release()
        try:
            part.done.wait()
        finally:
            self._turn.acquire()
        if part.error is not None:
            raise part.error
        return part

    def poke(self) -> None:
        """Wake the decoding thread from its wait (a job to start, a generation ended)."""
        with self._cond:
            self._poked = True
            self._cond.notify_all()

    def step(self, timeout: float = 0.1) -> bool:
        """On the decoding thread: once every running generation has handed over a part, one decode of what
        `_choose` takes of them, and those generations woken; False, nothing decoded, after `timeout` or a poke."""
        with self._cond:
            self._cond.wait_for(lambda: self._poked or self._all_in(), timeout)
            self._poked = False
            if not self._all_in():
                return False
            ctx, parts = self._choose()
            for p in parts:
                self._waiting.remove((ctx, p))
        t0 = time.perf_counter()
        try:
            with self._turn:
                rows = ctx.decode_parts(parts)
        except Exception as e:  # each generation raises it (a full cache) and rolls back its own
            for p in parts:
                p.error = e
        except BaseException:  # a signal: the parts wait again, for `close` to end them
            with self._cond:
                self._waiting += [(ctx, p) for p in parts]
            raise
        else:
            for p, r in zip(parts, rows):
                p.rows = r
        seconds, n = time.perf_counter() - t0, sum(len(p.tokens) for p in parts)
        self.steps, self.rows, self.shared = self.steps + 1, self.rows + n, self.shared + (len(parts) > 1)
        self.seconds += seconds
        for p in parts:
            p.step_rows, p.step_seconds = n, seconds
            p.done.set()
        return True

    def close(self, error: BaseException) -> None:
        """No more decodes: every part handed over, and every one handed over later, raises `error` (a stopping
        server's 503); the generations roll back and end."""
        with self._cond:
            self._closed = error
            for _, p in self._waiting:
                p.error = error
                p.done.set()
            self._waiting.clear()
            self._cond.notify_all()

    def _all_in(self) -> bool:
        return bool(self._waiting) and len(self._waiting) >= self._running

    def _choose(self) -> tuple[Decodes, list[Part]]:
        """One context's parts for the next step: a draft model's first (its generations then join the target's
        step), then the target's; of several target contexts (exact mode: one a slot), the one that has waited
        longest, prompts after generating rows. Of a context's parts: every generating one, then prompts' chunks, the
        most urgent first and among equals the one served least recently (a short prompt is not stuck behind a long
        one), up to `chunk` prompt tokens a step (at least one chunk: a step with nothing else takes a whole one)."""
        by_ctx: dict[int, tuple[Decodes, list[Part]]] = {}
        for ctx, p in self._waiting:
            by_ctx.setdefault(id(ctx), (ctx, []))[1].append(p)
        ctx, waiting = min(by_ctx.values(), key=self._urgency)
        parts, outputs = [], 0
        for p in (p for p in waiting if not p.prompt):  # (every one fits, but where many draft long: next step)
            if outputs + p.outputs <= ctx.max_outputs:
                parts.append(p)
                outputs += p.outputs
        room = ctx.n_batch - sum(len(p.tokens) for p in parts)
        budget = self.chunk
        prompts = sorted((p for p in waiting if p.prompt), key=lambda p: (p.priority, self._served.get(p.order, -1)))
        for p in prompts:
            if p.priority > prompts[0].priority or len(p.tokens) > min(room, budget):
                break
            if outputs + p.outputs > ctx.max_outputs:
                break
            parts.append(p)
            room, budget, outputs = room - len(p.tokens), budget - len(p.tokens), outputs + p.outputs
        parts = parts or [prompts[0]]
        for p in parts:
            if p.prompt:  # (moved to the end: the least recently served are the first keys, and go when too many)
                self._served.pop(p.order, None)
                self._served[p.order] = self.steps
                if len(self._served) > SERVED:
                    del self._served[next(iter(self._served))]
        return ctx, parts

    def _urgency(self, group: tuple[Decodes, list[Part]]) -> tuple:
        """Which context's parts go first: a draft model's before the target's; of the target's (exact mode's
        slots have one each), one with generating rows before one with only prompts, the more urgent prompt first,
        then the one whose parts have waited longest (its first in the line of parts handed over)."""
        parts = group[1]
        first = next(i for i, (_, p) in enumerate(self._waiting) if p in parts)
        prompts_only = all(p.prompt for p in parts)
        return parts[0].target, prompts_only, min(p.priority for p in parts) if prompts_only else NORMAL, first
