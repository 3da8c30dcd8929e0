#!/usr/bin/env python3
"""Time to first token of a restarted `specdec serve` on a long system prompt it has seen before.

    python scripts/restart_ttft.py --trials 3 -- -t 2

Arguments after `--` go to every server (the models, threads; the default pair unless given). A trial, with
a system prompt of its own (--system-tokens long, tools written out as JSON, as an agent sends them) and an
empty prefix cache of its own ($SPECDEC_PREFIX_CACHE):
  1. a server answers SYSTEM + a first user message (cold) and keeps the prompt's blocks once it answered;
     it is stopped when they are on disk;
  2. a new server answers SYSTEM + another user message: restored;
  3. a server with an empty prefix cache answers that same request: cold.
Each request streams (temperature 0, -n --max-tokens); time to first token is the time to the first chunk of
text. Prints each trial, the medians, restored / cold (step 3's cold: the same request), whether the greedy
texts of 2 and 3 are identical, the blocks' size on disk and how long after the answer the save ended. Then,
in this process, the target alone: the time to read back and to write the last trial's blocks.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPECDEC = [sys.executable, "-m", "specdec_cli"]
START_SECONDS = 300.0


class Served:
    """`specdec serve --port 0 ARGS` with its prefix cache in `cache`, until stopped."""

    def __init__(self, args: list[str], cache: Path):
        env = {**os.environ, "SPECDEC_PREFIX_CACHE": str(cache)}
        self.proc = subprocess.Popen(
            [*SPECDEC, "serve", "--port", "0", *args], stdout=subprocess.PIPE, stderr=sys.stderr, text=True, env=env
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], START_SECONDS)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("http://"):
            self.stop()
            raise SystemExit("the server did not start")
        self.host, port = line.strip().split("//")[1].split("/")[0].split(":")
        self.port = int(port)

    def chat(self, messages: list[dict], max_tokens: int) -> tuple[float, str, dict, float]:
        """(seconds to the first text, the whole text, usage, when the last chunk came: time.time())."""
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        body["stream_options"] = {"include_usage": True}
        conn = http.client.HTTPConnection(self.host, self.port, timeout=3600)
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise SystemExit(f"HTTP {r.status}: {r.read()[:500]!r}")
        first, text, usage = None, [], {}
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    first = first if first is not None else time.perf_counter() - t0
                    text.append(piece)
        conn.close()
        return first, "".join(text), usage, time.time()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)
        self.proc.stdout.close()


def system_prompt(tokens: int, seed: int, tokenize) -> str:
    """An agent's system prompt: instructions, then tool definitions as JSON, up to `tokens` long."""
    rng = random.Random(seed)
    verbs = ["read", "write", "list", "search", "patch", "run", "fetch", "delete", "rename", "inspect"]
    nouns = ["file", "directory", "symbol", "test", "branch", "issue", "process", "package", "log", "config"]
    text = (
        f"You are a coding agent (session {seed}). Use the tools below to answer the user's request. Think before "
        "you act, call one tool at a time, and say what you changed.\n\n# Tools\n"
    )
    while True:
        name = f"{rng.choice(verbs)}_{rng.choice(nouns)}_{rng.randrange(1000)}"
        tool = {
            "name": name,
            "description": f"{name.replace('_', ' ').capitalize()}: "
            + " ".join(rng.choice(verbs + nouns) for _ in range(24)),
            "parameters": {
                "type": "object",
                "properties": {
                    f"{rng.choice(nouns)}_{i}": {"type": rng.choice(["string", "integer"])} for i in range(4)
                },
            },
        }
        if len(tokenize(text + json.dumps(tool) + "\n")) > tokens:
            return text  # as long as it gets without passing `tokens` (the default context holds 4,096)
        text += json.dumps(tool) + "\n"


def wait_for_blocks(cache: Path, quiet: float = 2.0, limit: float = 300.0) -> tuple[int, int, float]:
    """(files, bytes, newest mtime) once the cache has stopped changing for `quiet` seconds."""
    t0, last, since = time.time(), None, time.time()
    while time.time() - t0 < limit:
        files = [p for p in cache.glob("*/*") if p.is_file()]
        state = sorted((p.name, p.stat().st_size) for p in files)
        if state != last:
            last, since = state, time.time()
        elif files and all(p.suffix == ".kv" for p in files) and time.time() - since >= quiet:
            return len(files), sum(s for _, s in state), max(p.stat().st_mtime for p in files)
        time.sleep(0.2)
    raise SystemExit(f"no blocks in {cache} after {limit:.0f} s")


