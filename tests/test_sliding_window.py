"""Sliding-window attention: Gemma 3 270M attends over the last 512 positions on 15 of its 18 layers.

Contexts keep every cell of those layers (swa_full, backend.context.Context), so a rollback past the
window returns to cells that are still there. Here Gemma drafts for itself on prompts whose text runs
past the window: one of 703 tokens, one of 495 whose answer crosses position 512. Greedy output of
every drafter must be --drafter none's, token for token. With the default (fast) kernels it is not on
this project's CPU: near-ties tip (the 703-token prompt differs at its second token with -k 1), so the
check runs in exact mode. Skipped where the `models` extra did not install Gemma.
"""

from __future__ import annotations

from test_exact import identity_failures, long_edits
from specdec_cli.backend.native import Model

WINDOW = 512
MAX_TOKENS = 48
CONFIGS = [
    *(dict(drafter="model", draft_tokens=k) for k in (1, 3, 8)),
    dict(drafter="lookup", draft_tokens=4),
    dict(drafter="lookup", draft_tokens=None),
    dict(drafter="auto", draft_tokens=None),
]


def code_prompt(text: str, lines: int) -> str:
    """A long edit cut after `lines` lines, asking a base model (no chat template) for the code again."""
    return "\n".join(text.split("\n")[:lines]) + "\n\nThe whole updated code:\n\n"


def window_prompts() -> list[str]:
    edits = long_edits()
    return [code_prompt(edits[1], 80), code_prompt(edits[2], 62)]  # 703 and 495 tokens with BOS


def test_the_prompts_run_past_the_window(gemma3):
    with Model(gemma3) as m:
        over, under = (len(m.tokenize(p, special=True)) for p in window_prompts())
    assert over > WINDOW + 128
    assert under < WINDOW < under + MAX_TOKENS - 16  # the answer crosses the window's edge, well before its end


def test_gemma3_every_drafter_is_target_only_output_past_the_window_in_exact_mode(gemma3, frozen_costs):
    """Gemma drafts for itself; auto drafts whatever this machine's timings (frozen_costs)."""
    assert identity_failures(gemma3, gemma3, window_prompts(), exact=True, max_tokens=MAX_TOKENS, configs=CONFIGS) == []
