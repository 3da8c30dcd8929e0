"""The scheduling policy as data (batching/policy.py): tables of waiting parts in, the step out, no threads. Each
case is a defect a review found in the policy that lived inside the rendezvous, or a rule it keeps."""

from __future__ import annotations

import pytest

from specdec_cli.batching.claim import Priority
from specdec_cli.batching.policy import AGING, Room, Waiting, choose

URGENT, NORMAL = Priority.URGENT, Priority.NORMAL
ROOMS = {"t": Room(n_batch=512, max_outputs=40), "d": Room(n_batch=512, max_outputs=40)}


def gen(line: int, tokens: int = 1, ctx: str = "t", draft: bool = False, priority=NORMAL) -> Waiting:
    """A generating part (its next token or its draft to verify)."""
    return Waiting(ctx, tokens, tokens, draft=draft, priority=priority, line=line)


def prompt(line: int, tokens: int, since: int, priority=NORMAL, ctx: str = "t", draft: bool = False) -> Waiting:
    """A prompt's chunk, last served at step `since` (or come in then)."""
    return Waiting(ctx, tokens, 1, prompt=True, draft=draft, priority=priority, since=since, line=line)


def test_every_generating_part_goes_then_prompt_chunks_within_the_budget():
    waiting = [gen(0), gen(1, 5), prompt(2, 200, 0), prompt(3, 100, 0), gen(4)]
    step = choose(waiting, ROOMS, now=1, budget=256)
    assert step.ctx == "t" and step.parts == (0, 1, 4, 2)  # the second chunk would pass the budget: next step


def test_the_urgent_prompt_goes_before_a_normal_one_that_came_first():
    waiting = [prompt(0, 64, 0), prompt(1, 64, 0, URGENT)]
    assert choose(waiting, ROOMS, now=0, budget=64).parts == (1,)


def test_a_flood_of_urgent_prompts_does_not_starve_a_normal_one():
    """Review finding 4: editors' requests had strict priority without aging; a flood of /infill gave a chat prompt
    no chunk at all while it lasted."""
    chat = prompt(0, 64, since=0)
    for now in range(AGING):  # urgent prompts keep coming: they take the steps
        flood = [prompt(10 + now, 64, since=now, priority=URGENT)]
        assert choose([chat, *flood], ROOMS, now=now, budget=64).parts == (1,)
    assert choose([chat, prompt(99, 64, since=AGING, priority=URGENT)], ROOMS, now=AGING, budget=64).parts == (0,)


def test_an_editors_answer_goes_without_a_less_urgent_prompts_chunk_until_that_one_has_aged():
    """An editor's /infill answer beside a chat prompt: each of its tokens waited for a step that also read 256 of the
    chat prompt's tokens (2 s on 2 cores: 16 tokens took 70 s). Its steps go without the chunk; the chat prompt
    still gets one every AGING steps, and beside a chat's answer (as urgent as it) a chunk goes as before."""
    chat = prompt(0, 256, since=0)
    for now in range(AGING):
        assert choose([chat, gen(1, priority=URGENT)], ROOMS, now=now, budget=256).parts == (1,)
    assert choose([chat, gen(1, priority=URGENT)], ROOMS, now=AGING, budget=256).parts == (1, 0)
    assert choose([chat, gen(1)], ROOMS, now=1, budget=256).parts == (1, 0)
    editor = prompt(2, 256, since=1, priority=URGENT)  # an editor's prompt beside an editor's answer: read as before
    assert choose([editor, gen(1, priority=URGENT)], ROOMS, now=1, budget=256).parts == (1, 0)


def test_a_stream_of_short_prompts_does_not_starve_a_long_one():
    """Review finding 5: among equal priorities a never-served prompt always went first, so a stream of short
    prompts starved a long one. A prompt counts as served when it came."""
    long_ = prompt(0, 64, since=3)  # its last chunk went at step 3
    short = prompt(1, 64, since=4)  # came in at step 4, after that chunk
    assert choose([long_, short], ROOMS, now=5, budget=64).parts == (0,)
    assert choose([prompt(2, 64, since=5), short], ROOMS, now=6, budget=64).parts == (1,)  # then its turn


def test_a_drafts_generating_rows_go_first_and_its_prompt_feed_takes_its_turn():
    """Review finding 9: a draft model's window feed went before every target step, back to back."""
    target = [gen(1), gen(2)]
    assert choose([*target, gen(3, ctx="d", draft=True)], ROOMS, now=0, budget=256).ctx == "d"
    feed = prompt(4, 256, since=0, ctx="d", draft=True)  # the draft reading a prompt: after what waited longer
    assert choose([*target, feed], ROOMS, now=0, budget=256).ctx == "t"
    assert choose([feed, *[gen(5), gen(6)]], ROOMS, now=0, budget=256).ctx == "d"  # it came first


def test_exact_modes_prompt_context_takes_its_turn_among_generating_ones():
    """Review finding 3: in exact mode (a context each) a prompt's context waited until every neighbour's whole
    answer had ended: contexts with generating rows always went first."""
    rooms = {f"c{i}": Room(512, 9) for i in range(3)}
    waiting = [Waiting("c0", 128, 1, prompt=True, line=0), Waiting("c1", 1, 1, line=1), Waiting("c2", 1, 1, line=2)]
    assert choose(waiting, rooms, now=7, budget=256).ctx == "c0"


@pytest.mark.parametrize("outputs", [40, 41])
def test_the_output_rows_bound_a_step_and_one_part_always_goes(outputs):
    big = Waiting("t", outputs, outputs, line=0)
    step = choose([big, gen(1)], ROOMS, now=0, budget=256)
    assert step.parts == ((0,) if outputs == 40 else (1,))
    assert choose([prompt(0, 300, 0)], ROOMS, now=0, budget=256).parts == (0,)  # bigger than the budget: alone
