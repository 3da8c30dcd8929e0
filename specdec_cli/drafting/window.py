"""What of the text the draft model's cache holds when it drafts: the whole text, or a window of it.

A long prompt costs the draft model about as much to prefill, per token, as a third of the target's (0.57x its
time on this machine's default pair), for drafts that lean mostly on the recent text. So the draft model is fed
lazily, just before a round it drafts in (drafting/model.py), and only a window of `size` tokens (+ SLACK): the
text's head, its first quarter, and its tail, the rest. The head stays because attention leans on the first
tokens whatever they say (StreamingLLM's attention sinks: a window without them falls apart), and because a
prompt says there what the answer is to do: the system prompt, the instruction, a passage's opening, which a
summary quotes most. With only StreamingLLM's four sinks, a summary's drafts were accepted 15-20% of the time
against 57% with the whole prompt; with a quarter of the window as head, as often as with the whole
(scripts/window_acceptance.py). The tail is what the next tokens depend on most. As the answer grows the window
slides: its oldest tail tokens' cells go and the rest move down (kv.Sequence.cut, llama.cpp's K-shift), SLACK
tokens at a time, so that a shift is rare. MagicDec drafts with such a cache on long contexts. The target
always sees the whole text: what the draft saw changes only how often it is right, never the output.

A cache that cannot move its cells (a recurrent or hybrid model's state) holds the whole text or nothing.
"""

from __future__ import annotations

from ..engine.context import Context
from ..engine.kv import Sequence

SINKS = 4  # StreamingLLM's four attention sinks: the least head a window keeps
HEAD_SHARE = 4  # a window's head is 1 / HEAD_SHARE of it
MIN_WINDOW = 64  # the smallest window worth drafting from: shorter, drafts lose the thread
DRAFT_ROOM = 66  # after the window: the longest draft (options.MAX_DRAFT_TOKENS), its bonus and the next token
SLACK = 32  # the window slides when its tail is this much longer than its size: a K-shift every 32 tokens


def fit(ctx: Context, size: int | None) -> int | None:
    """The window that fits the draft's context with the longest draft after it: `size` (None: the whole
    text, as long as it fits), at most what the context holds; None where the cache cannot slide (the draft
    then stops where the text outgrows its context, drafting/model.py). The same every round: a window's head
    is a share of its size, and a head that changed would not match the one the cache was cut after."""
    room = ctx.n_ctx - SLACK - DRAFT_ROOM
    if not ctx.can_shift or room < MIN_WINDOW:  # (a context too small for a window: the whole text, while it fits)
        return None
    return min(size, room) if size is not None else room


def head(size: int) -> int:
    """The tokens of the text's start a window of `size` keeps."""
    return max(SINKS, size // HEAD_SHARE)


def to_feed(covers: int, dropped: int, n: int, size: int | None) -> int:
    """How many tokens `prepare` decodes to make a cache that stands for the text's first `covers` tokens (of
    which `dropped` left out after the head) stand for its first n."""
    if _whole(n, size):
        return max(n - covers, 0)
    first = head(size)
    extra = max(first - covers, 0)
    covers = max(covers, first)
    if n - (first + dropped) > size - first + SLACK:
        covers = max(covers, n - (size - first))  # what the window leaves out is never fed
    return extra + max(n - covers, 0)


def prepare(seq: Sequence, text: list[int], size: int | None) -> None:
    """Make the cache stand for `text` (decoding what it lacks in one batch): whole where `size` is None or
    the text fits size + SLACK, else its head (`head(size)` tokens) and its last size - head(size)."""
    n = len(text)
    if not _whole(n, size):
        first = head(size)
        if seq.covers < first:
            seq.append(text[seq.covers : first])
        start = first + seq.dropped  # where the cache's tail starts in the text
        if n - start > size - first + SLACK:
            seq.cut(first, n - (size - first) - start)
    if n > seq.covers:
        seq.append(text[seq.covers : n])


def _whole(n: int, size: int | None) -> bool:
    return size is None or n <= size + SLACK
