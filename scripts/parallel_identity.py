#!/usr/bin/env python3
"""How often a greedy answer generated beside other requests (`serve --parallel`'s shared steps) is the answer
alone, token for token: in exact mode always (a test checks it); in fast mode the fast kernels compute a row of a
batch differently from a single row, and a near-tie can tip.

    python scripts/parallel_identity.py --target T.gguf --draft D.gguf --slots 4 -n 64 [--exact]

Each prompt of --prompts (scripts/general.jsonl) is generated alone, then all of them --slots at a time in the
slots of one session (the same steps the server takes); prints how many answers are identical, and where the first
one that is not parts.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

from specdec_cli.batching.rendezvous import Steps
from specdec_cli.chat import Message
from specdec_cli.engine.stats import collect
from specdec_cli.run_inputs import Inputs
from specdec_cli.session import RunConfig, open_session

HERE = Path(__file__).parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--draft", type=Path)
    p.add_argument("--drafter", default="auto")
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("-n", "--max-tokens", type=int, default=64)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--exact", action="store_true")
    p.add_argument("--prompts", type=Path, default=HERE / "general.jsonl")
    a = p.parse_args()
    prompts = [json.loads(line)["prompt"] for line in a.prompts.read_text().splitlines() if line.strip()]
    cfg = RunConfig(
        target=a.target, draft=a.draft, drafter=a.drafter, threads=a.threads, exact=a.exact, lookup_cache=False
    )
    with open_session(cfg, slots=a.slots) as s:
        tokens = [s.prompt_tokens(messages=[Message("user", q)]) for q in prompts]
        alone = [collect(s.generate(t, Inputs(), max_tokens=a.max_tokens)).tokens for t in tokens]
        steps, together, lock = Steps(), {}, threading.Lock()
        free = s.open_slots(steps)

        def run(i: int) -> None:
            with lock:
                slot = free.pop()
            with steps.joined():
                together[i] = collect(s.generate(tokens[i], Inputs(), slot, max_tokens=a.max_tokens)).tokens
            with lock:
                free.append(slot)

        waiting = [threading.Thread(target=run, args=(i,)) for i in range(len(tokens))]
        running: list[threading.Thread] = []
        while waiting or any(t.is_alive() for t in running):
            running = [t for t in running if t.is_alive()]
            while waiting and len(running) < a.slots:
                running.append(waiting.pop(0))
                running[-1].start()
            steps.step(0.01)
    same = [alone[i] == together[i] for i in range(len(tokens))]
    parts = [
        next((j for j, (x, y) in enumerate(zip(alone[i], together[i])) if x != y), None) for i in range(len(tokens))
    ]
    print(
        json.dumps(
            {
                "prompts": len(tokens),
                "identical": sum(same),
                "first_difference_at": [p for p, ok in zip(parts, same) if not ok],
                "slots": a.slots,
                "exact": a.exact,
                "shared_steps": steps.shared,
                "steps": steps.steps,
            }
        )
    )


if __name__ == "__main__":
    main()
