"""Predicted outputs (OpenAI's `prediction`) on code edits: `--drafter auto` with the original file as the
prediction against auto without it, as a user waits for each.

Every prompt is an instruction, a blank line, then the file to edit: the file is the prediction. One session (the
models loaded once), every prompt run without and with the prediction, `--runs` times, the order alternating
between runs (ABBA) so that a neighbour's load hits both alike. No lookup cache (corpus None, as wall_bench): a
timed run must not draft from its own earlier answer. The clock runs from the call to the last token. Greedy:
both answers must be the same; `same` says on how many prompts every run's was.

Per prompt: the medians of wall time, the speed-up (without / with), the prediction's draft tokens accepted and
rejected; overall the median and the geometric mean of the per-prompt speed-ups. Beside the clock, `modelled`: each
run's rounds priced by a fixed cost curve (this machine's, measured quiet: README / design notes), the same figure
for both variants whatever a neighbour's load did to the clock. `--curve fixed` also makes auto decide by that
curve (frozen), so that both variants make the decisions a quiet machine would; `live` (default) is what a user
gets: auto's own measured curve, refined as it runs.

    python scripts/prediction_bench.py --prompts scripts/code-edits.jsonl,scripts/edit-set.jsonl --runs 2 -n 1024 -t 2

Without --exact the two variants' answers may part at a near-tie (another verify batch tips it) and then differ in
length: such a prompt compares two different answers. With --exact both are target-only's answer, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from specdec_cli.bench import suite
from specdec_cli.run_inputs import Inputs
from specdec_cli.drafting.cost import Costs
from specdec_cli.engine.events import Round
from specdec_cli.engine.stats import collect
from specdec_cli.models import store
from specdec_cli.models.catalog import QWEN_DRAFT, QWEN_TARGET
from specdec_cli.options import RunConfig
from specdec_cli.session import open_session

VARIANTS = ("auto", "auto+prediction")
# The 1.5B Q4_K_M target's decode of n tokens relative to one (28 ms), 2 threads, measured on this machine quiet;
# the 0.5B draft's token costs 0.57 of one.
CURVE = {1: 1.0, 2: 1.78, 3: 2.45, 4: 2.90, 5: 3.62, 6: 4.19, 8: 4.81, 10: 5.82, 12: 5.86, 16: 5.61, 32: 10.3}
T1, DRAFT = 0.028, 0.57


class Frozen(Costs):
    """CURVE as auto's costs, never refined: its decisions are those of a quiet machine, whatever the load."""

    def observe_verify(self, n: int, seconds: float) -> None:
        pass

    def observe_draft(self, seconds_per_token: float) -> None:
        pass

    def copy(self, n_max: int | None = None) -> Frozen:
        return self


def modelled(rounds: list[Round]) -> float:
    """Seconds the rounds take by CURVE: each verify, and each draft-model token."""
    sizes = sorted(CURVE)
    cost = np.interp([r.drafted + 1 for r in rounds], sizes, [CURVE[n] for n in sizes])
    return T1 * float(cost.sum() + DRAFT * sum(r.drafted for r in rounds if r.drafter == "model"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="scripts/code-edits.jsonl", help="comma list of bench prompt files")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=1024, help="enough for the whole answer")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--curve", choices=("live", "fixed"), default="live", help="auto's costs (see above)")
    ap.add_argument(
        "--exact", action="store_true", help="exact mode: both variants' answers are target-only's, token for token"
    )
    ap.add_argument("--json", default=None, help="write every run's figures here")
    args = ap.parse_args()

    prompts = [p for f in args.prompts.split(",") for p in suite.load(f, None)][: args.limit]
    cfg = RunConfig(
        target=store.model_path(QWEN_TARGET),
        draft=store.model_path(QWEN_DRAFT),
        drafter="auto",
        draft_tokens=None,
        threads=args.threads,
        max_tokens=args.max_tokens,
        lookup_cache=False,
        exact=args.exact,
        remeasure=True,  # the curve of this machine now, not one kept from a busier hour
    )
    runs: list[dict] = []
    with open_session(cfg) as session:
        encoded = [session.prompt_tokens(p.text) for p in prompts]
        if args.curve == "fixed":
            session.costs(encoded[0], Frozen({n: T1 * c for n, c in CURVE.items()}, T1 * DRAFT, 32))
        for variant in VARIANTS:  # warm-up: the cost curve, page faults, clocks
            _run(session, encoded[0][-256:], prompts[0].text, variant, 16)
        for r in range(args.runs):
            for i, p in enumerate(prompts):
                for variant in VARIANTS if (r + i) % 2 == 0 else VARIANTS[::-1]:
                    fig = _run(session, encoded[i], p.text, variant, args.max_tokens)
                    runs.append({"prompt": i, "category": p.category, "variant": variant, "run": r, **fig})
                    print(
                        f"run {r} #{i:<2} {p.category:15} {variant:16} wall {fig['wall']:7.2f} s  modelled "
                        f"{fig['modelled']:6.2f} s  tokens "
                        f"{fig['tokens']:4}  rounds {fig['rounds']:4}  accepted {fig['accepted']:4}  prediction "
                        f"+{fig['prediction_accepted']} -{fig['prediction_rejected']}",
                        file=sys.stderr,
                        flush=True,
                    )
    report(runs, prompts)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "args": vars(args)}, indent=1))


