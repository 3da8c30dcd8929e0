#!/usr/bin/env python3
"""Where a short `specdec generate` call's time goes, from the shell: wall time, split into the parts its
`--json` reports (model load, prompt prefill, generation) and the rest (Python start-up and imports, auto's
cost curve, tokenizing, freeing the models), against another checkout of specdec, interleaved.

    python scripts/startup_parts.py --runs 7 --vs /path/to/older/checkout -- "What is 2+2?" -n 16 -t 2

Arguments after `--` go to `specdec generate --json --no-lookup-cache`. Each checkout runs with its own
folder first on PYTHONPATH; both share the kept cost curves. Prints the medians per part, each side, and
the fixed cost (wall time less prefill and generation) after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def one(root: Path, args: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "specdec_cli", "generate", "--json", "--no-lookup-cache", *args],
                         capture_output=True, text=True, env=env, cwd=root, check=True)  # fmt: skip
    wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import specdec_cli.cli"], env=env, cwd=root, check=True)
    imports = time.perf_counter() - t0
    s = json.loads(out.stdout)["stats"]
    parts = {"wall": wall, "python + imports": imports, "load": s.get("load_seconds", 0.0),
             "prefill": s["prefill_seconds"], "generation": s["generation_seconds"]}  # fmt: skip
    parts["rest"] = wall - sum(v for k, v in parts.items() if k != "wall")
    parts["fixed"] = wall - parts["prefill"] - parts["generation"]
    return parts


def main() -> None:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else ["What is 2+2?", "-n", "16", "-t", "2"]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--vs", type=Path, required=True, help="another checkout of specdec (its root folder)")
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    sides = {"this": HERE, "vs": a.vs.resolve()}
    for root in sides.values():  # warm: page cache, a kept curve where the checkout keeps one
        one(root, rest)
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(a.runs):
        for name, root in sides.items():
            runs[name].append(one(root, rest))
    medians = {name: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]} for name, rs in runs.items()}
    ratios = [t["fixed"] / v["fixed"] for t, v in zip(runs["this"], runs["vs"])]
    print(json.dumps({"args": rest, "runs": a.runs, "medians": medians,
                      "fixed_this_over_vs": round(statistics.median(ratios), 3)}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
