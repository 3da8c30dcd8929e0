#!/usr/bin/env python3
"""Several clients at once against one `specdec serve`: the aggregate generation rate and each client's wall time
per request, against the same prompts sent by one client one after another (the serial baseline).

    python scripts/clients_bench.py --clients 4 --requests 3 -n 128 --rounds 3 --json clients.json -- -t 2
    python scripts/clients_bench.py --parallel 4 --clients 4 --requests 3 -n 128 --rounds 3 -- -t 2

The server is `specdec serve` as started without --parallel (its default slots: 4 where memory allows). With
--parallel N a second one runs beside it with `--parallel N`; a round then has three phases: the clients at once
against the --parallel N server ("parallel"), the same against the default one ("default"), and one client in turn
against the default one ("serial"). The ratios are the first phase's against each, and each client's mean wall time
per request against what the other phase's server gives the same client in the same mix. An earlier build's server
is another phase: --against "old=sh -c 'cd /path/to/checkout && exec python -m specdec_cli serve --port {port} ...'".

--against NAME=COMMAND (again for more) adds a phase: the clients at once against another OpenAI-compatible server,
started from COMMAND with {port} replaced by a free port, ready once its /health answers 200 (llama-server:
--against "llama-np4=llama-server -m T.gguf -np 4 -t 2 -c 16384 --port {port}").

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
import signal
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from serve_bench import Server

HERE = Path(__file__).parent


def read_prompts(path: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]


class Foreign(Server):
    """Another server, started from a command line with {port} in it, ready once /health says 200."""

    def __init__(self, command: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen(shlex.split(command.replace("{port}", str(port))), stderr=subprocess.DEVNULL)
        self.url, deadline = f"http://127.0.0.1:{port}/v1", time.monotonic() + 600
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(1)
        self.proc.kill()
        sys.exit(f"the server did not start (exit status {self.proc.wait()}): {command}")


def one(server: Server, prompt: str, max_tokens: int) -> dict:
    usage = {"stream_options": {"include_usage": True}}  # (llama-server says it only when asked)
    ttft, wall, tokens = server.stream(prompt, max_tokens, cache_prompt=False, **usage)
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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # (the servers are stopped on the way out)
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=3, help="requests per client a round")
    p.add_argument("-n", "--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=Path, default=HERE / "general.jsonl")
    p.add_argument("--json", type=Path)
    p.add_argument("--no-serial", action="store_true", help="no serial phase (the servers' phases alone)")
    p.add_argument("--parallel", type=int, help="compare a server with --parallel N against the default one")
    p.add_argument("--against", action="append", default=[], metavar="NAME=COMMAND", help="another server's phase")
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    prompts = read_prompts(a.prompts)
    if a.clients * a.requests > len(prompts):
        need = a.clients * a.requests
        sys.exit(f"{a.clients} clients x {a.requests} requests need {need} prompts; {a.prompts} has {len(prompts)}")
    work = [[prompts[c + a.clients * i] for i in range(a.requests)] for c in range(a.clients)]

    # (phase, server, how the clients send): the first is the one measured against the others
    phases = [("concurrent", "default", concurrent)] + ([] if a.no_serial else [("serial", "default", serial)])
    if a.parallel:
        phases = [("parallel", "parallel", concurrent), ("default", "default", concurrent), *phases[1:]]
    phases += [(name, name, concurrent) for name, _ in (x.split("=", 1) for x in a.against)]
    servers: dict[str, Server] = {}
    rounds = []
    try:
        servers["default"] = Server(["--no-lookup-cache", *rest])
        if a.parallel:
            servers["parallel"] = Server(["--no-lookup-cache", "--parallel", str(a.parallel), *rest])
        for name, command in (x.split("=", 1) for x in a.against):
            servers[name] = Foreign(command)
        for server in servers.values():
            one(server, prompts[-1], 8)  # warm-up: the weights paged in, auto's cost curve measured
        for r in range(a.rounds):
            done = {}
            for name, which, how in phases[r % len(phases) :] + phases[: r % len(phases)]:  # the order rotates
                done[name] = got = summary(*how(servers[which], work, a.max_tokens))
                print(
                    f"[round {r + 1}/{a.rounds}] {name}: {got['tokens_per_second']} tokens/s, {got['seconds']} s",
                    file=sys.stderr,
                )
            rounds.append(done)
    except (OSError, ValueError) as e:  # (urllib's errors are OSErrors; a cut stream's JSON a ValueError)
        sys.exit(f"error: the server stopped answering ({e}); rounds measured: {len(rounds)}")
    finally:
        for server in servers.values():
            server.stop()
    out = report(a, rest, rounds, [name for name, _, _ in phases])
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps({**out, "per_round": rounds}, indent=2))


def report(a, rest: list[str], rounds: list[dict], names: list[str]) -> dict:
    """Medians over rounds: each phase's rate and TTFT; the first phase's rate and its clients' walls against each
    other phase's, round by round."""
    first = names[0]

    def median(name: str, key: str) -> float:
        return round(statistics.median(p[name][key] for p in rounds), 3)

    def ratio(name: str) -> float:
        return round(statistics.median(p[first]["tokens_per_second"] / p[name]["tokens_per_second"] for p in rounds), 3)

    def wall_ratio(p: dict, name: str) -> float:  # the worst client's mean wall per request, against the other's
        return max(c / s for c, s in zip(p[first]["mean_wall_per_request"], p[name]["mean_wall_per_request"]))

    out = {"clients": a.clients, "requests_per_client": a.requests, "max_tokens": a.max_tokens, "rounds": a.rounds}
    for name in names:
        out[f"{name}_tokens_per_second"] = median(name, "tokens_per_second")
        out[f"{name}_median_ttft"] = median(name, "median_ttft")
    for name in names[1:]:
        out[f"{first}_over_{name}"] = ratio(name)
        out[f"worst_client_wall_{first}_over_{name}"] = round(statistics.median(wall_ratio(p, name) for p in rounds), 3)
    return out | {"parallel": a.parallel, "serve_args": rest}


if __name__ == "__main__":
    main()
