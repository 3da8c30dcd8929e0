#!/usr/bin/env python3
"""Per request, two `specdec batch` results files of the same requests side by side: generation speed
(speculative.tokens_per_second) of each, their ratio, and whether the texts are identical.

    SPECDEC_LOOKUP_CACHE=$(mktemp -d) specdec batch scripts/repeat-edits.jsonl -o auto.jsonl -n 512 -t 2
    specdec batch scripts/repeat-edits.jsonl -o none.jsonl -n 512 -t 2 --drafter none
    python scripts/batch_speedups.py none.jsonl auto.jsonl --items 6-10

The first file is the baseline. --items A-B also prints the median ratio over those items (1-based).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["custom_id"]: r["response"]["body"] for r in rows if r["response"]["status_code"] == 200}


def text(body: dict) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("baseline", type=Path)
    p.add_argument("other", type=Path)
    p.add_argument("--items", help="A-B: the median ratio over items A..B (1-based, in the baseline's order)")
    a = p.parse_args()
    base, other = load(a.baseline), load(a.other)
    ratios = []
    for i, (cid, b) in enumerate(base.items(), 1):
        o = other.get(cid)
        if o is None:
            continue
        tb, to = b["speculative"]["tokens_per_second"], o["speculative"]["tokens_per_second"]
        ratios.append(to / tb)
        drafters = {k: v["rounds"] for k, v in o["speculative"]["by_drafter"].items()}
        print(f"{i:>3} {cid}: {tb:6.2f} -> {to:6.2f} tok/s = {to / tb:.2f}x, mean accepted "
              f"{o['speculative']['mean_accepted']:.2f}, identical {text(b) == text(o)}, rounds {drafters}")  # fmt: skip
    print(f"all: median {statistics.median(ratios):.2f}x")
    if a.items:
        lo, hi = map(int, a.items.split("-"))
        print(f"items {lo}-{hi}: median {statistics.median(ratios[lo - 1 : hi]):.2f}x")


if __name__ == "__main__":
    main()