def prediction_of(prompt: str) -> str:
    """The file an edit prompt carries: everything after the instruction's paragraph."""
    return prompt.split("\n\n", 1)[1]


def _run(session, tokens: list[int], text: str, variant: str, n: int) -> dict:
    t0 = time.perf_counter()
    prediction = prediction_of(text) if variant == "auto+prediction" else None
    events = session.generate(tokens, Inputs(instruction=text, corpus=None, prediction=prediction), max_tokens=n)
    rounds: list[Round] = []
    result = collect(events, lambda e: rounds.append(e) if isinstance(e, Round) else None)
    s = result.stats
    return {
        "wall": time.perf_counter() - t0,
        "modelled": modelled(rounds),
        "tokens": s.generated_tokens,
        "rounds": s.rounds,
        "accepted": s.accepted,
        "prediction_accepted": s.prediction_accepted,
        "prediction_rejected": s.prediction_rejected,
        "stop": s.stop_reason,
        "text_tokens": result.tokens,
    }


def report(runs: list[dict], prompts) -> None:
    def med(i: int, variant: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["prompt"] == i and r["variant"] == variant)

    base, pred = VARIANTS
    print(
        f"\n{'#':>2} {'category':15} {'tokens':>6} {'auto s':>7} {'+pred s':>7} {'wall':>6} {'modelled':>8} {'same':>4} {'pred +/-':>9}"
    )
    walls, models, same_all = [], [], 0
    for i, p in enumerate(prompts):
        mine = [r for r in runs if r["prompt"] == i]
        same = all(r["text_tokens"] == mine[0]["text_tokens"] for r in mine)
        same_all += same
        walls.append(med(i, base, "wall") / med(i, pred, "wall"))
        models.append(med(i, base, "modelled") / med(i, pred, "modelled"))
        print(
            f"{i:>2} {p.category:15} {med(i, base, 'tokens'):>6.0f} {med(i, base, 'wall'):7.2f} {med(i, pred, 'wall'):7.2f} "
            f"{walls[-1]:6.3f} {models[-1]:8.3f} {'yes' if same else 'no':>4} "
            f"{med(i, pred, 'prediction_accepted'):>4.0f}/{med(i, pred, 'prediction_rejected'):<4.0f}"
        )
    for name, ups in (("wall", walls), ("modelled", models)):
        key = "wall" if name == "wall" else "modelled"
        total = sum(med(i, base, key) for i in range(len(prompts))) / sum(
            med(i, pred, key) for i in range(len(prompts))
        )
        geo = math.exp(sum(math.log(u) for u in ups) / len(ups))
        print(
            f"speed-up with the prediction ({name}): median {statistics.median(ups):.3f}x, geometric mean {geo:.3f}x, "
            f"total time {total:.3f}x"
        )
    print(
        f"identical text on {same_all}/{len(prompts)} prompts (greedy; without --exact a Q4 target may part at a near-tie)"
    )


if __name__ == "__main__":
    main()
