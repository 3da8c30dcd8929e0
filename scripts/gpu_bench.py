#!/usr/bin/env python3
"""The bench of scripts/gpu_check.sh: llama.cpp's own loops beside specdec on one model pair, greedy, each prompt's
runs interleaved (every configuration on a prompt, then the next prompt), one table last.

    python scripts/gpu_bench.py --bin BUILD/bin --target T.gguf --draft D.gguf --out DIR [-n 256] [-k 8] [--ngl 99]

Runs per prompt: llama-completion (the reference); llama-speculative-simple with the draft model (draft-simple, k)
and with each n-gram type (ngram-simple, ngram-map-k, ngram-mod: names from this llama.cpp's common/speculative.cpp,
their own default settings); specdec --drafter none, --drafter model at the same k, its default drafter, and
--exact with --drafter none and model; with --eagle3 / --dflash, llama-speculative-simple --spec-type draft-eagle3 /
draft-dflash and specdec --drafter eagle3 / dflash on those drafts, at the same k (DFlash's block clamps it). Every specdec run has faulthandler on (a native crash prints the Python stack) and a fresh
SPECDEC_HOME (no cached cost curve, no lookup cache from an earlier prompt); a failed one runs again once with
SPECDEC_LLAMA_LOG=1 to show llama.cpp's log. Each run's stderr is OUT/logs/PROMPT.RUN.log; every row goes to
OUT/results.jsonl; the table (also OUT/table.txt) ends with identity: does the greedy text agree with
llama-completion's (as far as the shorter goes), and for specdec with --drafter none's token ids. Run from the checkout root with PYTHONPATH holding it and llama_cpp.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpu_diagnose import before_crash, excerpt, outcome, stack_top  # beside this file: a crash is told one way

N = 256  # tokens per run: long enough that generation, not load or prefill, sets tokens/s
K = 8  # draft tokens per round for both draft-model loops (llama.cpp's --spec-draft-n-max, specdec -k)
CTX = 4096  # the same context for every tool (specdec would fit its own otherwise)
RUN_TIMEOUT = 300  # s per run: a GPU run takes seconds, a tiny CPU one a minute at most
TAIL = 8  # lines of a crashed run's stack, and of llama.cpp's log before it, in the notes
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")  # llama-speculative-simple --spec-type, draft-free


def chat(user: str) -> str:  # Qwen2.5's template laid out by hand: the same raw text goes to every tool
    return (
        f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


CODE = """def merge_intervals(intervals):
    intervals.sort(key=lambda x: x[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
"""
PROMPTS = {
    "explain": chat(
        f"Explain what this Python function does, step by step, and its time complexity:\n\n```python\n{CODE}```"
    ),
    "edit": chat(
        f"Rename `merged` to `out` everywhere in this code and return the whole function:\n\n```python\n{CODE}```"
    ),
    "general": chat("What are some good strategies for staying focused while working from home?"),
}


@dataclass(frozen=True)
class Config:
    id: str  # short, no spaces: the table's, --only's and the log file's name
    tool: str  # "completion" | "speculative" | "specdec"
    args: tuple[str, ...] = ()


@dataclass
class Row:
    prompt: str
    run: str
    rc: int
    wall_s: float
    tokens: int | None = None
    tok_s: float | None = None
    ttft_s: float | None = None
    accept: float | None = None
    text: str | None = None
    token_ids: list[int] | None = None
    identity: str = ""
    log: str = ""
    llama_log: str | None = None  # the failure re-run's log (SPECDEC_LLAMA_LOG=1)
    extra: dict = field(default_factory=dict)


def configs(draft: str, k: int, hidden: dict[str, str] | None = None) -> list[Config]:
    model = ("--draft", draft, "--drafter", "model", "-k", str(k))
    native = []
    for kind, path in (hidden or {}).items():  # EAGLE-3 and DFlash drafts: llama.cpp's loop and specdec's
        native += [
            Config(
                f"spec-{kind}-k{k}",
                "speculative",
                ("-md", path, "--spec-type", f"draft-{kind}", "--spec-draft-n-max", str(k)),
            ),
            Config(f"specdec-{kind}-k{k}", "specdec", ("--draft", path, "--drafter", kind, "-k", str(k))),
        ]
    return [
        Config("completion", "completion"),
        Config(
            f"spec-draft-k{k}",
            "speculative",
            ("-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(k)),
        ),
        *(Config(f"spec-{t}", "speculative", ("--spec-type", t)) for t in NGRAM_TYPES),
        Config("specdec-none", "specdec", ("--drafter", "none")),
        Config(f"specdec-model-k{k}", "specdec", model),
        Config("specdec-default", "specdec", ("--draft", draft)),
        Config("specdec-exact-none", "specdec", ("--exact", "--drafter", "none")),  # exact mode's own baseline
        Config(f"specdec-exact-k{k}", "specdec", ("--exact", *model)),
        *native,
    ]


def run(cmd: list[str], log: Path, env: dict | None = None) -> tuple[int, str, str, float]:
    """(return code, stdout, stderr, wall s); stderr also into `log`. 124: past RUN_TIMEOUT."""
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, env=env, stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = 124, e.stdout or b"", e.stderr or b""
    wall = time.perf_counter() - t
    log.write_bytes(f"$ {json.dumps(cmd)}\n".encode() + err)  # the command on one line, the prompt escaped
    return rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), wall


def num(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def llama_tool(a, cfg: Config, prompt: str, log: Path) -> Row:
    """llama-completion or llama-speculative-simple: numbers from their logs, the text from stdout."""
    common = ["-m", a.target, "-p", prompt, "-n", str(a.n), "--temp", "0", "-c", str(CTX), "-ngl", a.ngl, *a.threads]
    if cfg.tool == "completion":
        cmd = [str(a.bin / "llama-completion"), *common, "-no-cnv", "--no-display-prompt"]
    else:
        cmd = [str(a.bin / "llama-speculative-simple"), *common, "-ngld", a.ngl, *cfg.args]
    rc, out, err, wall = run(cmd, log)
    row = Row(prompt="", run=cfg.id, rc=rc, wall_s=round(wall, 3), log=str(log))
    if cfg.tool == "completion":  # llama_perf_context_print: eval runs = the tokens after the prompt's, one each
        ev, runs = (
            num(r"(?<!prompt )eval time =\s+([\d.]+) ms", err),
            num(r"(?<!prompt )eval time =.*/\s+(\d+) runs", err),
        )
        pe, smp = num(r"prompt eval time =\s+([\d.]+) ms", err), num(r"sampling time =\s+([\d.]+) ms", err) or 0.0
        if ev is not None and runs:
            row.tokens, row.tok_s = int(runs) + 1, round(runs / ((ev + smp) / 1000), 2)  # + the prompt's token
            row.ttft_s = None if pe is None else round((pe + ev / runs) / 1000, 4)  # the prompt, then one token
        # stdout: the answer, " [end of text]\n" at an end-of-generation token, then two newlines
        row.text = out.removesuffix("\n\n").removesuffix(" [end of text]\n") if rc == 0 else None
    else:
        dec, secs = num(r"decoded\s+(\d+) tokens in", err), num(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", err)
        if dec is not None and secs:
            row.tokens, row.tok_s = int(dec), round(dec / secs, 2)
        row.ttft_s = num(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", err)  # the prompt's decode
        acc = num(r"accept\s+=\s+([\d.]+)%", err)
        row.accept = None if acc is None else round(acc / 100, 4)
        # stdout: two newlines, the prompt's pieces, the answer's, four newlines
        answer = out[out.find(prompt) + len(prompt) :] if prompt in out else out
        row.text = answer.removesuffix("\n\n\n\n") if rc == 0 else None
    row.extra["offloaded"] = re.findall(r"offloaded \d+/\d+ layers to GPU", err)
    return row


def specdec(a, cfg: Config, prompt: str, log: Path, llama_log: bool = False) -> Row:
    with tempfile.TemporaryDirectory(prefix="specdec-home-") as home:
        env = {**os.environ, "SPECDEC_HOME": home, "NO_COLOR": "1", "PYTHONFAULTHANDLER": "1"}
        if llama_log:
            env["SPECDEC_LLAMA_LOG"] = "1"
        cmd = [
            a.python,
            "-X",
            "faulthandler",
            "-m",
            "specdec_cli",
            "generate",
            "--target",
            a.target,
            *cfg.args,
            "-n",
            str(a.n),
            "--temp",
            "0",
            "-c",
            str(CTX),
            "--no-chat",
            "--json",
            *a.threads,
            prompt,
        ]
        rc, out, err, wall = run(cmd, log, env)
    row = Row(prompt="", run=cfg.id, rc=rc, wall_s=round(wall, 3), log=str(log))
    try:
        o = json.loads(out.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        if rc >= 0:  # specdec's own `error: ...` line (a crash's last line is faulthandler's, in the notes)
            row.extra["error"] = (err.strip().splitlines() or ["no output"])[-1][:200]
        return row
    s = o.get("stats", {})
    row.tokens, row.tok_s, row.ttft_s = s.get("generated_tokens"), s.get("tokens_per_second"), s.get("ttft_seconds")
    row.accept, row.text, row.token_ids = s.get("accept_rate"), o.get("text"), o.get("tokens")
    row.extra = {
        "stop": o.get("stop_reason"),
        "target_on": o.get("config", {}).get("target_on"),
        "drafters": {k: v.get("rounds") for k, v in (s.get("by_drafter") or {}).items()},
        "load_s": s.get("load_seconds"),
        "mean_accepted": s.get("mean_accepted"),
    }
    return row


def same(ref: str | list | None, other: str | list | None, unit: str) -> str:
    """'=' when they agree as far as the shorter goes (llama-speculative-simple overshoots -n by up to a round),
    else where they part ('DIFF@char12'); '?' when either is missing."""
    if ref is None or other is None:
        return "?"
    at = next((i for i, (x, y) in enumerate(zip(ref, other)) if x != y), None)
    return "=" if at is None else f"DIFF@{unit}{at}"


def identity(row: Row, done: dict[str, Row]) -> str:
    """vs llama-completion's text; for specdec also vs --drafter none's token ids, and for exact mode's drafters vs
    --exact --drafter none's (exact mode promises that one: its kernels are not the fast ones)."""
    if row.run == "completion":
        return "reference"
    out = "completion" + same(getattr(done.get("completion"), "text", None), row.text, "char")
    bases = ["specdec-none", "specdec-exact-none"] if "exact" in row.run else ["specdec-none"]
    for base in bases if row.run.startswith("specdec") else []:
        if base != row.run:  # "none=": the same token ids as specdec-none's
            out += f"  {base[8:]}" + same(getattr(done.get(base), "token_ids", None), row.token_ids, "token")
    return out


def table(rows: list[Row]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    lines = [
        f"{'prompt':8s} {'run':20s} {'tokens':>6s} {'tok/s':>8s} {'wall s':>7s} {'TTFT s':>7s} {'accept':>6s}  identity",
        "-" * 96,
    ]
    for r in rows:
        status = "" if r.rc == 0 else f"  {outcome(r.rc)}"
        lines.append(
            f"{r.prompt:8s} {r.run:20s} {f(r.tokens, 'd'):>6s} {f(r.tok_s, '.1f'):>8s} {r.wall_s:7.2f} "
            f"{f(r.ttft_s, '.3f'):>7s} {f(r.accept, '.3f'):>6s}  {r.identity}{status}"
        )
    notes = []
    for r in rows:
        if r.rc == 0 and not r.extra.get("error"):
            continue
        first = Path(r.log).read_text(errors="replace") if Path(r.log).exists() else ""
        notes.append(f"{r.prompt}/{r.run}: {outcome(r.rc)}{' ' + r.extra['error'] if r.extra.get('error') else ''}")
        if r.llama_log and Path(r.llama_log).exists():  # its stack, then llama.cpp's last words in the re-run
            notes += [f"    | {line[:220]}" for line in stack_top(first, TAIL) or before_crash(first, TAIL)]
            notes.append(f"  llama.cpp's log before it (SPECDEC_LLAMA_LOG=1 re-run, {r.llama_log}):")
            notes += [
                f"    | {line[:220]}" for line in before_crash(Path(r.llama_log).read_text(errors="replace"), TAIL)
            ]
        else:
            notes += [f"    | {line[:220]}" for line in excerpt(first)]
    return "\n".join(lines + (["notes:", *notes] if notes else []))


def summary(rows: list[Row], ids: list[str]) -> str:
    """Per run, the median tokens/s over prompts and its ratio to llama-completion's."""
    med = {}
    for i in ids:
        v = [r.tok_s for r in rows if r.run == i and r.tok_s]
        med[i] = statistics.median(v) if v else None
    base = med.get("completion")
    out = ["median tok/s over prompts (x llama-completion):"]
    for i in ids:
        x = f" ({med[i] / base:.2f}x)" if med[i] and base else ""
        out.append(f"  {i:20s} {'-' if med[i] is None else f'{med[i]:.1f}'}{x}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--bin", type=Path, required=True, help="llama.cpp's bin: llama-completion, llama-speculative-simple"
    )
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--eagle3", help="an EAGLE-3 draft for the target: its rows too")
    ap.add_argument("--dflash", help="a DFlash draft for the target: its rows too")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("-n", type=int, default=N)
    ap.add_argument("-k", type=int, default=K)
    ap.add_argument("--ngl", default="99", help="layers on the GPU for llama.cpp's tools [99]; specdec: its default")
    ap.add_argument("--threads", type=int, help="-t for every tool [each its own default]")
    ap.add_argument("--prompts", default=",".join(PROMPTS), help=f"some of {','.join(PROMPTS)}")
    ap.add_argument("--only", help="runs to do, comma-separated ids (default: all)")
    ap.add_argument("--budget", type=float, default=0, help="s for all runs; later runs are skipped (0: none)")
    a = ap.parse_args()
    a.python, a.threads = sys.executable, ([] if a.threads is None else ["-t", str(a.threads)])
    t0 = time.time()
    logs = a.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    hidden = {kind: path for kind, path in (("eagle3", a.eagle3), ("dflash", a.dflash)) if path}
    cfgs = [c for c in configs(a.draft, a.k, hidden) if not a.only or c.id in a.only.split(",")]
    prompts = [p for p in a.prompts.split(",") if p]
    print(
        f"bench: {a.target} + {a.draft}, -n {a.n}, k {a.k}, llama.cpp -ngl {a.ngl}; {len(prompts)} prompts x "
        f"{len(cfgs)} runs; logs in {logs}",
        flush=True,
    )
    warm = llama_tool(a, Config("completion", "completion"), PROMPTS["general"], logs / "warmup.log")  # page cache
    print(f"warm-up: llama-completion rc {warm.rc}, {warm.wall_s} s", flush=True)
    rows: list[Row] = []
    rerun: set[str] = set()  # configs whose failure ran again with llama.cpp's log: once each
    with open(a.out / "results.jsonl", "w") as results:
        for pname in prompts:
            done: dict[str, Row] = {}
            for cfg in cfgs:
                if a.budget and time.time() - t0 > a.budget:
                    print(f"  {pname}/{cfg.id}: skipped (past the {a.budget:.0f} s budget)", flush=True)
                    continue
                log = logs / f"{pname}.{cfg.id}.log"
                go = specdec if cfg.tool == "specdec" else llama_tool
                row = go(a, cfg, PROMPTS[pname], log)
                row.prompt = pname
                if cfg.tool == "specdec" and (row.rc != 0 or row.text is None) and cfg.id not in rerun:
                    rerun.add(cfg.id)
                    again = log.with_suffix(".llama.log")
                    specdec(a, cfg, PROMPTS[pname], again, llama_log=True)
                    row.llama_log = str(again)
                row.identity = identity(row, done)
                done[cfg.id] = row
                rows.append(row)
                results.write(json.dumps({k: v for k, v in asdict(row).items() if k != "token_ids"}) + "\n")
                results.flush()
                print(
                    f"  [{time.time() - t0:5.0f} s] {pname:8s} {cfg.id:20s} rc {row.rc:3d}  {row.tok_s} tok/s  "
                    f"wall {row.wall_s} s  {row.identity}  {row.extra.get('error', '')}",
                    flush=True,
                )
    text = summary(rows, [c.id for c in cfgs]) + "\n\n" + table(rows)
    (a.out / "table.txt").write_text(text + "\n")
    print(f"\nbench runs done in {time.time() - t0:.0f} s\n\n{text}")
    return 0 if all(r.rc == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
