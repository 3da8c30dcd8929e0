"""How often the draft model is right with a window of the prompt against the whole prompt (--draft-window).

Every prompt is answered with `--drafter model -k K` (greedy, no lookup cache) once per window size, 0 being the
whole text, in one session; the acceptance rate and tokens per verification are summed per window over the
prompts. The target reads the whole text either way, so the answers are the same; only how often the draft is
right (and how long its prefill takes) differs.

    python scripts/window_acceptance.py --prompts scripts/general.jsonl --categories summarisation \\
        --windows 512,256,0 -n 128 -t 2
    python scripts/window_acceptance.py --prompts scripts/long-prompt.jsonl --windows 2048,1024,512,0 -n 128 -t 2
    python scripts/window_acceptance.py --prompts scripts/long-summary.jsonl --windows 2048,512,0 -n 128 -t 2
"""

from __future__ import annotations

import argparse
import sys

from specdec_cli.bench import suite
from specdec_cli.run_inputs import Inputs
from specdec_cli.engine.stats import Stats, collect
from specdec_cli.models import store
from specdec_cli.models.catalog import QWEN_DRAFT, QWEN_TARGET
from specdec_cli.options import RunConfig
from specdec_cli.session import open_session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", action="append", required=True, help="a bench prompt file (repeatable)")
    ap.add_argument("--categories", default=None, help="comma list: only these")
    ap.add_argument("--windows", default="512,256,0", help="comma list of --draft-window sizes (0: the whole text)")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=None)
    args = ap.parse_args()
    cats = args.categories.split(",") if args.categories else None
    prompts = [
        p for f in args.prompts for p in suite.load(f, None) if cats is None or p.category in cats
    ]  # over all files
    windows = [int(w) for w in args.windows.split(",")]
    cfg = RunConfig(
        target=store.model_path(QWEN_TARGET),
        draft=store.model_path(QWEN_DRAFT),
        drafter="model",
        draft_tokens=args.k,
        threads=args.threads,
        max_tokens=args.max_tokens,
        ctx_size=args.ctx_size,
        lookup_cache=False,
    )
    totals = {w: [] for w in windows}
    with open_session(cfg) as session:
        for p in prompts:
            tokens = session.prompt_tokens(p.text)
            for w in windows:
                s = collect(session.generate(tokens, Inputs(corpus=None), draft_window=w)).stats
                totals[w].append(s)
                print(
                    f"{p.category:14} {len(tokens):5} tokens  window {w or 'whole':>5}: accept {s.accept_rate:.1%}, "
                    f"{s.mean_accepted:.2f} tokens per verification",
                    file=sys.stderr,
                    flush=True,
                )
    print(f"\n{len(prompts)} prompts, --drafter model -k {args.k}, greedy, {args.max_tokens} tokens")
    whole = Stats.combine(totals[0]) if 0 in totals else None
    for w in windows:
        s = Stats.combine(totals[w])
        rel = f", {s.accept_rate / whole.accept_rate:.3f}x the whole text's" if whole and w else ""
        print(
            f"window {w or 'whole':>5}: accept rate {s.accept_rate:.1%}{rel}, {s.mean_accepted:.2f} tokens per "
            f"verification, draft time {s.draft_seconds:.1f} s"
        )


if __name__ == "__main__":
    sys.exit(main())