def requests(i: int, args, tokenize) -> tuple[list[dict], list[dict]]:
    """Trial i's two chats: the same system prompt, two questions."""
    system = system_prompt(args.system_tokens, seed=1000 + i, tokenize=tokenize)
    first = [{"role": "system", "content": system}, {"role": "user", "content": "List the tools that touch files."}]
    second = [{"role": "system", "content": system}, {"role": "user", "content": "Which tool renames a branch?"}]
    return first, second


def second_request(args, tokenize) -> list[dict]:
    return requests(args.trials - 1, args, tokenize)[1]


def trial(i: int, args, server_args: list[str], tokenize, root: Path) -> dict:
    first, second = requests(i, args, tokenize)
    cache, empty = root / f"trial{i}", root / f"empty{i}"
    s = Served(server_args, cache)
    try:
        cold_first, _, usage, answered = s.chat(first, args.max_tokens)
        files, size, saved = wait_for_blocks(cache)
    finally:
        s.stop()
    s = Served(server_args, cache)
    try:
        restored, restored_text, restored_usage, _ = s.chat(second, args.max_tokens)
    finally:
        s.stop()
    s = Served(server_args, empty)
    try:
        cold, cold_text, cold_usage, _ = s.chat(second, args.max_tokens)
    finally:
        s.stop()
    row = {
        "prompt_tokens": cold_usage.get("prompt_tokens"),
        "restored_cached": restored_usage.get("prompt_tokens_cached"),
        "cold_first_ttft": cold_first,
        "cold_ttft": cold,
        "restored_ttft": restored,
        "identical": restored_text == cold_text,
        "blocks": files,
        "bytes": size,
        "save_done_after_answer_s": saved - answered,
    }
    print(json.dumps(row), flush=True)
    return row


def in_process(target: Path, threads: int, exact: bool, cache: Path, messages: list[dict]) -> dict:
    """The target alone: restore the last trial's blocks for its second request's prompt (the files hold no
    tokens: the prompt is built again, as the server built it) into an empty cache, then write them anew."""
    from specdec_cli.chat import Message
    from specdec_cli.engine.kv import Sequence
    from specdec_cli import prefixes
    from specdec_cli.session import RunConfig, open_session

    os.environ["SPECDEC_PREFIX_CACHE"] = str(cache)
    with open_session(RunConfig(target=target, threads=threads, drafter="none", exact=exact)) as s:
        s.keep_prefixes(prefixes.MAX_BYTES, print)
        store = s.prefixes
        tokens = s.prompt_tokens(messages=[Message(m["role"], m["content"]) for m in messages])
        seq = Sequence.empty(s.target_ctx)
        t0 = time.perf_counter()
        held = store.restore(seq, tokens)
        load = time.perf_counter() - t0
        store.folder = cache / "rewritten"
        t0 = time.perf_counter()
        store.save(seq, tokens)
        save = time.perf_counter() - t0
    return {
        "restored_tokens": held,
        "load_s": load,
        "save_s": save,
        "save_bytes": store.last_save and store.last_save[1],
    }


def main() -> None:
    argv = sys.argv[1:]
    server_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--system-tokens", type=int, default=4000)
    p.add_argument("--max-tokens", type=int, default=8)
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    from specdec_cli.backend.native import Model
    from specdec_cli.models import store
    from specdec_cli.models.catalog import QWEN_TARGET

    target = store.model_path(QWEN_TARGET)
    with Model(target, vocab_only=True) as vocab:
        tokenize = lambda text: vocab.tokenize(text, special=False)  # noqa: E731
        with tempfile.TemporaryDirectory() as tmp:
            rows = [trial(i, args, server_args, tokenize, Path(tmp)) for i in range(args.trials)]
            threads = int(server_args[server_args.index("-t") + 1]) if "-t" in server_args else 2
            last = Path(tmp) / f"trial{args.trials - 1}"
            direct = in_process(target, threads, "--exact" in server_args, last, second_request(args, tokenize))
    cold = statistics.median(r["cold_ttft"] for r in rows)
    restored = statistics.median(r["restored_ttft"] for r in rows)
    summary = {
        "cold_ttft_median": cold,
        "cold_first_ttft_median": statistics.median(r["cold_first_ttft"] for r in rows),
        "restored_ttft_median": restored,
        "ratio": restored / cold,
        "identical": all(r["identical"] for r in rows),
        **direct,
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
