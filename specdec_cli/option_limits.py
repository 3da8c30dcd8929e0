"""The run options' defaults and limits, one per line, each with why (a drafter's own, DRAFT_TOKENS and
DRAFT_WINDOW, are drafting's). The option table (option_table.py) cites them in its help and checks."""

from __future__ import annotations

import os

MAX_TOKENS = 256  # long enough for a code answer, short enough to come back quickly
MAX_SEED = 2**64 - 1  # a seed is 64 bits (numpy's generators take more, but a request's larger one is absurd)
MAX_TOKENS_LIMIT = 2**31 - 1  # llama.cpp counts them in an int32 (n_predict); beyond, a request's value is absurd
CTX_SIZE = 4096  # unless -c says or the target was trained for less: a page of prompt plus the answer, a small KV cache
MAX_DRAFT_TOKENS = 63  # a verify batch has k+1 logits rows; contexts reserve output room for 64
MAX_BRANCHES = 8  # --branches: a tree verify batch holds every branch's nodes, and llama.cpp a seq id per branch
P_SPLIT = 0.1  # fork where the draft's runner-up has >= 10% (llama.cpp's --draft-p-split)
MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS: more threads crash llama.cpp
MAX_PREDICTION = 1 << 20  # bytes of --prediction: far more than an answer in any context (32k tokens of ~4 bytes)
MAX_LOGPROBS = 20  # alternatives per token: OpenAI's top_logprobs limit
MIN_CTX = 16  # below this not even a prompt and one verify batch fit
AUTO_K_MAX = 31  # -k auto drafts at most this many: verifying 32 tokens costs ~11x one here, 15 often pays more


def default_threads() -> int:
    """The cores this process may use (llama.cpp's decode scales with physical cores)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
