#!/usr/bin/env python3
"""Engine benchmark: specdec's tokens/s and per-round Python overhead, optionally beside llama.cpp's
own `llama-speculative-simple` on the same prompt and settings (runs interleaved, medians reported).

    python scripts/bench_engine.py --target T.gguf --draft D.gguf -k 3 -n 128 -t 2 --runs 5 \
        [--llama-speculative-simple /path/to/llama-speculative-simple]

Overhead = generation time not spent inside llama_decode, per round: sampling, acceptance,
bookkeeping and rollback. Build llama-speculative-simple yourself (see README, "Performance").

Peers on a prompt file: specdec's lookup (`auto`, and `lookup -k auto` without a draft) beside
llama.cpp's n-gram drafters (`--spec-type ngram-simple`, `ngram-map-k`, `ngram-mod`, their default
settings, the target alone), every prompt's runs interleaved, with specdec's target-only run as the
common baseline:

    python scripts/bench_engine.py --target T.gguf --draft D.gguf -n 256 -t 2 --runs 1 \
        --prompts scripts/edit-set.jsonl --peers ngram-simple,ngram-map-k,ngram-mod \
        --llama-speculative-simple /path/to/llama-speculative-simple [--json out.json]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from specdec_cli.engine.events import Prefilled
from specdec_cli.run_inputs import Inputs
from specdec_cli.engine.stats import collect
from specdec_cli.session import RunConfig, open_session

DEFAULT_PROMPT = "Write a Python function that checks whether a number is prime, with a docstring and tests."


def run_specdec(session, tokens: list[int], ctxs) -> dict:
    before = []

    def mark(event) -> None:
        if isinstance(event, Prefilled):  # decode time from here on belongs to the rounds
            before.append(sum(c.decode_seconds for c in ctxs))

    stats = collect(session.generate(tokens), mark).stats
    decode = sum(c.decode_seconds for c in ctxs) - before[0]
    return {
        "tokens_per_second": stats.tokens_per_second,
        "accept_rate": stats.accept_rate,
        "mean_accepted": stats.mean_accepted,
        "generated": stats.generated_tokens,
        "overhead_ms_per_round": 1000 * (stats.generation_seconds - decode) / max(stats.rounds, 1),
    }


def run_llama_cpp(binary: str, cfg: RunConfig, prompt_file: str, spec_type: str | None = None) -> dict:
    cmd = [binary, "-m", str(cfg.target), "--temp", "0", "-t", str(cfg.threads), "-c", str(cfg.ctx_size),
           "-n", str(cfg.max_tokens), "-f", prompt_file]  # fmt: skip
    if spec_type:
        cmd += ["--spec-type", spec_type]
    elif cfg.drafter == "model":
        cmd += ["-md", str(cfg.draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(cfg.draft_tokens),
                "-td", str(cfg.threads)]  # fmt: skip
    log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    acc = re.search(r"accept\s+=\s+([\d.]+)%", log)
    if not m:
        sys.exit(f"could not read llama.cpp's timing from its log:\n{log[-2000:]}")
    return {"tokens_per_second": int(m[1]) / float(m[2]), "accept_rate": float(acc[1]) / 100 if acc else None}


def peers(args, cfg: RunConfig) -> None:
    """Every prompt of a file: specdec none / auto / lookup beside llama.cpp's n-gram drafters."""
    import json

    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    mine = ["none"] + [m for m in args.mine.split(",") if m and (m != "auto" or cfg.draft)]
    theirs = [t for t in args.peers.split(",") if t]
    names = mine + theirs
    results: dict[str, list[list[float]]] = {n: [[] for _ in prompts] for n in names}
    with open_session(cfg) as session, tempfile.TemporaryDirectory() as tmp:
        files, encoded = [], []
        for i, p in enumerate(prompts):
            text = session.target.builtin_chat([("user", p["prompt"])])
            files.append(Path(tmp) / f"{i}.txt")
            files[-1].write_text(text)
            encoded.append(session.target.tokenize(text, special=True))
        collect(session.generate(encoded[0], drafter="none"))  # warm-up: page in the weights
        for _ in range(args.runs):
            for i, p in enumerate(prompts):  # interleaved: every method on a prompt, then the next prompt
                for name in mine:
                    events = session.generate(
                        encoded[i], Inputs(instruction=p["prompt"], corpus=None), drafter=name, draft_tokens=None
                    )
                    results[name][i].append(collect(events).stats.tokens_per_second)
                for spec in theirs:
                    results[spec][i].append(run_llama_cpp(args.cpp, cfg, str(files[i]), spec)["tokens_per_second"])
    med = {n: [statistics.median(r) for r in results[n]] for n in names}
    print(f"{len(prompts)} prompts from {args.prompts}, n={cfg.max_tokens}, threads={cfg.threads}, runs={args.runs} "
          "(medians; speed-ups over specdec target-only on the same prompt)")  # fmt: skip
    print(f"{'prompt':24s} " + " ".join(f"{n:>13s}" for n in names[1:]))
    for i, p in enumerate(prompts):
        cells = " ".join(f"{med[n][i] / med['none'][i]:12.2f}x" for n in names[1:])
        print(f"{i:2d} {p.get('category', ''):21s} {cells}")
    summary = {n: statistics.median(med[n][i] / med["none"][i] for i in range(len(prompts))) for n in names[1:]}
    print(f"{'median':24s} " + " ".join(f"{summary[n]:12.2f}x" for n in names[1:]))
    if theirs:
        best = max(theirs, key=lambda t: summary[t])
        for name in [n for n in mine if n != "none"]:
            ratios = [med[name][i] / max(med[t][i] for t in theirs) for i in range(len(prompts))]
            print(f"specdec {name} / best llama.cpp n-gram drafter per prompt: median {statistics.median(ratios):.2f}x "
                  f"(min {min(ratios):.2f}x); over the best overall ({best}): {summary[name] / summary[best]:.2f}x")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"prompts": prompts, "tokens_per_second": med}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-c", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--llama-speculative-simple", dest="cpp")
    ap.add_argument("--prompts", help="a prompt file (JSON Lines, as `specdec bench --prompts`): the peers mode")
    ap.add_argument("--peers", default="", help="llama.cpp --spec-type values to run beside specdec, comma-separated")
    ap.add_argument("--json", help="write the peers mode's medians here")
    ap.add_argument("--mine", default="auto,lookup", help="specdec drafters in the peers mode (auto needs --draft)")
    args = ap.parse_args()
    if args.prompts:
        if args.peers and not args.cpp:
            ap.error("--peers needs --llama-speculative-simple")
        cfg = RunConfig(
            target=Path(args.target), draft=Path(args.draft) if args.draft else None,
            drafter="auto" if args.draft else "lookup", draft_tokens=None, max_tokens=args.n, threads=args.t,
            ctx_size=args.c, lookup_cache=False,
        )  # fmt: skip
        return peers(args, cfg)
    if args.cpp and not args.draft:
        ap.error("--llama-speculative-simple needs --draft (the C++ tool always speculates)")

    cfg = RunConfig(
        target=Path(args.target), draft=Path(args.draft) if args.draft else None,
        drafter="model" if args.draft else "none", draft_tokens=args.k, max_tokens=args.n,
        threads=args.t, ctx_size=args.c,
    )  # fmt: skip
    with open_session(cfg) as session, tempfile.NamedTemporaryFile("w", suffix=".txt") as pf:
        text = session.target.builtin_chat([("user", args.prompt)])
        pf.write(text)
        pf.flush()
        tokens = session.target.tokenize(text, special=True)
        ctxs = [c for c in (session.target_ctx, session.draft_ctx) if c]
        run_specdec(session, tokens, ctxs)  # warm-up: page in the weights
        ours, theirs = [], []
        for _ in range(args.runs):  # interleaved so that machine drift hits both alike
            ours.append(run_specdec(session, tokens, ctxs))
            if args.cpp:
                theirs.append(run_llama_cpp(args.cpp, cfg, pf.name))

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    print(f"prompt tokens {len(tokens)}, drafter {cfg.drafter}, k={cfg.draft_tokens}, n={cfg.max_tokens}, "
          f"threads={cfg.threads}, runs={args.runs} (medians)")  # fmt: skip
    print(f"specdec   {med(ours, 'tokens_per_second'):7.2f} tokens/s  accept {med(ours, 'accept_rate'):.1%}  "
          f"mean accepted {med(ours, 'mean_accepted'):.2f}  overhead {med(ours, 'overhead_ms_per_round'):.3f} ms/round")  # fmt: skip
    if theirs:
        acc = med(theirs, "accept_rate") if theirs[0]["accept_rate"] is not None else float("nan")
        print(f"llama.cpp {med(theirs, 'tokens_per_second'):7.2f} tokens/s  accept {acc:.1%}")
        ratios = [o["tokens_per_second"] / t["tokens_per_second"] for o, t in zip(ours, theirs)]
        print(f"ratio specdec / llama.cpp: median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
