#!/usr/bin/env python3
"""Where a native crash happens, in one run: tiny steps in order, each in its own Python process (faulthandler on,
llama.cpp's log on), each printed ok, FAIL or CRASH with the last lines of its output.

    python scripts/gpu_diagnose.py --target T.gguf [--draft D.gguf] [--out DIR] [--ngl 99]

Steps: import llama_cpp with the library in LLAMA_CPP_LIB_PATH; llama_backend_init; ggml's devices (name, type,
memory, through ctypes); the target through llama-cpp-python's low-level API alone (vocab only, then every layer on
the CPU, then --ngl, then -1), a context, a decode of 1 token, a batch of 5; then the same through specdec's own
Model and Context; then `specdec generate --drafter none -n 8` (and `--drafter model` given --draft). A step does
every step before it again in its process, so the first CRASH is where it breaks. Each step's whole output goes to
OUT/diagnose/STEP.log; the summary to OUT/diagnose.txt. Run from the checkout root with PYTHONPATH holding it and
llama_cpp (scripts/gpu_check.sh sets it).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP_TIMEOUT = 180  # s: a full load of a 1 GB model takes seconds; a hang is a finding too
TOKENS = [9707, 11, 1879, 0, 13]  # "Hello", ",", " world", "!", "." in Qwen2.5's vocabulary
N_CTX = 512
TAIL = 10  # lines of a failed step's output shown, or frames of its Python stack


def say(*what: object) -> None:
    """A marker before each native call (stdout, flushed): a crash's output ends at the call that crashed."""
    print("»", *what, flush=True)


# --- the steps, each run alone in a child process ------------------------------------------------------
def step_import(a) -> str:
    import llama_cpp
    import llama_cpp.llama_cpp as L

    say("llama_cpp", llama_cpp.__version__, "from", Path(llama_cpp.__file__).parent)
    say("LLAMA_CPP_LIB_PATH", os.environ.get("LLAMA_CPP_LIB_PATH"), "->", L._lib._name)
    say("llama_print_system_info:", L.llama_print_system_info().decode(errors="replace").strip())
    return f"llama_cpp {llama_cpp.__version__}, GPU offload supported: {bool(L.llama_supports_gpu_offload())}"


def step_backend_init(a) -> str:
    import llama_cpp.llama_cpp as L

    step_import(a)
    say("llama_backend_init()")
    L.llama_backend_init()
    return "backend ready"


