#!/usr/bin/env python3
"""Two `specdec serve` processes, this checkout's and another's, answering the same chat requests: is this one
slower? For a change that must leave a path as fast as it was (a chat without tools after tool calls were added).

    git worktree add /tmp/base d1faa09
    python scripts/serve_ab.py --against /tmp/base --prompts scripts/general.jsonl --runs 3 -n 64 -- -t 2

Arguments after `--` go to both servers. Both are started on 127.0.0.1 (free ports) and stopped at the end; one
generation runs at a time (each request waits for its answer before the next is sent), so the servers never
compete for the cores. Every prompt goes to both, `--runs` times, the order alternating (ABBA). Streamed: time to
first token is the first content chunk, wall time the last byte. Per prompt the medians; overall the medians'
sums as ratios (this / against): wall, first token, and generation tokens/s. No lookup cache on either side
(--no-lookup-cache): a repeated prompt would otherwise draft from its own earlier answer. `same`: how many
prompts got the same text from both servers in every run.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).parent


class Server:
    def __init__(self, name: str, pythonpath: str | None, args: list[str]):
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        cmd = [sys.executable, "-m", "specdec_cli", "serve", "--port", "0", "--no-lookup-cache", *args]
        self.name = name
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 900)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("http://"):
            self.proc.kill()
            sys.exit(f"{name}: the server did not start")
        self.url = line.strip()

    def stream(self, prompt: str, max_tokens: int) -> dict:
        body = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        req = urllib.request.Request(
            self.url + "/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        t0 = time.perf_counter()
        first, text, tokens = None, [], 0
        with urllib.request.urlopen(req, timeout=1800) as r:
            for line in r:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                piece = event["choices"][0]["delta"].get("content") if event.get("choices") else None
                if piece:
                    first = first if first is not None else time.perf_counter() - t0
                    text.append(piece)
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
        wall = time.perf_counter() - t0
        first = first if first is not None else wall
        return {"wall": wall, "ttft": first, "tokens": tokens, "text": "".join(text)}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main() -> None:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", required=True, help="the other checkout (its folder holds specdec_cli/)")
    p.add_argument("--prompts", type=Path, default=HERE / "general.jsonl")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("-n", "--max-tokens", type=int, default=64)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if not (Path(a.against) / "specdec_cli").is_dir():
        sys.exit(f"{a.against} holds no specdec_cli/")
    prompts = [json.loads(x)["prompt"] for x in a.prompts.read_text().splitlines() if x.strip()]

    servers = []
    try:
        servers = [Server("this", str(HERE.parent.resolve()), rest), Server("against", a.against, rest)]
        for s in servers:  # warm-up: page faults, auto's cost curve
            s.stream("Say hello.", 8)
        rows = []
        for run in range(a.runs):
            for i, prompt in enumerate(prompts):
                order = servers if (run + i) % 2 == 0 else servers[::-1]
                for s in order:
                    r = s.stream(prompt, a.max_tokens)
                    rows.append({"prompt": i, "run": run, "server": s.name, **r})
                    print(
                        f"run {run} #{i:<2} {s.name:8} wall {r['wall']:6.2f} s  first {r['ttft']:5.2f} s  "
                        f"{r['tokens']:3} tokens",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for s in servers:
            s.stop()
    report(rows, len(prompts), a)


def report(rows: list[dict], n: int, a) -> None:
    def med(i: int, server: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["prompt"] == i and r["server"] == server)

    def gen_rate(i: int, server: str) -> float:
        mine = [r for r in rows if r["prompt"] == i and r["server"] == server]
        return statistics.median(r["tokens"] / max(r["wall"] - r["ttft"], 1e-9) for r in mine)

    same = sum(len({r["text"] for r in rows if r["prompt"] == i}) == 1 for i in range(n))
    summary = {}
    for key in ("wall", "ttft"):
        this = sum(med(i, "this", key) for i in range(n))
        other = sum(med(i, "against", key) for i in range(n))
        summary[key] = {"this": round(this, 2), "against": round(other, 2), "ratio": round(this / other, 3)}
    rates = [gen_rate(i, "this") / gen_rate(i, "against") for i in range(n)]
    summary["generation_rate_ratio_median"] = round(statistics.median(rates), 3)
    summary["same_text"] = f"{same}/{n}"
    print(json.dumps(summary, indent=2))
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
