#!/usr/bin/env python3
"""EAGLE-3 and DFlash drafting in specdec against llama.cpp's own loop on the same files: what a round costs.

    python scripts/native_bench.py --runs 5 -n 200 -k 4 [--smollm2]

Pairs: the test fixtures' counting target with its EAGLE-3 and DFlash drafts (tests/native_models.py: tiny, so what
a round costs is nearly all host time: Python, ctypes, numpy, llama.cpp's graph set-up), and with --smollm2
SmolLM2-135M with random drafts of its proportions (a real model's layers, its 49k-token head; they draft nothing
right, so every round is one drafted set and a rejection). Each run is greedy, -t 2, the raw prompt (no chat
template), from a fresh start: llama.cpp's
`llama-speculative-simple` (scripts/llama_reference.py builds it) and a fresh specdec session, interleaved (llama.cpp,
specdec, llama.cpp, ...), medians of --runs.

Per pair: generation tokens/s (after the prompt), rounds, and per round and per drafted token the drafter's time:
llama.cpp's draft() (its draft decodes included; its process() of the target's rows, which it runs after every
target decode, is outside it), and specdec's propose (feeding the target's rows included: it feeds them there), of
which the draft's own decodes, and the host time left (Python, ctypes, numpy); and the tap's time reading the target's
layer inputs (host time on every target decode).

Then the cost model's prediction (drafting/cost.py, as auto computes it) on a GPU-like curve (an H100's: verifying
2-8 tokens 1.2x one, 16 1.6x, 32 1.7x; README, Exact output) for an EAGLE-3 step and a DFlash block at a few costs and
acceptances: the draft length auto takes and the speed-up it expects.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import llama_reference  # noqa: E402
import native_models as nm  # noqa: E402
import numpy as np  # noqa: E402

from specdec_cli.drafting.cost import Costs, best_length  # noqa: E402
from specdec_cli.engine.events import Prefilled, Round, Stopped  # noqa: E402
from specdec_cli.options import RunConfig  # noqa: E402
from specdec_cli.session import open_session  # noqa: E402

PROMPT = "abcdefghijklmnopqrstuvwxyz"
SMOL_PROMPT = "The old lighthouse keeper climbed the narrow stairs, and at the top he found"


def ours(target: Path, draft: Path, kind: str, k: int, n: int, prompt: str) -> dict:
    cfg = RunConfig(target=target, draft=draft, drafter=kind, draft_tokens=k, max_tokens=n, threads=2, ctx_size=4096)
    cfg = cfg.override(chat=False)  # the raw prompt, as llama-speculative-simple reads it
    with open_session(cfg) as s:
        events = s.generate(s.prompt_tokens(prompt))
        rounds, t0, t1 = [], None, None
        for e in events:
            if isinstance(e, Prefilled):
                t0 = time.perf_counter()
            elif isinstance(e, Round):
                rounds.append(e)
            elif isinstance(e, Stopped):
                t1 = time.perf_counter()
        cache = s.home.hidden()
        tokens = sum(r.emitted for r in rounds)
        drafted = sum(r.drafted for r in rounds)
        return {
            "tok_s": tokens / (t1 - t0),
            "rounds": len(rounds),
            "drafted": drafted,
            "accepted": sum(r.accepted for r in rounds),
            "draft_ms": 1e3 * sum(r.draft_seconds for r in rounds),
            "decode_ms": 1e3 * cache.ctx.decode_seconds,
            "tap_ms": 1e3 * cache.tap.seconds,
        }


def theirs(target: Path, draft: Path, kind: str, k: int, n: int, prompt: str) -> dict:
    t = llama_reference.timed(target, draft, f"draft-{kind}", k, n, prompt)
    return {"tok_s": t.tokens / t.seconds, "rounds": t.rounds, "drafted": t.drafted, "accepted": t.accepted,
            "draft_ms": t.draft_ms}  # fmt: skip


def report(name: str, runs: dict[str, list[dict]]) -> None:
    def med(who: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[who])

    print(f"\n{name}")
    print(f"  {'':10} {'gen tok/s':>10} {'rounds':>7} {'accept':>7} {'draft ms/round':>15} {'ms/drafted token':>17}")
    for who in ("llama.cpp", "specdec"):
        rounds, drafted = med(who, "rounds"), med(who, "drafted")
        accept = med(who, "accepted") / max(drafted, 1)
        per_round, per_token = med(who, "draft_ms") / rounds, med(who, "draft_ms") / max(drafted, 1)
        print(f"  {who:10} {med(who, 'tok_s'):10.1f} {rounds:7.0f} {accept:7.1%} {per_round:15.3f} {per_token:17.3f}")
    rounds = med("specdec", "rounds")
    decode, draft, tap = med("specdec", "decode_ms"), med("specdec", "draft_ms"), med("specdec", "tap_ms")
    print(
        f"  specdec's draft time a round: {decode / rounds:.3f} ms in the draft's decodes, {(draft - decode) / rounds:.3f} ms"
        f" host; reading the target's layer inputs {tap / rounds:.3f} ms a round"
    )
    print(f"  specdec / llama.cpp generation rate: {med('specdec', 'tok_s') / med('llama.cpp', 'tok_s'):.2f}x")


WORDS = "the keeper climbed stairs lamp light storm ship harbor night wave rock bottle message sea wind".split()


def overhead(target: Path, draft: Path, runs: int, n: int) -> None:
    """auto with the draft against the target alone (--drafter none) and against auto without it, fresh sessions
    interleaved, a 700-token prompt of words in no order (lookup finds nothing to copy): time to first token and
    wall time, medians of each run's ratio. auto keeps a draft of the target's hidden states only where its cost
    model says it can pay, and feeds it only from the round it first drafts with it.

    Every timed run starts from the cost curve an untimed first run kept (its own folder, restored each time), as a
    user's next run does: a kept curve is otherwise dropped after a long prompt (plain decoding observed more than
    curves.DRIFT off the curve measured on a short context) and measured again, about a second, in every other run,
    whatever the draft, which would hide what the draft costs."""
    rng = np.random.default_rng(0)
    text = " ".join(rng.choice(WORDS, 600))
    names = ("none", "auto", "auto+draft")
    runs_of: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for timed in [False] + [True] * runs:
            for name in names:
                drafter, with_draft = ("none", False) if name == "none" else ("auto", name == "auto+draft")
                cfg = RunConfig(target=target, draft=draft if with_draft else None, drafter=drafter, max_tokens=n,
                                threads=2, ctx_size=4096).override(chat=False, lookup_cache=False)  # fmt: skip
                kept, folder = Path(tmp) / f"{name}.kept", Path(tmp) / name
                if timed:
                    shutil.rmtree(folder, ignore_errors=True)
                    shutil.copytree(kept, folder)
                os.environ["SPECDEC_COST_CURVES"] = str(folder)
                with open_session(cfg) as s:
                    t0, first = time.perf_counter(), None
                    for e in s.generate(s.prompt_tokens(text)):
                        if isinstance(e, Round) and first is None:
                            first = time.perf_counter() - t0
                    if timed:
                        assert s.curve.source in (None, "cached"), s.curve.source
                        runs_of[name].append((first, time.perf_counter() - t0))
                if not timed:
                    folder.mkdir(exist_ok=True)  # (--drafter none keeps none)
                    shutil.copytree(folder, kept)
    os.environ.pop("SPECDEC_COST_CURVES")
    med = statistics.median
    print(f"\nauto with {draft.name} ({runs} runs, a ~700-token prompt, {n} tokens, a kept cost curve), medians of")
    print("each run's ratio:")
    for base in ("none", "auto"):
        ttft = med(a[0] / b[0] for a, b in zip(runs_of["auto+draft"], runs_of[base]))
        wall = med(a[1] / b[1] for a, b in zip(runs_of["auto+draft"], runs_of[base]))
        print(f"  against {base:5}: time to first token {ttft:.3f}x, wall {wall:.3f}x")


def predictions() -> None:
    """The cost model on a GPU-like curve: auto's draft length and expected speed-up."""
    t1 = 0.0024  # an H100's one-token decode of a 1.5B model (docs/gpu.md)
    gpu = Costs({1: t1, 2: 1.2 * t1, 8: 1.2 * t1, 16: 1.6 * t1, 32: 1.7 * t1}, None, 32)
    print("\nthe cost model on a GPU-like curve (t(2..8) = 1.2 t(1), t(16) = 1.6, t(32) = 1.7):")
    print(f"  {'drafter':9} {'draft cost':>11} {'accept':>7} {'k':>3} {'expected':>9}")
    for kind, c, block in (
        ("eagle3", 0.15, False),
        ("eagle3", 0.3, False),
        ("dflash", 0.3, True),
        ("dflash", 0.6, True),
    ):
        for a in (0.6, 0.7, 0.8):
            spend = [c * t1] * 15 if block else c * t1
            k, rate, _ = best_length([a] * 15, gpu, spend)
            unit = "a block" if block else "a token"
            print(f"  {kind:9} {c:5.2f} t(1) {unit:>7} {a:4.0%}  {k:3d} {rate * t1:8.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M with random drafts of its proportions")
    a = ap.parse_args()
    if llama_reference.tool() is None:
        print("error: llama-speculative-simple is not built", file=sys.stderr)
        print("hint: python scripts/llama_reference.py build", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        files = nm.write_native_set(Path(tmp))
        pairs = [
            (f"counter <- {kind} (tiny)", files["counter"], files[kind], kind, PROMPT) for kind in ("eagle3", "dflash")
        ]
        smol_drafts: list[Path] = []
        if a.smollm2:
            from specdec_cli.models import store
            from specdec_cli.models.catalog import SMOLLM2

            smol = store.ensure(SMOLLM2)
            for kind in ("eagle3", "dflash"):
                draft = nm.write_like(smol, Path(tmp) / f"smol-{kind}.gguf", kind)
                pairs.append((f"SmolLM2-135M <- random {kind} of its proportions", smol, draft, kind, SMOL_PROMPT))
                smol_drafts.append(draft)
        for name, target, draft, kind, prompt in pairs:
            runs = {"llama.cpp": [], "specdec": []}
            for _ in range(a.runs):
                runs["llama.cpp"].append(theirs(target, draft, kind, a.k, a.n, prompt))
                runs["specdec"].append(ours(target, draft, kind, a.k, a.n, prompt))
            report(name, runs)
        if a.smollm2:
            for draft in smol_drafts:
                overhead(smol, draft, a.runs, 64)
    predictions()
    return 0


if __name__ == "__main__":
    sys.exit(main())
