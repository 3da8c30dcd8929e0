#!/usr/bin/env python3
"""`specdec batch` against one `specdec generate` call per request, as a shell script would make them.

    python scripts/batch_bench.py --requests scripts/short-requests.jsonl -n 32 --rounds 2 -- -t 2

Arguments after `--` go to both sides (the models, drafter, threads). Each round runs the whole file through
one `specdec batch` and then through one `specdec generate --json` per line, so drift on a shared machine
hits both alike; each side's time is wall time from the shell (start-up, model loads, cost curve included).
Each side gets an empty lookup cache of its own per round (a timed run must not draft from an answer it
wrote before); both start from the same kept cost curve, measured once before the first round. Prints the
requests per minute of each side per round, their ratio (median over rounds), and how many greedy texts
were identical. --generate-from ROOT also times the same generate calls from another checkout (an older
release: what a script paid before), after the two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPECDEC = [sys.executable, "-m", "specdec_cli"]


def text_of(body: dict) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def run_batch(requests: Path, args: list[str], env: dict) -> tuple[float, dict[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.jsonl"
        t0 = time.perf_counter()
        subprocess.run([*SPECDEC, "batch", str(requests), "-o", str(out), *args], env=env, check=True,
                       stderr=subprocess.DEVNULL)  # fmt: skip
        seconds = time.perf_counter() - t0
        results = [json.loads(line) for line in out.read_text().splitlines()]
    return seconds, {r["custom_id"]: text_of(r["response"]["body"]) for r in results}


def run_generate(prompts: list[tuple[str, str]], args: list[str], env: dict, root: Path | None = None
                 ) -> tuple[float, dict[str, str]]:  # fmt: skip
    texts, t0 = {}, time.perf_counter()
    env = {**env, "PYTHONPATH": str(root)} if root else env
    for custom_id, prompt in prompts:
        out = subprocess.run([*SPECDEC, "generate", "--json", *args, prompt], env=env, check=True,
                             capture_output=True, text=True, cwd=root)  # fmt: skip
        texts[custom_id] = json.loads(out.stdout)["text"]
    return time.perf_counter() - t0, texts


def main() -> None:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=Path, default=Path(__file__).parent / "short-requests.jsonl")
    p.add_argument("-n", "--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--generate-from", type=Path, help="also time the generate calls of another checkout (its root)")
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    lines = [json.loads(line) for line in a.requests.read_text().splitlines() if line.strip()]
    prompts = [(line.get("custom_id", f"line-{i}"), line["prompt"]) for i, line in enumerate(lines, 1)]
    args = ["-n", str(a.max_tokens), *rest]
    subprocess.run([*SPECDEC, "generate", "--json", *args, "Hello."], check=True, capture_output=True)  # the curve
    rounds = []
    for r in range(a.rounds):
        with tempfile.TemporaryDirectory() as c1, tempfile.TemporaryDirectory() as c2:
            batch_s, batch_t = run_batch(a.requests, args, {**os.environ, "SPECDEC_LOOKUP_CACHE": c1})
            gen_s, gen_t = run_generate(prompts, args, {**os.environ, "SPECDEC_LOOKUP_CACHE": c2})
        same = sum(batch_t.get(cid) == text for cid, text in gen_t.items())
        row = {"batch_seconds": round(batch_s, 2), "generate_seconds": round(gen_s, 2),
               "batch_rpm": round(60 * len(prompts) / batch_s, 1), "generate_rpm": round(60 * len(prompts) / gen_s, 1),
               "ratio": round(gen_s / batch_s, 2), "identical": f"{same}/{len(prompts)}"}  # fmt: skip
        if a.generate_from:
            with tempfile.TemporaryDirectory() as c3:
                old_s, old_t = run_generate(prompts, args, {**os.environ, "SPECDEC_LOOKUP_CACHE": c3},
                                            a.generate_from.resolve())  # fmt: skip
            row |= {"other_generate_seconds": round(old_s, 2), "other_generate_rpm": round(60 * len(prompts) / old_s, 1),
                    "ratio_vs_other": round(old_s / batch_s, 2),
                    "identical_vs_other": f"{sum(batch_t.get(c) == t for c, t in old_t.items())}/{len(prompts)}"}  # fmt: skip
        rounds.append(row)
        print(f"round {r + 1}: {json.dumps(row)}", file=sys.stderr)
    summary = {"requests": len(prompts), "max_tokens": a.max_tokens, "args": rest, "rounds": rounds,
               "median_ratio": statistics.median(r["ratio"] for r in rounds)}  # fmt: skip
    if a.generate_from:
        summary["median_ratio_vs_other"] = statistics.median(r["ratio_vs_other"] for r in rounds)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
