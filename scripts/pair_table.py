#!/usr/bin/env python3
"""Markdown table of accept rate and tokens/s per prompt, speculative beside target-only, same run.

    python scripts/pair_table.py [--pair default] [-k 3] [-n 128] [-t 2] [--runs 3]

Each configuration runs --runs times per prompt, interleaved, after one warm-up; medians are shown.
"""

from __future__ import annotations

import argparse
import statistics

from specdec_cli import config
from specdec_cli.cli_common import run_config
from specdec_cli.engine.stats import Stats
from specdec_cli.session import open_session

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Rename the variable `n` to `count` in this code and return the whole code:\n\n"
    "def total(xs):\n    n = 0\n    for x in xs:\n        n += x\n    return n\n",
    "Explain in two sentences what a hash table is.",
    "Translate to French: The weather is nice today and we are going to the beach.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="default")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    settings = config.resolve({"draft_tokens": args.k, "max_tokens": args.n}, args.pair, None)
    cfg = run_config(settings, threads=args.t, debug=False)
    print(f"pair {args.pair}: {cfg.target.name} <- {cfg.draft.name if cfg.draft else '-'}, greedy, "
          f"k={cfg.draft_tokens}, n={cfg.max_tokens}, {cfg.threads} threads, median of {args.runs}\n")  # fmt: skip
    print("| prompt | target only | speculative | speedup | accept rate | mean accepted | same text |")
    print("|---|---|---|---|---|---|---|")
    with open_session(cfg) as session:
        for prompt in PROMPTS:
            tokens = session.prompt_tokens(prompt)
            list(session.generate(tokens, max_tokens=4))  # warm-up
            runs = {"plain": [], "spec": []}
            outputs = {}
            for _ in range(args.runs):
                for name in ("plain", "spec"):
                    stats, ids = Stats(), []
                    for e in session.generate(tokens, drafter="model" if name == "spec" else "none"):
                        stats.add(e)
                        ids.append(getattr(e, "id", None))
                    runs[name].append(stats)
                    outputs[name] = [i for i in ids if i is not None]
            tps = {n: statistics.median(s.tokens_per_second for s in r) for n, r in runs.items()}
            spec = runs["spec"][-1]
            short = prompt.splitlines()[0][:60]
            print(f"| {short} | {tps['plain']:.1f} tok/s | {tps['spec']:.1f} tok/s | {tps['spec'] / tps['plain']:.2f}x "
                  f"| {spec.accept_rate:.1%} | {spec.mean_accepted:.2f} | {'yes' if outputs['plain'] == outputs['spec'] else 'no'} |")  # fmt: skip


if __name__ == "__main__":
    main()
