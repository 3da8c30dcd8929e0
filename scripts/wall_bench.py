"""Wall time, time to first token and generation speed of drafters against target-only, as a user waits for them.

One session (the models loaded once, as in a server or a batch), every prompt run by each drafter in turn,
`--runs` times, the order alternating between runs (ABBA), so that drift on a shared machine hits both alike.
The clock runs from the call to the last token, so it counts everything a user waits for: the drafter's
set-up (auto's cost curve, kept between processes), both models' prefill, generation. No lookup cache: every
run answers a prompt for the first time (a repeated prompt would draft from its own earlier answer).

Per category and overall: the medians over runs of each prompt's wall time and time to first token, summed over
the category's prompts, as ratios to the baseline (the first drafter); generation tokens/s likewise. Without
--exact, greedy answers may part at a near-tie and differ in length: a run's wall time is then taken at the
baseline's length (its generation time scaled by the baseline's tokens over its own), so that a longer answer
is not counted as a slower one; `same` says on how many prompts every run's answer was the baseline's.

It uses only the package's Python API that older checkouts share, so the same script measures an older
release: `PYTHONPATH=/path/to/old/checkout python scripts/wall_bench.py ...` (then compare the ratios).

    python scripts/wall_bench.py --prompts scripts/general.jsonl --runs 3 -n 128 -t 2 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from specdec_cli.bench import suite
from specdec_cli.run_inputs import Inputs
from specdec_cli.engine.events import Token
from specdec_cli.engine.stats import collect
from specdec_cli.models import store
from specdec_cli.models.catalog import QWEN_DRAFT, QWEN_TARGET
from specdec_cli.options import RunConfig
from specdec_cli.session import open_session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", required=True, help="a bench prompt file (JSONL with category and prompt)")
    ap.add_argument("--drafters", default="none,auto", help="comma list; the first is the baseline")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=None)
    ap.add_argument("--target", default=None, help="default: the default pair's target")
    ap.add_argument("--draft", default=None, help="default: the default pair's draft")
    ap.add_argument("--categories", default=None, help="comma list: only these")
    ap.add_argument("--json", default=None, help="write every run's figures here")
    args = ap.parse_args()

    target = Path(args.target) if args.target else store.model_path(QWEN_TARGET)
    draft = Path(args.draft) if args.draft else store.model_path(QWEN_DRAFT)
    drafters = args.drafters.split(",")
    cats = args.categories.split(",") if args.categories else None
    prompts = suite.load(args.prompts, cats)
    cfg = RunConfig(
        target=target,
        draft=draft,
        drafter="auto",
        draft_tokens=None,
        threads=args.threads,
        max_tokens=args.max_tokens,
        ctx_size=args.ctx_size,
        lookup_cache=False,
    )
    with open_session(cfg) as session:
        encoded = [session.prompt_tokens(p.text) for p in prompts]
        longest = max(range(len(prompts)), key=lambda i: len(encoded[i]))
        for d in drafters:  # warm-up: auto's cost curve, page faults, clocks, a long prefill's first time
            _run(session, encoded[longest][-512:], prompts[longest].text, d, 8)
        runs: list[dict] = []
        for r in range(args.runs):
            order = drafters if r % 2 == 0 else drafters[::-1]
            for i, p in enumerate(prompts):
                for d in order:
                    fig = _run(session, encoded[i], p.text, d, args.max_tokens)
                    runs.append({"prompt": i, "category": p.category, "drafter": d, "run": r, **fig})
                    print(
                        f"run {r} {p.category:14} #{i:<3} {d:6} wall {fig['wall']:7.2f} s  ttft "
                        f"{fig['ttft']:6.2f} s  gen {fig['tps']:6.2f} t/s  tokens {fig['tokens']:4}  "
                        f"model rounds {fig['model_rounds']}",
                        file=sys.stderr,
                        flush=True,
                    )
    report(runs, prompts, drafters)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "args": vars(args)}, indent=1))


def _run(session, tokens: list[int], text: str, drafter: str, n: int) -> dict:
    first: list[float] = []
    t0 = time.perf_counter()

    def on_event(event) -> None:
        if isinstance(event, Token) and not first:
            first.append(time.perf_counter())

    events = session.generate(
        tokens,
        Inputs(instruction=text, corpus=None),
        drafter=drafter,
        draft_tokens=None if drafter != "none" else 4,
        max_tokens=n,
    )
    result = collect(events, on_event)
    wall = time.perf_counter() - t0
    s = result.stats
    model = s.by_drafter.get("model")
    return {
        "wall": wall,
        "ttft": (first[0] - t0) if first else wall,
        "tokens": s.generated_tokens,
        "gen_seconds": s.generation_seconds,
        "tps": s.tokens_per_second,
        "prefill": s.prefill_seconds,
        "model_rounds": model.rounds if model else 0,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "text_tokens": result.tokens,
    }


def report(runs: list[dict], prompts, drafters: list[str]) -> None:
    base = drafters[0]
    groups: dict[str, list[int]] = {"all": list(range(len(prompts)))}
    for i, p in enumerate(prompts):
        groups.setdefault(p.category, []).append(i)

    def med(d: str, i: int, key: str) -> float:
        mine = [r for r in runs if r["drafter"] == d and r["prompt"] == i]
        if key != "wall" or d == base:
            return statistics.median(r[key] for r in mine)
        length = statistics.median(r["tokens"] for r in runs if r["drafter"] == base and r["prompt"] == i)
        return statistics.median(r["wall"] - r["gen_seconds"] * (1 - length / max(r["tokens"], 1)) for r in mine)

    print(f"\nratios to {base} (sums over a category's prompts of per-prompt medians)")
    print(f"{'category':14} {'drafter':7} {'wall':>6} {'ttft':>6} {'gen t/s':>8} {'same':>5} {'model':>6}")
    for cat, idx in groups.items():
        for d in drafters[1:]:
            wall = sum(med(d, i, "wall") for i in idx) / sum(med(base, i, "wall") for i in idx)
            ttft = sum(med(d, i, "ttft") for i in idx) / sum(med(base, i, "ttft") for i in idx)
            speed = _speed(runs, d, idx) / _speed(runs, base, idx)
            same = sum(
                all(
                    r["text_tokens"] == q["text_tokens"]
                    for r in runs
                    for q in runs
                    if r["prompt"] == i == q["prompt"] and r["drafter"] == d and q["drafter"] == base
                )
                for i in idx
            )
            model = sum(r["model_rounds"] for r in runs if r["drafter"] == d and r["prompt"] in idx)
            print(f"{cat:14} {d:7} {wall:6.3f} {ttft:6.3f} {speed:8.3f} {same:>2}/{len(idx):<2} {model:6}")


def _speed(runs: list[dict], drafter: str, idx: list[int]) -> float:
    """Generation tokens/s over these prompts' runs."""
    mine = [r for r in runs if r["drafter"] == drafter and r["prompt"] in idx]
    return sum(r["tokens"] for r in mine) / sum(r["gen_seconds"] for r in mine)


if __name__ == "__main__":
    main()