def step_devices(a) -> str:
    """ggml's devices, through libllama's handle (whose lookups reach the ggml it links)."""
    import llama_cpp.llama_cpp as L

    step_backend_init(a)
    lib = ctypes.CDLL(L._lib._name)
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for name, args, res in (
        ("ggml_backend_dev_count", [], sz),
        ("ggml_backend_dev_get", [sz], vp),
        ("ggml_backend_dev_name", [vp], ctypes.c_char_p),
        ("ggml_backend_dev_description", [vp], ctypes.c_char_p),
        ("ggml_backend_dev_type", [vp], ctypes.c_int),
        ("ggml_backend_dev_memory", [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
    ):
        getattr(lib, name).argtypes, getattr(lib, name).restype = args, res
    kinds = {0: "CPU", 1: "GPU", 2: "ACCEL", 3: "IGPU"}  # enum ggml_backend_dev_type
    say("ggml_backend_dev_count()")
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = sz(0), sz(0)
        say(f"device {i}: ggml_backend_dev_memory")
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        name, desc = lib.ggml_backend_dev_name(dev).decode(), lib.ggml_backend_dev_description(dev).decode()
        kind = kinds.get(lib.ggml_backend_dev_type(dev), "?")
        say(
            f"device {i}: {name} ({kind}) {desc.strip()}, {free.value / 2**30:.1f} of {total.value / 2**30:.1f} GiB free"
        )
        found.append(f"{name}/{kind}")
    return f"{len(found)} devices: {', '.join(found)}"


def _load(a, ngl: int | None, vocab_only: bool = False):
    import llama_cpp.llama_cpp as L

    step_backend_init(a)
    params = L.llama_model_default_params()
    say(f"llama_model_default_params(): n_gpu_layers {params.n_gpu_layers}")
    params.vocab_only = vocab_only
    if ngl is not None:
        params.n_gpu_layers = ngl
    say(f"llama_model_load_from_file(vocab_only={vocab_only}, n_gpu_layers={params.n_gpu_layers})")
    model = L.llama_model_load_from_file(str(a.target).encode(), params)
    if not model:
        raise SystemExit("llama_model_load_from_file returned NULL")
    return model


def step_load_vocab_only(a) -> str:
    import llama_cpp.llama_cpp as L

    model = _load(a, None, vocab_only=True)
    n = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    L.llama_model_free(model)
    return f"{n} tokens"


def step_load_ngl0(a) -> str:
    import llama_cpp.llama_cpp as L

    model = _load(a, 0)
    L.llama_model_free(model)
    return "loaded on the CPU, freed"


def step_load_ngl(a) -> str:
    import llama_cpp.llama_cpp as L

    model = _load(a, a.ngl)
    L.llama_model_free(model)
    return f"loaded with n_gpu_layers {a.ngl}, freed"


def step_load_ngl_all(a) -> str:
    import llama_cpp.llama_cpp as L

    model = _load(a, -1)
    L.llama_model_free(model)
    return "loaded with n_gpu_layers -1, freed"


def _context(a):
    import llama_cpp.llama_cpp as L

    model = _load(a, a.ngl)
    params = L.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = N_CTX, N_CTX, N_CTX
    say(f"llama_init_from_model(n_ctx={N_CTX})")
    ctx = L.llama_init_from_model(model, params)
    if not ctx:
        raise SystemExit("llama_init_from_model returned NULL")
    return model, ctx


def step_context(a) -> str:
    import llama_cpp.llama_cpp as L

    model, ctx = _context(a)
    n = L.llama_n_ctx(ctx)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return f"n_ctx {n}"


def _decode(a, tokens: list[int]) -> str:
    import numpy as np

    import llama_cpp.llama_cpp as L

    model, ctx = _context(a)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(len(tokens), 0, 1)
    for i, t in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t % n_vocab, i, 1, True
        batch.seq_id[i][0] = 0
    batch.n_tokens = len(tokens)
    say(f"llama_decode({len(tokens)} tokens)")
    rc = L.llama_decode(ctx, batch)
    if rc != 0:
        raise SystemExit(f"llama_decode returned {rc}")
    say("llama_get_logits_ith(-1)")
    row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
    top, finite = int(row.argmax()), bool(np.isfinite(row).all())
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return f"argmax {top}, logits finite: {finite}"


def step_decode1(a) -> str:
    return _decode(a, TOKENS[:1])


def step_decode5(a) -> str:
    return _decode(a, TOKENS)


def _specdec(a, vocab_only: bool = False):
    from specdec_cli.backend.native import Model

    say(f"specdec Model({a.target.name}, vocab_only={vocab_only})")
    return Model(a.target, vocab_only=vocab_only)


def step_specdec_model_vocab_only(a) -> str:
    with _specdec(a, vocab_only=True) as m:
        return f"{m.n_vocab} tokens"


def step_specdec_model(a) -> str:
    with _specdec(a) as m:
        return f"n_ctx_train {m.n_ctx_train}, {m.architecture}"


def _specdec_decode(a, tokens: list[int] | None) -> str:
    from specdec_cli.backend.context import Context

    with _specdec(a) as m:
        say(f"specdec Context(n_ctx={N_CTX}, n_threads={a.threads})")
        with Context(m, n_ctx=N_CTX, n_threads=a.threads) as ctx:
            if tokens is None:
                return f"n_ctx {ctx.n_ctx}, n_batch {ctx.n_batch}"
            say(f"specdec Context.decode({len(tokens)} tokens)")
            rows = ctx.decode([t % m.n_vocab for t in tokens], 0, 0, "all")
            return f"{rows.shape[0]} rows, argmax of the last {int(rows[-1].argmax())}"


def step_specdec_context(a) -> str:
    return _specdec_decode(a, None)


def step_specdec_decode1(a) -> str:
    return _specdec_decode(a, TOKENS[:1])


def step_specdec_decode5(a) -> str:
    return _specdec_decode(a, TOKENS)


STEPS = {name[5:]: fn for name, fn in globals().items() if name.startswith("step_")}  # in the order written


# --- the runner -----------------------------------------------------------------------------------------
def outcome(rc: int) -> str:
    """A child's return code in a word: ok, CRASH (its signal), TIMEOUT, FAIL."""
    if rc == 0:
        return "ok"
    if rc == 124:
        return "TIMEOUT"
    if rc < 0:
        return f"CRASH ({signal.Signals(-rc).name})" if -rc in signal.valid_signals() else f"CRASH (signal {-rc})"
    return f"FAIL (exit {rc})"


def before_crash(log: str, n: int) -> list[str]:
    """The last n lines before faulthandler's report (llama.cpp's last words), the report's first line; without a
    report, the log's last n lines."""
    lines = log.strip().splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
    return lines[-n:] if at is None else lines[max(0, at - n) : at + 1]


def stack_top(log: str, n: int) -> list[str]:
    """The crashing thread's innermost n frames from faulthandler's report ([] without one). A crash in a thread
    Python does not know (ggml's workers) names no current thread: then the last listed, the main thread."""
    lines = log.strip().splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith(("Current thread", "Thread 0x"))]
    top = next((i for i in heads if lines[i].startswith("Current thread")), heads[-1] if heads else None)
    return [] if top is None else lines[top : top + n + 1]


def excerpt(log: str) -> list[str]:
    """A crash's story from one log: the lines before faulthandler's report, the report, the top of the stack."""
    return before_crash(log, 3) + stack_top(log, TAIL)


def generated(lines: list[str]) -> str:
    """What `specdec generate --json` said: its one JSON line, in short."""
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                o = json.loads(line)
            except json.JSONDecodeError:
                return ""
            s = o.get("stats", {})
            return (
                f"{s.get('generated_tokens')} tokens, stop {o.get('stop_reason')}, "
                f"target on {o.get('config', {}).get('target_on')}, text {o.get('text', '')[:40]!r}"
            )
    return ""


def run_one(label: str, cmd: list[str], log: Path, env: dict) -> tuple[int, str]:
    """One child, its output into `log`; (return code, its last line that says something)."""
    t = time.perf_counter()
    with open(log, "wb") as f:
        try:
            rc = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, timeout=STEP_TIMEOUT
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    lines = log.read_text(errors="replace").splitlines()
    result = next((ln[8:] for ln in reversed(lines) if ln.startswith("RESULT: ")), "") or generated(lines)
    print(f"  {outcome(rc):18s} {label:28s} {time.perf_counter() - t:6.1f} s  {result[:100]}", flush=True)
    if rc != 0:
        for line in excerpt("\n".join(lines)):
            print(f"      | {line[:200]}", flush=True)
    return rc, result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, help="also `specdec generate --drafter model` with this draft")
    ap.add_argument("--out", type=Path, default=Path("."), help="logs go to OUT/diagnose/")
    ap.add_argument("--ngl", type=int, default=99, help="layers on the GPU for the low-level load [99]")
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--step", choices=list(STEPS), help=argparse.SUPPRESS)  # a child: run this step alone
    a = ap.parse_args()
    if a.step:
        print(f"RESULT: {STEPS[a.step](a)}", flush=True)
        return 0
    logs = a.out / "diagnose"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "SPECDEC_LLAMA_LOG": "1", "NO_COLOR": "1"}
    print(f"diagnose: {a.target} (n_gpu_layers {a.ngl}); python {sys.executable}; logs in {logs}", flush=True)
    me = [
        sys.executable,
        "-X",
        "faulthandler",
        __file__,
        "--target",
        str(a.target),
        "--ngl",
        str(a.ngl),
        "--threads",
        str(a.threads),
    ]
    rows = [(name, run_one(name, [*me, "--step", name], logs / f"{name}.log", env)) for name in STEPS]
    generate = [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "specdec_cli",
        "generate",
        "--target",
        str(a.target),
        "-n",
        "8",
        "--no-chat",
        "--json",
        "-t",
        str(a.threads),
        "-c",
        str(N_CTX),
    ]
    runs = {"specdec_generate_none": [*generate, "--drafter", "none", "Hello"]}
    if a.draft:
        runs["specdec_generate_model"] = [*generate, "--draft", str(a.draft), "--drafter", "model", "-k", "4", "Hello"]
    for name, cmd in runs.items():
        with tempfile.TemporaryDirectory(prefix="specdec-home-") as home:  # no cache of an earlier run
            rows.append((name, run_one(name, cmd, logs / f"{name}.log", {**env, "SPECDEC_HOME": home})))
    summary = "\n".join(f"{outcome(rc):18s} {name:28s} {result}" for name, (rc, result) in rows)
    (a.out / "diagnose.txt").write_text(summary + "\n")
    broken = [name for name, (rc, _) in rows if rc != 0]
    print(
        f"diagnose: {len(rows) - len(broken)} of {len(rows)} steps ok"
        + (f"; first broken: {broken[0]}" if broken else "")
    )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
