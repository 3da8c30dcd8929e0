#!/usr/bin/env python3
"""The target's own MTP heads against target-only decoding, on a model big enough to time.

    python scripts/mtp_bench.py --runs 5 --prompt-tokens 1000 -n 64 [--layers 12 --width 1024 --vocab 32000]

No GGUF with NextN heads is on the package index, so this writes one with the test fixtures' recipe
(tests/tiny_models.py: mimo2, two chained heads, each a perturbed copy of the layer the target leans on) at a
size where the costs are a real model's in proportion: a 12-layer, 1024-wide trunk with a 32,000-token vocabulary
(its output head costs a fifth of a token's trunk, as Qwen3.5-9B's costs a sixth). Its text is noise and its
heads' acceptance says nothing of a trained model's; what it measures is what the heads cost: before the first
token (the prompt's last rows, their logits and the heads' pass over them), and per drafted token.

Each run is a fresh `specdec generate --json --no-lookup-cache` process on a prompt of its own (a different seed
each run), the drafters interleaved (none, mtp, auto, then mtp, none, auto...), -t 2, the specdec cache in a
temporary folder (auto measures its cost curve at its first run, inside that run's prefill, and keeps it). Prints every run, then medians and the
ratios to target-only of time to first token, prefill, wall time and generation rate, and the heads' cost per
drafted token against the target's own per-token decode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import numpy as np  # noqa: E402

import tiny_models as tm  # noqa: E402

DRAFTERS = ("none", "mtp", "auto")


def write(path: Path, layers: int, width: int, vocab: int) -> Path:
    """The fixtures' mtp model at this size (their writers read the module's dimensions)."""
    tm.N_EMBD, tm.N_HEAD, tm.N_HEAD_KV, tm.N_FF = width, width // 64, width // 256, width * 11 // 4
    tm.MIMO2_LAYERS, tm.MIMO2_SWA = layers, [i % 2 == 1 for i in range(layers)]  # every other: a window
    tokens = tm.byte_vocab() + [f"<x{i}>" for i in range(vocab - 259)]
    weights = tm.mimo2_weights(1234, len(tokens), heads=2)
    weights = {k: v.astype(np.float16) if v.ndim == 2 else v for k, v in weights.items()}
    return tm.write_mimo2(path, weights, tokens)


def prompt(n: int, seed: int) -> str:
    """About n tokens of words (the byte vocabulary: a token a character)."""
    rng = np.random.default_rng(seed)
    words = ["the", "model", "drafts", "heads", "token", "verify", "cache", "answer", "prompt", "layer", "state"]
    out = ""
    while len(out) < n - 1:
        out += words[rng.integers(len(words))] + " "
    return out[: n - 1]


def run(model: Path, drafter: str, text: str, n: int, threads: int, home: Path) -> dict:
    """One fresh process; its specdec cache in `home` (auto's cost curve, measured at its first run and kept for
    the others, as a user's is), no lookup cache (no run drafts from another's answer)."""
    cmd = [sys.executable, "-m", "specdec_cli", "generate", text, "--target", str(model), "--drafter", drafter]
    cmd += ["--no-chat", "--json", "-n", str(n), "-t", str(threads), "-c", str(2 * len(text) + n + 64)]
    cmd += ["--no-lookup-cache"]
    env = os.environ | {"SPECDEC_HOME": str(home)}
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        sys.exit(f"{drafter}: exit {done.returncode}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = write(Path(tmp) / "mtp-bench.gguf", args.layers, args.width, args.vocab)
        print(
            f"{model.name}: {model.stat().st_size / 1e6:,.0f} MB, {args.layers} layers x {args.width}, "
            f"vocabulary {args.vocab:,}, 2 heads; prompt {args.prompt_tokens} tokens, -n {args.n}"
        )
        rows: dict[str, list[dict]] = {d: [] for d in DRAFTERS}
        for r in range(args.runs):
            order = DRAFTERS if r % 2 == 0 else (DRAFTERS[1], DRAFTERS[0], DRAFTERS[2])
            text = prompt(args.prompt_tokens, seed=r)
            for drafter in order:
                s = run(model, drafter, text, args.n, args.threads, Path(tmp))["stats"]
                rows[drafter].append(s)
                mine = s["by_drafter"].get("mtp", {})
                print(
                    f"run {r} {drafter:<5} ttft {s['ttft_seconds']:.3f} s  prefill {s['prefill_seconds']:.3f} s  "
                    f"wall {s['wall_seconds']:.3f} s  gen {s['tokens_per_second']:.1f} t/s  heads drafted "
                    f"{mine.get('drafted', 0)} accepted {mine.get('accepted', 0)} "
                    f"{mine.get('draft_ms_per_token') or 0:.2f} ms/token",
                    flush=True,
                )

    def med(drafter: str, key: str) -> float:
        return statistics.median(s[key] for s in rows[drafter])

    print("\nmedians, and the ratio to target-only (none) of each run's own interleaved pair, median:")
    for drafter in DRAFTERS:
        ratios = {
            key: statistics.median(a[key] / b[key] for a, b in zip(rows[drafter], rows["none"]))
            for key in ("ttft_seconds", "prefill_seconds", "wall_seconds", "tokens_per_second")
        }
        print(
            f"  {drafter:<5} ttft {med(drafter, 'ttft_seconds'):.3f} s ({ratios['ttft_seconds']:.3f}x)  "
            f"prefill {med(drafter, 'prefill_seconds'):.3f} s ({ratios['prefill_seconds']:.3f}x)  "
            f"wall {med(drafter, 'wall_seconds'):.3f} s ({ratios['wall_seconds']:.3f}x)  "
            f"generation {med(drafter, 'tokens_per_second'):.1f} t/s ({ratios['tokens_per_second']:.3f}x)"
        )
    heads = [s["by_drafter"]["mtp"] for s in rows["mtp"] if s["by_drafter"].get("mtp", {}).get("drafted")]
    plain = statistics.median(1000 / s["tokens_per_second"] for s in rows["none"])
    if heads:
        ms = statistics.median(h["draft_ms_per_token"] for h in heads)
        accept = sum(h["accepted"] for h in heads) / sum(h["drafted"] for h in heads)
        print(
            f"  heads: {ms:.2f} ms per drafted token, target {plain:.2f} ms per token: c = {ms / plain:.3f}; "
            f"accepted {accept:.1%} (a synthetic model's: not a trained head's)"
        )


if __name__ == "__main__":
    main()
