#!/usr/bin/env python3
"""Drafts of another family (another tokenizer: they draft through text) against a same-family draft and the target
alone, on the real models the package index gives.

    python scripts/foreign_bench.py [--per-set 2] [-n 64] [-k 4] [--runs 1] [--target PATH]

Target Qwen2.5-Coder-1.5B-Instruct; drafts Qwen2.5-Coder-0.5B-Instruct (its family), SmolLM2-135M-Instruct and
Gemma 3 270M (others), each at a fixed -k (--drafter model: what the draft does when it drafts every round) and under
auto (what the cost model makes of it on this machine). The prompts: the first --per-set of the built-in suite's,
scripts/general.jsonl's and scripts/code-edits.jsonl's, each run once per configuration in turn (interleaved:
every prompt runs every configuration before the next prompt), greedy, chat template on, the lookup cache off.

Prints per configuration the medians over prompts of wall time (and the speed-up by it: the target alone's wall
time over the configuration's, per prompt) and of time to first token (and its ratio to the target alone's), and summed: acceptance rate and mean accepted tokens per verification (drafted/accepted in target
tokens), the draft's milliseconds per drafted target token, and for another tokenizer's draft its own tokens fed
per target token accepted. Then what the cost model expects of each draft on a GPU-like curve (verifying 8
tokens costs 1.2x one): its measured acceptance per token (solved from accepted and drafted per round: a chain stops
at its first rejection), and a draft decode costing the target's in proportion to its file size, times its own
tokens per drafted target token (pairing.expected, as `models pair` ranks drafts). Every configuration runs once,
untimed, before the timed runs: auto measures this machine's costs at its first run (kept a day) and models load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("SPECDEC_HOME", tempfile.mkdtemp(prefix="foreign-bench-"))

from specdec_cli.bench import suite  # noqa: E402
from specdec_cli.drafting.cost import Costs  # noqa: E402
from specdec_cli.engine.stats import collect  # noqa: E402
from specdec_cli.models.layouts import model_bytes  # noqa: E402
from specdec_cli.models.pairing import expected  # noqa: E402
from specdec_cli.run_inputs import Inputs  # noqa: E402
from specdec_cli.session import RunConfig, open_session  # noqa: E402

MODELS = Path.home() / ".cache" / "specdec" / "models"
DRAFTS = {
    "qwen-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "smollm2-135m": "smollm2-135m-instruct-q4_1.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
}
GPU_LIKE = Costs({1: 1.0, 8: 1.2, 16: 1.45, 32: 2.0}, 0.0, 32)  # t(8) = 1.2 t(1): the brief's GPU figure


def prompts(per_set: int) -> list[tuple[str, str]]:
    out = [("built-in", p.text) for p in suite.load(None, None)[:per_set]]
    for name in ("general.jsonl", "code-edits.jsonl"):
        lines = (HERE / name).read_text().splitlines()[:per_set]
        out += [(name.split(".")[0], json.loads(line)["prompt"]) for line in lines]
    return out


def per_token(accepted: float, drafted: float) -> float:
    """The chance a drafted token is accepted, given the one before was (a chain stops at its first rejection): the
    a with a + a^2 + ... + a^d = accepted, d = drafted, by bisection."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        got = sum(mid**i for i in range(1, int(round(drafted)) + 1))
        lo, hi = (mid, hi) if got < accepted else (lo, mid)
    return lo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-set", type=int, default=2)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--target", type=Path, default=MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    a = ap.parse_args()
    base = dict(target=a.target, threads=2, max_tokens=a.n, ctx_size=4096, lookup_cache=False, chat=True)
    configs = {"target alone": RunConfig(**base, drafter="none")}
    for name, file in DRAFTS.items():
        configs[f"{name} -k {a.k}"] = RunConfig(**base, draft=MODELS / file, drafter="model", draft_tokens=a.k)
        configs[f"{name} auto"] = RunConfig(**base, draft=MODELS / file, drafter="auto")
    opened = {name: open_session(cfg) for name, cfg in configs.items()}
    sessions = {name: cm.__enter__() for name, cm in opened.items()}
    rows: dict[str, list] = {name: [] for name in configs}
    work = prompts(a.per_set)
    for s in sessions.values():  # untimed: auto measures this machine's costs once (kept a day), models load
        collect(s.generate(s.prompt_tokens("Say hello."), Inputs(), max_tokens=4))
    for run in range(a.runs):
        for i, (where, text) in enumerate(work):
            order = list(configs) if (i + run) % 2 == 0 else list(reversed(configs))  # interleaved, both ways
            for name in order:
                s = sessions[name]
                r = collect(s.generate(s.prompt_tokens(text), Inputs()))
                rows[name].append(r)
                st = r.stats
                print(
                    f"{where:10} {name:18} wall {st.wall_seconds:6.2f} s  ttft {st.ttft_seconds:5.2f} s  "
                    f"{st.tokens_per_second:5.2f} tok/s  accepted {st.accepted}/{st.drafted}",
                    flush=True,
                )
    alone = rows["target alone"]
    plain = sum(r.stats.generation_seconds for r in alone) / sum(r.stats.emitted for r in alone)
    print(f"\n{'configuration':18} {'wall':>7} {'speed':>6} {'ttft':>6} {'ratio':>6} {'tok/s':>6} {'accept':>7} "
          f"{'mean acc':>8} {'ms/draft tok':>12} {'fed/acc':>7}")  # fmt: skip
    summary = {}
    for name, runs in rows.items():
        wall = statistics.median(r.stats.wall_seconds for r in runs)
        ttft = statistics.median(r.stats.ttft_seconds for r in runs)
        speedup = statistics.median(b.stats.wall_seconds / r.stats.wall_seconds for r, b in zip(runs, alone))
        tratio = statistics.median(r.stats.ttft_seconds / b.stats.ttft_seconds for r, b in zip(runs, alone))
        rate = statistics.median(r.stats.tokens_per_second for r in runs)
        model = [r.stats.by_drafter.get("model") for r in runs]
        drafted = sum(m.drafted for m in model if m)
        accepted = sum(m.accepted for m in model if m)
        rounds = sum(m.rounds for m in model if m)
        emitted = sum(m.emitted for m in model if m)
        seconds = sum(m.draft_seconds for m in model if m)
        fed = sum(m.draft_fed for m in model if m)
        acc = f"{accepted / drafted:.0%}" if drafted else "-"
        mean = f"{emitted / rounds:.2f}" if rounds else "-"
        ms = f"{1000 * seconds / drafted:.1f}" if drafted else "-"
        per = f"{fed / accepted:.2f}" if accepted and any(m and m.foreign_rounds for m in model) else "-"
        print(f"{name:18} {wall:6.2f}s {speedup:5.2f}x {ttft:5.2f}s {tratio:5.2f}x {rate:6.2f} {acc:>7} {mean:>8} "
              f"{ms:>12} {per:>7}")  # fmt: skip
        summary[name] = (
            drafted / rounds if rounds else 0,
            accepted / rounds if rounds else 0,
            fed / drafted if drafted else 0,
        )
    print(f"\ntarget alone: {1000 * plain:.1f} ms a token here")
    print("\nexpected on a GPU-like curve (t(8) = 1.2 t(1)), at the acceptance measured above (fixed -k rows):")
    target_bytes = model_bytes(a.target)
    for name, file in DRAFTS.items():
        per_round, accepted, fed = summary[f"{name} -k {a.k}"]
        if not per_round:
            continue
        alpha = per_token(accepted, per_round)
        own = fed if name != "qwen-0.5b" else 1.0  # its own decodes per drafted target token
        ratio = model_bytes(MODELS / file) / target_bytes * own
        speedup, k = expected(GPU_LIKE, alpha, ratio)
        print(f"  {name:14} {accepted:.2f} of {per_round:.2f} drafted accepted a round: {alpha:.0%} a token; a drafted "
              f"token costs {ratio:.2f} of a target decode: {speedup:.2f}x at -k {k}")  # fmt: skip
    for cm in opened.values():
        cm.__exit__(None, None, None)


if __name__ == "__main__":
    main()
