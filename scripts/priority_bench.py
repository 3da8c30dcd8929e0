#!/usr/bin/env python3
"""An editor's fill-in-the-middle request while another client's long prompt is being read: its time to first token
and to its whole answer, against the same request alone (issue 49's measure).

    python scripts/priority_bench.py --rounds 3 -- -t 2 -c 12288

One `specdec serve` (its default slots) is started on 127.0.0.1 (a free port) with the arguments after `--`, the lookup
cache off, and stopped at the end; with --serial, also one with `--parallel 1` (one generation at a time), measured the
same way. A
round sends the /infill request (a prefix of about --prefix tokens of this project's code, a short suffix, 16 tokens
asked, `cache_prompt` off) alone, then again --delay seconds after a streamed chat request whose prompt is about
--long tokens of code (also `cache_prompt` off) was sent, whose client then leaves (the server stops its prompt at
the next chunk; with one slot the /infill waits for that chunk and the long prompt's end alike); the order of the two alternates round by round. Prints the medians: TTFT alone,
TTFT beside the long prompt, their difference, the same for the whole answer (an editor waits for all of it), and the
/infill prompt's length as the server counted it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import socket
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from serve_bench import Server

HERE = Path(__file__).parent
CHARS_PER_TOKEN = 4.0  # this project's Python through Qwen2.5's tokenizer (28,800 characters: 7,201 tokens)
LEAVE_SECONDS = 2.0  # after the long prompt's client leaves: the server looks every 0.25 s, then one chunk ends


def code(tokens: int, skip: int = 0) -> str:
    """About `tokens` tokens of this project's sources (files from the `skip`-th on, so two texts share nothing)."""
    files = sorted((HERE.parent / "specdec_cli").rglob("*.py"))
    text, want = "", int(tokens * CHARS_PER_TOKEN)
    for f in files[skip:] + files[:skip]:
        text += f.read_text()
        if len(text) >= want:
            break
    return text[:want]


def post(url: str, body: dict):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=3600)


def infill(base: str, prefix: str) -> tuple[float, float, int]:
    """(time to its first piece of text, to its whole answer, prompt tokens) of one streamed /infill request."""
    t0, first, prompt_n = time.perf_counter(), None, 0
    body = {"input_prefix": prefix, "input_suffix": "\n    return result\n", "n_predict": 16, "stream": True}
    with post(base + "/infill", {**body, "cache_prompt": False}) as r:
        for line in r:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if first is None and event.get("content"):
                first = time.perf_counter() - t0
            prompt_n = event.get("timings", {}).get("prompt_n", prompt_n)
    whole = time.perf_counter() - t0
    return first or whole, whole, prompt_n


def open_long(server: Server, text: str):
    """The long chat prompt, streamed (keep-alive pings flow while it prefills): its connection and response."""
    host, port = server.url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=3600)
    body = {"messages": [{"role": "user", "content": "Summarize this code:\n" + text}], "max_tokens": 8}
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True, "cache_prompt": False}))
    return conn, conn.getresponse()


def beside(server: Server, base: str, prefix: str, long_text: str, delay: float, wait: bool):
    """The /infill request sent `delay` seconds after the long chat prompt: what `infill` says of it. Then the
    long one's client leaves (the server stops its prompt at its next chunk), or, `wait`, reads it to its end."""
    conn, r = open_long(server, long_text)
    time.sleep(delay)
    got = infill(base, prefix)
    if wait:
        r.read()
    else:
        conn.sock.shutdown(socket.SHUT_RDWR)
        time.sleep(LEAVE_SECONDS)  # (it stops at its next keep-alive write and chunk)
    conn.close()
    return got


def measure(server: Server, a, prefix: str, long_text: str, label: str) -> dict:
    base = server.url.removesuffix("/v1")
    infill(base, prefix[:200])  # warm-up
    alone, loaded, prefix_n = [], [], 0  # (TTFT, whole answer) each
    for r in range(a.rounds):
        for kind in ("alone", "beside") if r % 2 == 0 else ("beside", "alone"):
            if kind == "alone":
                ttft, whole, prefix_n = infill(base, prefix)
                alone.append((ttft, whole))
            else:
                ttft, whole, prefix_n = beside(server, base, prefix, long_text, a.delay, wait=label == "serial")
                loaded.append((ttft, whole))
            print(
                f"[{label} round {r + 1}/{a.rounds}] {kind}: TTFT {ttft:.2f} s, answer {whole:.2f} s", file=sys.stderr
            )

    def med(xs) -> float:
        return round(statistics.median(xs), 3)

    return {
        "ttft_alone": med(t for t, _ in alone),
        "ttft_beside_long_prompt": med(t for t, _ in loaded),
        "difference": med(b[0] - x[0] for b, x in zip(loaded, alone)),
        "answer_alone": med(w for _, w in alone),
        "answer_beside_long_prompt": med(w for _, w in loaded),
        "answer_difference": med(b[1] - x[1] for b, x in zip(loaded, alone)),
        "infill_prompt_tokens": prefix_n,
    }


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # (the servers are stopped on the way out)
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prefix", type=int, default=1500, help="the /infill prefix, in tokens (about)")
    p.add_argument("--long", type=int, default=8000, help="the other client's prompt, in tokens (about)")
    p.add_argument("--delay", type=float, default=5.0, help="seconds between the long prompt and the /infill")
    p.add_argument("--serial", action="store_true", help="also a server with --parallel 1, one generation at a time")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    prefix, long_text = code(a.prefix), code(a.long, skip=20)
    out = {"rounds": a.rounds, "long_prompt_tokens_about": int(len(long_text) / CHARS_PER_TOKEN), "serve_args": rest}
    for label, extra in [("default", [])] + ([("serial", ["--parallel", "1"])] if a.serial else []):
        server = Server(["--no-lookup-cache", *extra, *rest])
        try:
            out[label] = measure(server, a, prefix, long_text, label)
        except (OSError, ValueError) as e:
            sys.exit(f"error: the server stopped answering ({e})")
        finally:
            server.stop()
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
