#!/usr/bin/env python3
"""Greedy identity of speculative output with target-only output, with and without exact mode.

    python scripts/exact_identity.py --target T.gguf --draft D.gguf [-n 64] \
        [--prompts spec-bench --prompts scripts/long-edits.jsonl] [--modes fast,exact]

For every prompt, every configuration (the draft model at k = 1, 3, 4, 8, 16 and with 2 and 3 branches,
lookup at k = 4 and auto, auto) is compared token for token with `--drafter none` in the same mode. Prints,
per mode and configuration, how many outputs are identical and where the first divergence was.
"""

from __future__ import annotations

import argparse
import sys

from specdec_cli.bench import suite
from specdec_cli.engine.stats import collect
from specdec_cli.session import RunConfig, open_session

# (label, drafter, k (None: auto), branches)
CONFIGS = [
    *((f"model k={k}", "model", k, 1) for k in (1, 3, 4, 8, 16)),
    ("model k=4 branches=2", "model", 4, 2),
    ("model k=4 branches=3", "model", 4, 3),
    ("lookup k=4", "lookup", 4, 1),
    ("lookup k=auto", "lookup", None, 1),
    ("auto", "auto", None, 1),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", action="append", help="spec-bench or a JSONL/text file (repeatable)")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--modes", default="fast,exact")
    args = ap.parse_args()
    prompts = [p for source in args.prompts or [suite.SUITE_NAME] for p in suite.load(source, None)]
    for mode in args.modes.split(","):
        cfg = RunConfig(
            target=args.target, draft=args.draft, drafter="model", threads=args.threads,
            max_tokens=args.max_tokens, ctx_size=args.ctx_size, exact=mode == "exact",
        )  # fmt: skip
        same = {label: 0 for label, *_ in CONFIGS}
        diverged: dict[str, list[str]] = {label: [] for label, *_ in CONFIGS}
        with open_session(cfg) as s:
            for i, p in enumerate(prompts):
                tokens = s.prompt_tokens(p.text)
                base = collect(s.generate(tokens, drafter="none")).tokens
                for label, drafter, k, branches in CONFIGS:
                    got = collect(s.generate(tokens, drafter=drafter, draft_tokens=k, branches=branches)).tokens
                    if got == base:
                        same[label] += 1
                    else:
                        at = next((j for j, (a, b) in enumerate(zip(got, base)) if a != b), min(len(got), len(base)))
                        diverged[label].append(f"#{i}@{at}")
                print(f"  [{mode}] prompt {i + 1}/{len(prompts)} ({len(tokens)} tokens) done", file=sys.stderr)
        print(f"\n{mode} mode, {len(prompts)} prompts, {args.max_tokens} tokens each: identical to --drafter none")
        for label, *_ in CONFIGS:
            where = f"  diverged: {' '.join(diverged[label])}" if diverged[label] else ""
            print(f"  {label:<22} {same[label]:>3}/{len(prompts)} ({same[label] / len(prompts):.0%}){where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
