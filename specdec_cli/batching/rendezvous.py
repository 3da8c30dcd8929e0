"""Several generations' decodes in one llama_decode (a server's slots): the rendezvous of continuous batching.

Each generation runs on a thread of its own, and only one of them runs at a time (the turn): between decodes a
generation samples, drafts, rolls back (llama.cpp's seq_rm and seq_cp need no lock of their own then). Where it
decodes, it hands its rows over (`decode`) and lets go of the turn. The decoding thread, the one that owns llama.cpp's
OpenMP team (a second team, on another thread, spins against the first for the same cores), waits until every
running generation has handed something over, asks the policy (policy.py) what the next decode takes, decodes it
(`step`) and wakes those generations. Generations join and leave between steps. Work that touches no context (a
file read, a model loaded) is done `released`: the others' steps go on meanwhile.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Protocol

import numpy as np

from ..backend.context import Rows
from ..engine.context import StepFigures
from . import policy
from .claim import Priority

# A prompt's chunk: tokens of a prompt decoded in one step beside the others' rows. A step waits for its slowest
# part, so a chunk bounds how long a prompt delays everyone else (256 tokens: about 2 s for the 1.5B target on
# 2 cores) and how long a more urgent prompt waits for the chunk already under way.
CHUNK = 256
REMEMBERED = 1024  # generations whose prompt's last chunk is remembered (more are forgotten, the oldest first)


class Decodes(Protocol):
    """A context that decodes several generations' parts in one batch (backend/context.py's Context)."""

    n_batch: int
    max_outputs: int

    def decode_parts(self, parts: list[Part]) -> list[np.ndarray]: ...


@dataclass(eq=False)
class Part(Rows):
    """One generation's rows in a step (backend/context.py's Rows), and how the policy sees them (its slot's state,
    its claim: slot_context.py)."""

    prompt: bool = False  # rows of its generation's prompt
    ends: bool = False  # a prompt's part that reads its last token: its generation makes tokens next
    draft: bool = False  # a draft's decode
    priority: Priority = Priority.NORMAL
    order: int = 0  # its generation's ticket
    rows: Any = None  # what the decode gave it (a logits array; a companion's outputs)
    error: BaseException | None = None
    figures: StepFigures = StepFigures()  # the step that carried it
    line: int = 0  # when it was handed over
    call: Callable[[], Any] | None = None  # work the decoding thread does in its place (Steps.call)
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def size(self) -> int:
        return len(self.pos)

    @property
    def outputs(self) -> int:
        return self.size - min(max(self.first_out, 0), self.size - 1)


class Steps:
    """The turn, the parts handed over, and the steps that decode them (module docstring). Counts what the steps
    carried: `steps`, `rows` (tokens in all), `shared` (steps that carried more than one generation's rows), and
    the `seconds` they took."""

    def __init__(self, chunk: int = CHUNK):
        self.chunk = chunk
        self._cond = threading.Condition()
        self._turn = threading.Lock()
        self._waiting: list[tuple[Decodes, Part]] = []
        self._taken: list[Part] = []  # the parts of the step under way (on the decoding thread)
        self._running = 0  # generation threads between `joined` and its end, less those `released`
        self._closed: BaseException | None = None
        self._poked = False
        self._lines = itertools.count()
        self._since: OrderedDict[int, int] = OrderedDict()  # a generation's (its order's) last prompt chunk's step
        self.steps = self.rows = self.shared = 0
        self.seconds = 0.0  # in the steps' decodes

    @property
    def running(self) -> int:
        return self._running

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
    def released(self) -> Iterator[None]:
        """On a generation's thread: work that touches no context (a file read, a model loaded), while the others'
        steps go on."""
        with self._cond:
            self._running -= 1
            self._cond.notify_all()
        self._turn.release()
        try:
            yield
        finally:
            self._turn.acquire()
            with self._cond:
                self._running += 1

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
            part.line = next(self._lines)
            if part.prompt and part.order not in self._since:  # a prompt that has had no chunk: served as it came
                self._remember(part.order)
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

    def call(self, fn: Callable[[], Any]) -> Any:
        """On a generation's thread, holding the turn: `fn()` run on the decoding thread, in a step of its own (a
        timing of decodes: one made on a generation's thread runs a second OpenMP team against the decoding thread's
        spinning one, many times slower on small decodes); what it returned."""
        return self.decode(_CALLS, Part([], [], [], 0, draft=True, call=fn)).rows

    def poke(self) -> None:
        """Wake the decoding thread from its wait (a job to start, a generation ended)."""
        with self._cond:
            self._poked = True
            self._cond.notify_all()

    def step(self, timeout: float = 0.1) -> bool:
        """On the decoding thread: once every running generation has handed over a part, one decode of what the
        policy takes of them, and those generations woken; False, nothing decoded, after `timeout` or a poke."""
        with self._cond:
            self._cond.wait_for(lambda: self._poked or self._all_in(), timeout)
            self._poked = False
            if not self._all_in():
                return False
            ctx, parts = self._choose()
            self._taken = parts  # (before they leave the waiting list: a signal anywhere after, `close` ends them)
            for p in parts:
                self._waiting.remove((ctx, p))
        t0 = time.perf_counter()
        with self._turn:
            self._decode(ctx, parts)
        seconds, n = time.perf_counter() - t0, sum(p.size for p in parts)
        self.steps, self.rows, self.shared = self.steps + 1, self.rows + n, self.shared + (len(parts) > 1)
        self.seconds += seconds
        teacher = next((p for p in parts if not p.prompt and not p.draft), None)
        stake = sum(_stake(p) for p in parts)  # (cost.py's Loaded: the tokens the step was to make)
        ahead = sum(_ahead(p) for p in parts)
        for p in parts:
            p.figures = StepFigures(p.size, n, seconds, stake - _stake(p) + 1, p is teacher, ahead - _ahead(p))
            p.done.set()
        self._taken = []
        return True

    def close(self, error: BaseException) -> None:
        """No more decodes: every part handed over, and every one handed over later, raises `error` (a stopping
        server's 503); the generations roll back and end."""
        with self._cond:
            self._closed = error
            # (a step a signal cut holds parts no longer waiting: each that has not been answered is, with the error)
            for p in [p for _, p in self._waiting] + [p for p in self._taken if not p.done.is_set()]:
                p.error = error
                p.done.set()
            self._waiting.clear()
            self._taken = []
            self._cond.notify_all()

    @staticmethod
    def _decode(ctx: Decodes, parts: list[Part]) -> None:
        """One decode of the parts; where it fails (a slot's share full), each part again alone, so that only the
        part that cannot be decoded fails (llama.cpp refuses a batch it finds no cells for before it writes any)."""
        try:
            for p, r in zip(parts, ctx.decode_parts(parts)):
                p.rows = r
        except Exception as e:  # each generation raises it and rolls back its own
            if len(parts) == 1:
                parts[0].error = e
                return
            for p in parts:
                try:
                    rows = ctx.decode_parts([p])[0]  # (a view: the next part's decode writes the same buffer)
                    p.rows = rows.copy() if isinstance(rows, np.ndarray) else rows
                except Exception as alone:
                    p.error = alone

    def _all_in(self) -> bool:
        return bool(self._waiting) and len(self._waiting) >= self._running

    def _choose(self) -> tuple[Decodes, list[Part]]:
        """The policy's step over what waits (its chunks remembered for the next)."""
        contexts: dict[Hashable, Decodes] = {id(c): c for c, _ in self._waiting}
        rooms = {k: policy.Room(c.n_batch, c.max_outputs) for k, c in contexts.items()}
        seen = [
            policy.Waiting(
                ctx=id(c),
                tokens=p.size,
                outputs=p.outputs,
                prompt=p.prompt,
                draft=p.draft,
                priority=p.priority,
                since=self._since.get(p.order, self.steps),
                line=p.line,
            )
            for c, p in self._waiting
        ]
        step = policy.choose(seen, rooms, self.steps, self.chunk)
        parts = [self._waiting[i][1] for i in step.parts]
        for p in parts:
            if p.prompt:
                self._remember(p.order)
        return contexts[step.ctx], parts

    def _remember(self, order: int) -> None:
        self._since.pop(order, None)  # (re-inserted last: the least recently served are the first keys)
        self._since[order] = self.steps
        if len(self._since) > REMEMBERED:
            self._since.popitem(last=False)


def _ahead(p: Part) -> int:
    """A part's rows as its generation hands them over next: a prompt's last chunk is followed by one row a step (its
    first token: four requests' prompts read in one step make a step of four rows next, not of their prompts' rows;
    priced beside the prompts' rows, every first round drafted and read its prompt into the draft first, and 4
    clients waited 1.9x as long for a first token); anything else, about its rows now (a prompt's next chunk, a
    generation's next round)."""
    return 1 if p.prompt and p.ends else p.size


def _stake(p: Part) -> int:
    """What of a step's making waits on a part: a generating part's rows (each a token it may make), a prompt's chunk
    as one."""
    return 1 if p.prompt else p.size


class _Calls:
    """The context of Steps.call's parts: each part's work, done by the decoding thread."""

    n_batch = max_outputs = 1 << 30

    @staticmethod
    def decode_parts(parts: list[Part]) -> list[Any]:
        return [p.call() for p in parts]


_CALLS = _Calls()
