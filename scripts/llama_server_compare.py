"""The editor plugins' requests against llama-server and `specdec serve` on the same model: does the same body
evaluate the same prompt tokens (`tokens_evaluated`), answer the same text (greedy), with the fields the plugins
read?

    python scripts/llama_server_compare.py --llama-server /path/to/llama-server [--cases 8] [-t 2]

llama-server is not shipped with llama-cpp-python: build it from llama-cpp-python's source distribution
(`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`, then in vendor/llama.cpp:
`cmake -B build -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF && cmake --build build --target llama-server`).
Bodies: llama.vim's (autoload/llama.vim: input_prefix, input_suffix, input_extra, prompt, n_predict 128, n_indent,
top_k 40, top_p 0.90, samplers, cache_prompt, t_max_*, response_fields) with temperature 0 (greedy, so that the two
texts can be compared), from held-out code (this Python's standard library): a line chosen by the seed, the prefix
before it, the 64 lines after it as the suffix, the line's start as `prompt`, two other files as input_extra.
Each server starts alone (they would share the cores), with the same context, threads and batch.
"""

from __future__ import annotations

import argparse
import glob
import json
import random
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

from specdec_cli.models import store
from specdec_cli.models.catalog import QWEN_TARGET

FIELDS = ["content", "timings/prompt_n", "timings/predicted_n", "truncated", "tokens_cached", "tokens_evaluated"]


def bodies(n: int, seed: int, files: str) -> list[dict]:
    rng = random.Random(seed)
    paths = sorted(f for f in glob.glob(files, recursive=True) if Path(f).stat().st_size > 8000)
    out = []
    while len(out) < n:
        lines = Path(rng.choice(paths)).read_text(errors="replace").splitlines(True)
        if len(lines) < 200:
            continue
        at = rng.randrange(100, len(lines) - 70)
        line = lines[at]
        indent = len(line) - len(line.lstrip(" \t"))
        cut = indent + (len(line.strip()) // 2)
        extra = [
            {"text": Path(p).read_text(errors="replace")[:3000], "time": 0, "filename": Path(p).name}
            for p in rng.sample(paths, 2)
        ]
        out.append(
            {
                "id_slot": 0,
                "input_prefix": "".join(lines[max(0, at - 256) : at]),
                "prompt": line[:cut],
                "input_suffix": line[cut:] + "".join(lines[at + 1 : at + 65]),
                "input_extra": extra,
                "n_predict": 128,
                "stop": [],
                "n_indent": indent,
                "top_k": 40,
                "top_p": 0.90,
                "temperature": 0.0,
                "samplers": ["top_k", "top_p", "infill"],
                "stream": False,
                "cache_prompt": True,
                "t_max_prompt_ms": 500,
                "t_max_predict_ms": 100000,
                "response_fields": FIELDS,
            }
        )
    return out


def post(url: str, body: dict) -> tuple[dict, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        raw = r.read()
    return json.loads(raw), raw


def serve(cmd: list[str], url: str) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return proc
        except Exception:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"did not start: {' '.join(cmd)}")


def answers(cmd: list[str], port: int, cases: list[dict]) -> list[tuple[dict, bytes]]:
    url = f"http://127.0.0.1:{port}"
    proc = serve(cmd, url)
    try:
        return [post(url + "/infill", body) for body in cases]
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=8192)
    ap.add_argument("--files", default=str(Path(sysconfig.get_paths()["stdlib"]) / "**" / "*.py"))
    args = ap.parse_args()
    model = str(store.model_path(QWEN_TARGET))
    cases = bodies(args.cases, args.seed, args.files)
    common = ["-c", str(args.ctx_size), "-t", str(args.threads)]
    theirs = answers([args.llama_server, "-m", model, "--port", "18181", "-np", "1", *common], 18181, cases)
    mine = {
        drafter: answers(
            [
                sys.executable,
                "-m",
                "specdec_cli",
                "serve",
                "--target",
                model,
                "--port",
                "18182",
                "--drafter",
                drafter,
                "--no-lookup-cache",
                *common,
            ],
            18182,
            cases,
        )
        for drafter in ("none", "auto")
    }
    same_prompt = same_text = same_fields = 0
    for i, (theirs_i, none_i, auto_i) in enumerate(zip(theirs, mine["none"], mine["auto"])):
        (t, _), (n, nraw), (a, _) = theirs_i, none_i, auto_i
        ok_prompt = t["tokens_evaluated"] == n["tokens_evaluated"]
        same_prompt += ok_prompt
        same_text += t["content"] == n["content"] == a["content"]
        same_fields += sorted(t) == sorted(n) and b'"content":"' in nraw
        print(
            f"case {i}: prompt tokens llama-server {t['tokens_evaluated']}, specdec {n['tokens_evaluated']}"
            f"{'' if ok_prompt else ' DIFFERENT'}; text {'same' if t['content'] == n['content'] else 'DIFFERENT'} "
            f"(auto {'same' if a['content'] == n['content'] else 'DIFFERENT'}), {len(t['content'])} chars; prompt_n "
            f"{t['timings/prompt_n']} / {n['timings/prompt_n']}",
            flush=True,
        )
    print(
        f"same prompt tokens {same_prompt}/{len(cases)}, same text {same_text}/{len(cases)} (llama-server, specdec "
        f"none, specdec auto), same fields and compact JSON {same_fields}/{len(cases)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
