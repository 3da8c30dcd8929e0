#!/usr/bin/env python3
"""Engine benchmark: specdec's tokens/s and per-round Python overhead, optionally beside llama.cpp's
own `llama-speculative-simple` on the same prompt and settings (runs interleaved, medians reported).

    python scripts/bench_engine.py --target T.gguf --draft D.gguf -k 3 -n 128 -t 2 --runs 5 \
        [--llama-speculative-simple /path/to/llama-speculative-simple]

Overhead = generation time not spent inside llama_decode, per round: sampling, acceptance,
bookkeeping and rollback. Build llama-speculative-simple yourself (see README, "Performance").
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from specdec_cli.engine.events import Prefilled
from specdec_cli.engine.stats import collect
from specdec_cli.session import RunConfig, open_session

DEFAULT_PROMPT = "Write a Python function that checks whether a number is prime, with a docstring and tests."


def run_specdec(session, tokens: list[int], ctxs) -> dict:
    before = []

    def mark(event) -> None:
        if isinstance(event, Prefilled):  # decode time from here on belongs to the rounds
            before.append(sum(c.decode_seconds for c in ctxs))

    stats = collect(session.generate(tokens), mark).stats
    decode = sum(c.decode_seconds for c in ctxs) - before[0]
    return {
        "tokens_per_second": stats.tokens_per_second,
        "accept_rate": stats.accept_rate,
        "mean_accepted": stats.mean_accepted,
        "generated": stats.generated_tokens,
        "overhead_ms_per_round": 1000 * (stats.generation_seconds - decode) / max(stats.rounds, 1),
    }


def run_llama_cpp(binary: str, cfg: RunConfig, prompt_file: str) -> dict:
    cmd = [binary, "-m", str(cfg.target), "--temp", "0", "-t", str(cfg.threads), "-c", str(cfg.ctx_size),
           "-n", str(cfg.max_tokens), "-f", prompt_file]  # fmt: skip
    if cfg.drafter == "model":
        cmd += ["-md", str(cfg.draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(cfg.draft_tokens),
                "-td", str(cfg.threads)]  # fmt: skip
    log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    acc = re.search(r"accept\s+=\s+([\d.]+)%", log)
    if not m:
        sys.exit(f"could not read llama.cpp's timing from its log:\n{log[-2000:]}")
    return {"tokens_per_second": int(m[1]) / float(m[2]), "accept_rate": float(acc[1]) / 100 if acc else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-c", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--llama-speculative-simple", dest="cpp")
    args = ap.parse_args()
    if args.cpp and not args.draft:
        ap.error("--llama-speculative-simple needs --draft (the C++ tool always speculates)")

    cfg = RunConfig(
        target=Path(args.target), draft=Path(args.draft) if args.draft else None,
        drafter="model" if args.draft else "none", draft_tokens=args.k, max_tokens=args.n,
        threads=args.t, ctx_size=args.c,
    )  # fmt: skip
    with open_session(cfg) as session, tempfile.NamedTemporaryFile("w", suffix=".txt") as pf:
        text = session.target.apply_chat_template([("user", args.prompt)])
        pf.write(text)
        pf.flush()
        tokens = session.target.tokenize(text, special=True)
        ctxs = [c for c in (session.target_ctx, session.draft_ctx) if c]
        run_specdec(session, tokens, ctxs)  # warm-up: page in the weights
        ours, theirs = [], []
        for _ in range(args.runs):  # interleaved so that machine drift hits both alike
            ours.append(run_specdec(session, tokens, ctxs))
            if args.cpp:
                theirs.append(run_llama_cpp(args.cpp, cfg, pf.name))

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    print(f"prompt tokens {len(tokens)}, drafter {cfg.drafter}, k={cfg.draft_tokens}, n={cfg.max_tokens}, "
          f"threads={cfg.threads}, runs={args.runs} (medians)")  # fmt: skip
    print(f"specdec   {med(ours, 'tokens_per_second'):7.2f} tokens/s  accept {med(ours, 'accept_rate'):.1%}  "
          f"mean accepted {med(ours, 'mean_accepted'):.2f}  overhead {med(ours, 'overhead_ms_per_round'):.3f} ms/round")  # fmt: skip
    if theirs:
        acc = med(theirs, "accept_rate") if theirs[0]["accept_rate"] is not None else float("nan")
        print(f"llama.cpp {med(theirs, 'tokens_per_second'):7.2f} tokens/s  accept {acc:.1%}")
        ratios = [o["tokens_per_second"] / t["tokens_per_second"] for o, t in zip(ours, theirs)]
        print(f"ratio specdec / llama.cpp: median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
