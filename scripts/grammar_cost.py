#!/usr/bin/env python3
"""What a grammar adds to a round: the time spent in llama.cpp's grammar (checking tokens, advancing states,
masking rows), per round, for target-only decoding and for auto, over a prompt file's schemas:

    python scripts/grammar_cost.py --prompts scripts/structured.jsonl -n 200 -t 2

Every call of the grammar state's methods is timed (backend/grammar.py: after, allows, allowed, mask, copy),
the engine's and the drafters' alike; printed per drafter: rounds, ms per round in all, ms per round in the
grammar, and how many rows needed the whole-vocabulary mask.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specdec_cli.backend import grammar
from specdec_cli.run_inputs import Inputs
from specdec_cli.cli.common import assemble, resolve
from specdec_cli.engine.events import Round
from specdec_cli.session import open_session

spent = {"seconds": 0.0, "masks": 0}


def timed(name: str) -> None:
    original = getattr(grammar.GrammarState, name)

    def wrapper(self, *args):
        t0 = time.perf_counter()
        try:
            return original(self, *args)
        finally:
            spent["seconds"] += time.perf_counter() - t0
            spent["masks"] += name == "mask"

    setattr(grammar.GrammarState, name, wrapper)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, default=Path(__file__).with_name("structured.jsonl"))
    parser.add_argument("-n", "--max-tokens", type=int, default=200)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--drafters", default="none,auto")
    a = parser.parse_args()
    for name in ("after", "allows", "allowed", "mask", "copy"):
        timed(name)
    prompts = [json.loads(line) for line in a.prompts.read_text().splitlines() if line.strip()]
    given = {"threads": a.threads, "max_tokens": a.max_tokens, "draft_tokens": "auto", "lookup_cache": False}
    cfg = resolve(given, None, None)
    assemble(cfg)
    with open_session(cfg) as s:
        totals = {d: [0, 0.0, 0.0, 0, 0] for d in a.drafters.split(",")}  # rounds, seconds, grammar, masks, tokens
        for p in prompts:
            gbnf = grammar.from_schema(json.dumps(p["schema"]))
            tokens = s.prompt_tokens(p["prompt"])
            for d, tot in totals.items():
                spent.update(seconds=0.0, masks=0)
                rounds = [
                    e for e in s.generate(tokens, Inputs(corpus=None, grammar=gbnf), drafter=d) if isinstance(e, Round)
                ]
                tot[0] += len(rounds)
                tot[1] += sum(r.seconds for r in rounds)
                tot[2] += spent["seconds"]
                tot[3] += spent["masks"]
                tot[4] += sum(r.emitted for r in rounds)
    for d, (rounds, seconds, gram, masks, emitted) in totals.items():
        print(
            f"{d:5} {rounds:5} rounds, {emitted:5} tokens: {seconds / rounds * 1000:6.1f} ms a round, "
            f"grammar {gram / rounds * 1000:5.2f} ms a round ({gram / seconds:.1%}), whole-row masks {masks}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
