#!/usr/bin/env python3
"""`specdec serve` against `specdec generate`, for a script that sends many short requests, and a chat's
second turn with and without prefix reuse.

    python scripts/serve_bench.py --requests 20 --json serve.json -- --drafter auto -t 2

Arguments after `--` go to both `specdec serve` and every `specdec generate` (the models, drafter and
threads). One server is started on 127.0.0.1 (a free port) and stopped at the end. Prompt i goes to the
server (streamed: time to first token is the first content chunk) and then to `specdec generate --json`,
interleaved, so that drift on a shared machine hits both alike; each side's wall time counts everything
its caller waits for (generate: start-up and model load included, as a shell loop pays it).

The chat part: a first turn (a code edit), then its second turn sent PAIRS times with `cache_prompt`
on and off alternately; the medians of the target's prefill time (`speculative.prefill_seconds`).
"""

from __future__ import annotations

import argparse
import json
import select
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SPECDEC = [sys.executable, "-m", "specdec_cli"]
HERE = Path(__file__).parent


def prompts(path: Path, n: int) -> list[str]:
    lines = [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
    return [lines[i % len(lines)] for i in range(n)]


class Server:
    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen([*SPECDEC, "serve", "--port", "0", *args], stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 600)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("http://"):
            self.proc.kill()
            sys.exit("the server did not start")
        self.url = line.strip()

    def post(self, path: str, body: dict):
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=600)

    def chat(self, messages: list[dict], max_tokens: int, **extra) -> dict:
        with self.post("/chat/completions", {"messages": messages, "max_tokens": max_tokens, **extra}) as r:
            return json.load(r)

    def stream(self, prompt: str, max_tokens: int, **extra) -> tuple[float, float, int]:
        """(time to first token, total seconds, tokens) for one streamed chat request (`extra`: more of its body)."""
        t0 = time.perf_counter()
        first, tokens = None, 0
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": True, **extra}
        with self.post("/chat/completions", body) as r:
            for line in r:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if first is None and event["choices"] and event["choices"][0]["delta"].get("content"):
                    first = time.perf_counter() - t0
                if "usage" in event:
                    tokens = event["usage"]["completion_tokens"]
        return first or 0.0, time.perf_counter() - t0, tokens

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def generate(prompt: str, max_tokens: int, args: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = subprocess.run([*SPECDEC, "generate", "--json", "-n", str(max_tokens), *args, prompt],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return time.perf_counter() - t0, len(json.loads(out.stdout)["tokens"])


def main() -> None:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--prompts", type=Path, default=HERE / "short-requests.jsonl")
    p.add_argument("-n", "--max-tokens", type=int, default=32)
    p.add_argument("--pairs", type=int, default=5, help="second chat turns with and without reuse, each")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    server = Server(rest)
    rows = []
    try:
        for i, prompt in enumerate(prompts(a.prompts, a.requests)):
            ttft, served, n_served = server.stream(prompt, a.max_tokens)
            called, n_called = generate(prompt, a.max_tokens, rest)
            rows.append({"ttft": ttft, "served": served, "served_tokens": n_served, "called": called,
                         "called_tokens": n_called})  # fmt: skip
            print(f"[{i + 1}/{a.requests}] serve {served:.2f} s (first token {ttft:.2f} s), generate {called:.2f} s",
                  file=sys.stderr)  # fmt: skip
        edit = json.loads((HERE / "code-edits.jsonl").read_text().splitlines()[0])["prompt"]
        first = [{"role": "user", "content": edit}]
        answer = server.chat(first, 128)["choices"][0]["message"]["content"]
        turn = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Now add a docstring."}]
        prefill = {True: [], False: []}
        cached = 0
        for _ in range(a.pairs):
            for reuse in (False, True):
                server.chat(first, 128)  # the caches hold the first turn and its answer, as in a real chat
                r = server.chat(turn, 1, cache_prompt=reuse)
                prefill[reuse].append(r["speculative"]["prefill_seconds"])
                cached = r["usage"]["prompt_tokens_cached"] if reuse else cached
                prompt_tokens = r["usage"]["prompt_tokens"]
    finally:
        server.stop()

    served = sum(r["served"] for r in rows)
    called = sum(r["called"] for r in rows)
    summary = {
        "requests": len(rows),
        "serve": {"requests_per_minute": round(60 * len(rows) / served, 1),
                  "tokens_per_second": round(sum(r["served_tokens"] for r in rows) / served, 2),
                  "median_time_to_first_token": round(statistics.median(r["ttft"] for r in rows), 3)},
        "generate": {"requests_per_minute": round(60 * len(rows) / called, 1),
                     "tokens_per_second": round(sum(r["called_tokens"] for r in rows) / called, 2)},
        "second_turn": {"prompt_tokens": prompt_tokens, "cached_tokens": cached,
                        "prefill_seconds_reused": round(statistics.median(prefill[True]), 4),
                        "prefill_seconds_cold": round(statistics.median(prefill[False]), 4)},
        "args": rest,
    }  # fmt: skip
    print(json.dumps(summary, indent=2))
    if a.json:
        a.json.write_text(json.dumps({**summary, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
