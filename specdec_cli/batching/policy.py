"""A server's scheduling policy, as data: which of the parts waiting the next decode takes. `choose` is a pure
function from the parts waiting (`Waiting`, as the slots' states say) to a `Step` record (vLLM's scheduler returns
a SchedulerOutput); the rendezvous (rendezvous.py) hands parts over, asks, and decodes what it says.

The rules, in order:
- A draft's generating rows first: short decodes that their generation's next target step waits for (they then
  join it). A draft reading a prompt is a prompt like the target's: it takes its turn.
- Else the context whose first part has waited longest. One target context carries every slot's rows; in exact
  mode each slot has its own, and a prompt's context takes its turn among those that generate instead of waiting
  until all of them have ended.
- In that context: every generating part (up to the rows it can output), then prompts' chunks while the batch has
  room and the step's prompt budget lasts. The more urgent prompt first (an editor's, waited for at the keyboard),
  unless another has gone AGING steps without a chunk (a flood of editors' requests does not starve a chat
  turn); among equals the one served least recently, a prompt that has had no chunk yet counting as served when
  it came (a stream of short prompts does not starve a long one). Only prompts of the first one's rank share a
  step, and none less urgent than a generating part in it (an editor's answer beside a chat prompt's chunks made
  a token a chunk's step, 2 s each on 2 cores: 16 tokens of /infill took 70 s; the chat prompt still gets a chunk
  every AGING steps). At least one part goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

from .claim import Priority

# Steps a prompt may go without a chunk while more urgent prompts take them; then it ranks with them. 16: an editor's
# prompt of up to 16 chunks (4,096 tokens) is read without a break beside a long chat prompt (at 4 its 1,551-token
# /infill waited +6.8 s beside an 8,000-token prompt, against +0.4 s with strict priority), while a flood of editors'
# requests still gives the chat prompt a chunk every 16 steps.
AGING = 16


@dataclass(frozen=True)
class Waiting:
    """A part handed over, as the policy sees it."""

    ctx: Hashable  # the context it decodes in
    tokens: int
    outputs: int  # logits rows it asks for
    prompt: bool = False  # rows of its generation's prompt (the slot's state), else generating rows
    draft: bool = False  # a draft's decode (else the target's)
    priority: Priority = Priority.NORMAL
    since: int = 0  # a prompt's: the step of its last chunk, or the step it came in, where it has had none
    line: int = 0  # its place in the line of parts handed over: the smaller, the longer it has waited


@dataclass(frozen=True)
class Room:
    """What one decode of a context can take."""

    n_batch: int  # tokens
    max_outputs: int  # logits rows


@dataclass(frozen=True)
class Step:
    """The policy's answer: the context to decode and the parts it takes (indices into the waiting list)."""

    ctx: Hashable
    parts: tuple[int, ...]


def choose(waiting: Sequence[Waiting], rooms: Mapping[Hashable, Room], now: int, budget: int) -> Step:
    """The next step (module docstring): `now` is its number, `budget` the prompt tokens one step may take."""
    if not waiting:
        raise ValueError("nothing waits")
    ctx = _context(waiting)
    mine = [i for i, w in enumerate(waiting) if w.ctx == ctx]
    room = rooms[ctx]
    parts, outputs, tokens = [], 0, 0
    for i in (i for i in mine if not waiting[i].prompt):  # (where many draft long, the rest go next step)
        w = waiting[i]
        if outputs + w.outputs <= room.max_outputs and tokens + w.tokens <= room.n_batch:
            parts.append(i)
            outputs, tokens = outputs + w.outputs, tokens + w.tokens
    prompts = sorted((i for i in mine if waiting[i].prompt), key=lambda i: _rank(waiting[i], now))
    most = min((waiting[i].priority for i in parts), default=max(Priority))  # the most urgent generating part's
    top = _rank(waiting[prompts[0]], now)[0] if prompts else None
    for i in prompts:
        w, rank = waiting[i], _rank(waiting[i], now)[0]
        if rank != top or rank > most or w.tokens > min(room.n_batch - tokens, budget):
            break
        if outputs + w.outputs > room.max_outputs:
            break
        parts.append(i)
        outputs, tokens, budget = outputs + w.outputs, tokens + w.tokens, budget - w.tokens
    return Step(ctx, tuple(parts or [prompts[0] if prompts else mine[0]]))


def _context(waiting: Sequence[Waiting]) -> Hashable:
    """A draft's generating rows' context where some wait, else the context whose first part came first."""
    drafting = [w for w in waiting if w.draft and not w.prompt]
    return min(drafting or waiting, key=lambda w: w.line).ctx


def _rank(w: Waiting, now: int) -> tuple[int, int, int]:
    """A prompt's place: its priority (the urgent's where it has starved), then the least recently served."""
    starved = now - w.since >= AGING
    return (Priority.URGENT if starved else w.priority), w.since, w.line
