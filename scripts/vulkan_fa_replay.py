#!/usr/bin/env python3
"""Speculative decoding's decodes through llama.cpp's C API alone (llama-cpp-python's low-level bindings, none of
specdec's code): a prompt, then verify batches of 1 to 16 tokens in one sequence, each followed by removing the
rejected tail (llama_memory_seq_rm), as a speculative loop does. It tells a llama.cpp or driver fault from one of
specdec's: run it on the same library and device as a crashing specdec run.

    LLAMA_CPP_LIB_PATH=.vulkan/llama-cpp-python-0.3.36/build/bin GGML_VK_VISIBLE_DEVICES=0 \\
        python scripts/vulkan_fa_replay.py MODEL.gguf --flash-attn on --seeds 1-10

Each seed runs in its own process (a crash ends only that one) and prints `ok` or the signal that ended it. Found
with it (2026-11-26, llama-cpp-python 0.3.36's llama.cpp built with Vulkan, Mesa 22.3.6's lavapipe, the tests'
tiny llama model): flash attention on, 9 of 10 seeds die with SIGSEGV in lavapipe's thread within 15 decodes;
off, 10 of 10 run 2,000 decodes. specdec turns flash attention off on software Vulkan devices (backend/context.py).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys


def replay(path: str, rounds: int, seed: int, flash_attn: int) -> None:
    import faulthandler

    faulthandler.enable()
    import llama_cpp.llama_cpp as L

    L.llama_backend_init()
    model = L.llama_model_load_from_file(os.fsencode(path), L.llama_model_default_params())
    if not model:
        sys.exit(f"cannot load {path}")
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 4096, 2048, 512, 8  # as specdec's target context
    p.n_threads = p.n_threads_batch = 2
    p.kv_unified, p.swa_full, p.n_outputs_max, p.flash_attn_type = True, True, 64, flash_attn
    ctx = L.llama_init_from_model(model, p)
    mem = L.llama_get_memory(ctx)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(2048, 0, 8)
    rng = random.Random(seed)

    def decode(tokens: list[int], pos0: int) -> None:
        batch.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, pos0 + i, 1, True
            batch.seq_id[i][0] = 0
        if L.llama_decode(ctx, batch) != 0:
            sys.exit("llama_decode failed")
        L.llama_get_logits(ctx)  # waits for the backend, as reading the rows does

    n = 0
    for _ in range(rounds):
        if n == 0 or n > 3000:
            L.llama_memory_seq_rm(mem, 0, -1, -1)
            prompt = [rng.randrange(n_vocab) for _ in range(rng.randrange(5, 40))]
            decode(prompt, 0)
            n = len(prompt)
        k = rng.choice([1, 1, 1, 2, 3, 4, 5, 8, 12, 16])  # a draft and the last committed token
        decode([rng.randrange(n_vocab) for _ in range(k)], n)
        n += rng.randrange(1, k + 1)  # what was accepted
        L.llama_memory_seq_rm(mem, 0, n, -1)  # the rejected tail goes
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--flash-attn", choices=["on", "off", "auto"], default="auto")
    ap.add_argument("--seeds", default="1-10", help="a range A-B or a comma-separated list")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process: one seed
    a = ap.parse_args()
    fa = {"on": 1, "off": 0, "auto": -1}[a.flash_attn]
    if a.one is not None:
        replay(a.model, a.rounds, a.one, fa)
        return 0
    lo, _, hi = a.seeds.partition("-")
    seeds = range(int(lo), int(hi) + 1) if hi else [int(s) for s in a.seeds.split(",")]
    crashed = 0
    for seed in seeds:
        cmd = [sys.executable, __file__, a.model, "--flash-attn", a.flash_attn, "--rounds", str(a.rounds)]
        r = subprocess.run([*cmd, "--one", str(seed)], capture_output=True, text=True)
        died = r.returncode < 0 and signal.Signals(-r.returncode).name
        crashed += bool(r.returncode)
        print(f"seed {seed}: {'ok' if r.returncode == 0 else died or f'exit {r.returncode}'}", flush=True)
    print(f"{crashed} of {len(seeds)} seeds failed (flash attention {a.flash_attn})")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
