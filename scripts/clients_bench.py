#!/usr/bin/env python3
"""Several clients at once against one `specdec serve`: the aggregate generation rate and each client's wall time
per request, against the same prompts sent by one client one after another (the serial baseline).

    python scripts/clients_bench.py --clients 4 --requests 3 -n 128 --rounds 3 --json clients.json -- -t 2

Arguments after `--` go to `specdec serve` (the models, drafter and threads). One server is started on 127.0.0.1
(a free port), with the lookup cache off (each prompt is sent once a round: a repeated prompt must not draft from
its own earlier answer), and stopped at the end. Client c sends prompts c, c + clients, ... of --prompts (held-out
general prompts: chat, QA, summaries, code), each a streamed chat request of -n tokens with `cache_prompt` off (no
request starts from another's cells), one after another. A round runs the concurrent phase and the serial phase (one
client, the same prompts in turn), their order alternating round by round so that drift hits both alike.

Per phase: aggregate generation tokens/s (all completion tokens over the phase's wall time), each request's wall
time and time to first token; the medians over rounds, and the concurrent/serial ratios of the same round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from serve_bench import Server

HERE = Path(__file__).parent


def read_prompts(path: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]


def one(server: Server, prompt: str, max_tokens: int) -> dict:
    ttft, wall, tokens = server.stream(prompt, max_tokens, cache_prompt=False)
    return {"ttft": ttft, "wall": wall, "tokens": tokens}


def concurrent(server: Server, work: list[list[str]], max_tokens: int) -> tuple[float, list[list[dict]]]:
    """Each client's prompts one after another, the clients at once: (phase seconds, each client's rows)."""
    rows: list[list[dict]] = [[] for _ in work]
    failures: list[BaseException] = []

    def client(c: int) -> None:
        try:
            for prompt in work[c]:
                rows[c].append(one(server, prompt, max_tokens))
        except BaseException as e:  # (said after the phase: a thread's exception is otherwise lost)
            failures.append(e)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(len(work))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return time.perf_counter() - t0, rows


def serial(server: Server, work: list[list[str]], max_tokens: int) -> tuple[float, list[list[dict]]]:
    """The same prompts from one client, in turn (client 0's first, then client 1's first, ...)."""
    rows: list[list[dict]] = [[] for _ in work]
    t0 = time.perf_counter()
    for i in range(max(len(w) for w in work)):
        for c, prompts in enumerate(work):
            if i < len(prompts):
                rows[c].append(one(server, prompts[i], max_tokens))
    return time.perf_counter() - t0, rows


def summary(seconds: float, rows: list[list[dict]]) -> dict:
    flat = [r for client in rows for r in client]
    return {
        "seconds": round(seconds, 3),
        "tokens": sum(r["tokens"] for r in flat),
        "tokens_per_second": round(sum(r["tokens"] for r in flat) / seconds, 3),
        "mean_wall_per_request": [round(statistics.mean(r["wall"] for r in client), 3) for client in rows],
        "median_ttft": round(statistics.median(r["ttft"] for r in flat), 3),
    }


def main() -> None:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=3, help="requests per client a round")
    p.add_argument("-n", "--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=Path, default=HERE / "general.jsonl")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    prompts = read_prompts(a.prompts)
    if a.clients * a.requests > len(prompts):
        need = a.clients * a.requests
        sys.exit(f"{a.clients} clients x {a.requests} requests need {need} prompts; {a.prompts} has {len(prompts)}")
    work = [[prompts[c + a.clients * i] for i in range(a.requests)] for c in range(a.clients)]

    server = Server(["--no-lookup-cache", *rest])
    rounds = []
    try:
        one(server, prompts[-1], 8)  # warm-up: the weights paged in, auto's cost curve measured
        for r in range(a.rounds):
            phases = {}
            for name in ("concurrent", "serial") if r % 2 == 0 else ("serial", "concurrent"):
                phases[name] = summary(*(concurrent if name == "concurrent" else serial)(server, work, a.max_tokens))
                got = phases[name]
                print(
                    f"[round {r + 1}/{a.rounds}] {name}: {got['tokens_per_second']} tokens/s, {got['seconds']} s",
                    file=sys.stderr,
                )
            rounds.append(phases)
    except (OSError, ValueError) as e:  # (urllib's errors are OSErrors; a cut stream's JSON a ValueError)
        sys.exit(f"error: the server stopped answering ({e}); rounds measured: {len(rounds)}")
    finally:
        server.stop()

    def median(name: str, key: str) -> float:
        return round(statistics.median(p[name][key] for p in rounds), 3)

    def ratio(key: str) -> float:
        return round(statistics.median(p["concurrent"][key] / p["serial"][key] for p in rounds), 3)

    def wall_ratio(p: dict) -> float:  # the worst client's mean wall per request, against the serial server's
        return max(
            c / s for c, s in zip(p["concurrent"]["mean_wall_per_request"], p["serial"]["mean_wall_per_request"])
        )

    out = {
        "clients": a.clients,
        "requests_per_client": a.requests,
        "max_tokens": a.max_tokens,
        "rounds": a.rounds,
        "concurrent_tokens_per_second": median("concurrent", "tokens_per_second"),
        "serial_tokens_per_second": median("serial", "tokens_per_second"),
        "aggregate_ratio": ratio("tokens_per_second"),
        "worst_client_wall_ratio": round(statistics.median(wall_ratio(p) for p in rounds), 3),
        "concurrent_median_ttft": median("concurrent", "median_ttft"),
        "serial_median_ttft": median("serial", "median_ttft"),
        "serve_args": rest,
    }
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps({**out, "per_round": rounds}, indent=2))


if __name__ == "__main__":
    main()
