#!/usr/bin/env python3
"""`specdec bench` with the target behind `specdec rpc-server`, over links of different latency.

    sudo python scripts/rpc_links.py --links local,loopback,lan0,lan1,lan5 --out rpc-results \\
        -- --prompts suite --drafters none,model,lookup,auto --draft-tokens 3,5 -t 2

Each link is one bench run (its rows interleaved prompt by prompt, so the speed-ups against
target-only over the same link are side by side), written to OUT/LINK.json:

- local: no RPC, the reference;
- loopback: a server on 127.0.0.1;
- lanN: a server in a network namespace of its own, reached over a veth pair, through a proxy that
  delays each direction by N/2 ms (an N ms round trip; N = 0: the veth alone). `tc netem` would be the
  usual tool, but needs the kernel's sch_netem module; scripts/delay_proxy.py does the same in user
  space (delay, no bandwidth limit). Network namespaces need root.

Arguments after `--` go to every `specdec bench` run. The summary: tokens/s of target-only, and each
row's speed-up over target-only on the same link, plus the handshake round trip measured on it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from specdec_cli.backend import rpc

NS, HOST_IP, NS_IP = "specdec-rpc", "10.77.0.1", "10.77.0.2"
SPECDEC = [sys.executable, "-m", "specdec_cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


@contextmanager
def namespace():
    """A network namespace with one end of a veth pair; removed on the way out."""
    subprocess.run(["ip", "netns", "del", NS], stderr=subprocess.DEVNULL)
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "link", "add", "sdrpc0", "type", "veth", "peer", "name", "sdrpc1")
        sh("ip", "link", "set", "sdrpc1", "netns", NS)
        sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", "sdrpc0")
        sh("ip", "link", "set", "sdrpc0", "up")
        sh("ip", "netns", "exec", NS, "ip", "addr", "add", f"{NS_IP}/24", "dev", "sdrpc1")
        sh("ip", "netns", "exec", NS, "ip", "link", "set", "sdrpc1", "up")
        sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
        yield
    finally:
        subprocess.run(["ip", "link", "del", "sdrpc0"], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", NS], stderr=subprocess.DEVNULL)


@contextmanager
def process(cmd: list[str], ready: str, stream: str = "stderr"):
    """A background process, once `ready` appears in its output; stopped (SIGTERM) on the way out."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pipe = proc.stderr if stream == "stderr" else proc.stdout
        seen = ""
        for line in pipe:
            seen += line
            if ready in line:
                break
        else:
            raise RuntimeError(f"{' '.join(cmd)} did not start:\n{seen}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def round_trip_ms(host: str, port: int, n: int = 20) -> float:
    """Median time of the RPC handshake (connect, HELLO, reply): about one and a half round trips."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        rpc.check(host, port)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--links", default="local,loopback,lan0,lan1,lan5")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--server-threads", type=int, default=os.cpu_count())
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    bench_args = [x for x in a.bench_args if x != "--"]
    a.out.mkdir(parents=True, exist_ok=True)
    links = a.links.split(",")
    summary = {}
    with ExitStack() as stack:
        loopback_port = ns_port = None
        if "loopback" in links:
            loopback_port = free_port()
            stack.enter_context(process(
                [*SPECDEC, "rpc-server", "--port", str(loopback_port), "-t", str(a.server_threads)], "Ctrl-C stops it"
            ))  # fmt: skip
        if any(link.startswith("lan") for link in links):
            stack.enter_context(namespace())
            ns_port = rpc.DEFAULT_PORT
            stack.enter_context(process(
                ["ip", "netns", "exec", NS, *SPECDEC, "rpc-server", "--host", NS_IP, "--port", str(ns_port),
                 "-t", str(a.server_threads)], "Ctrl-C stops it",
            ))  # fmt: skip
        for link in links:
            with ExitStack() as per_link:
                if link == "local":
                    endpoint = None
                elif link == "loopback":
                    endpoint = ("127.0.0.1", loopback_port)
                elif link == "lan0":
                    endpoint = (NS_IP, ns_port)
                else:
                    rtt = float(link[3:])
                    port = free_port()
                    per_link.enter_context(process(
                        [sys.executable, str(Path(__file__).parent / "delay_proxy.py"), str(port),
                         f"{NS_IP}:{ns_port}", "--one-way-ms", str(rtt / 2)], "delay proxy", stream="stdout",
                    ))  # fmt: skip
                    endpoint = ("127.0.0.1", port)
                hello = round_trip_ms(*endpoint) if endpoint else None
                out = a.out / f"{link}.json"
                cmd = [*SPECDEC, "bench", *bench_args, "--json", str(out)]
                if endpoint:
                    cmd += ["--rpc", f"{endpoint[0]}:{endpoint[1]}"]
                print(f"== {link}: {' '.join(cmd)}" + (f" (handshake {hello:.2f} ms)" if hello else ""), flush=True)
                subprocess.run(cmd, check=True)
                doc = json.loads(out.read_text())
                summary[link] = {"handshake_ms": hello, "rows": doc["rows"], "cost_curve": doc["cost_curve"]}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print_summary(summary)


def print_summary(summary: dict) -> None:
    """One line per link: target-only tokens/s and every configuration's speed-up (all categories)."""
    for link, s in summary.items():
        rows = [r for r in s["rows"] if r.get("category") == "all"]
        base = next((r for r in rows if r["drafter"] == "none"), None)
        cells = [f"none {base['tokens_per_second']:.1f} tok/s" if base else "none ?"]
        cells += [
            f"{r['drafter']}{'' if r['drafter'] in ('auto', 'none') else ' k=' + str(r['draft_tokens'])} "
            f"{r['speedup']:.2f}x" for r in rows if r["drafter"] != "none"
        ]  # fmt: skip
        hello = f" (handshake {s['handshake_ms']:.2f} ms)" if s["handshake_ms"] else ""
        print(f"{link}{hello}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
