#!/usr/bin/env python3
"""llama.cpp's own speculative loop, as the reference for specdec's EAGLE-3 and DFlash drafters.

`build`: llama-speculative-simple from the llama.cpp that the installed llama-cpp-python vendors (its source
distribution, from the package index), CPU only, into the tools folder ($SPECDEC_LLAMA_TOOLS, else
~/.cache/specdec/llama-tools/VERSION; about 6 minutes on 2 cores, once), with a small preload library that makes its
log reliable: llama.cpp leaks its log worker on purpose and exits before it has printed the last lines
(ggml-org/llama.cpp#22142), so the library's destructor drains it (common_log_pause joins the worker).

`rounds(...)`: run it greedy on a target and a draft and read its rounds from its debug log: each round's draft
(the draft's best candidate at each position, as many as the round kept; DFlash2's walk logs none: its length) and
how many the target accepted.

    python scripts/llama_reference.py build
    python scripts/llama_reference.py run --target T.gguf --draft D.gguf --type draft-eagle3 -k 4 -n 40 "abc"
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

TOOL = "llama-speculative-simple"
PRELOAD = "libflushlog.so"
FLUSH_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
/* At exit, drain llama.cpp's log worker (common_log_pause joins it after it has printed what was queued). */
__attribute__((destructor)) static void flush_log(void) {
    void *(*main_log)(void) = (void *(*)(void)) dlsym(RTLD_DEFAULT, "_Z15common_log_mainv");
    void (*pause)(void *) = (void (*)(void *)) dlsym(RTLD_DEFAULT, "_Z16common_log_pauseP10common_log");
    if (main_log && pause) pause(main_log());
}
"""
CANDIDATE = re.compile(r"draft candidate +0, pos +(\d+): +(\d+)")
ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def version() -> str:
    import llama_cpp

    return llama_cpp.__version__


def folder() -> Path:
    given = os.environ.get("SPECDEC_LLAMA_TOOLS")
    return Path(given) if given else Path.home() / ".cache" / "specdec" / "llama-tools" / version()


def tool() -> Path | None:
    """The built tool, or None (not built: `build`)."""
    path = folder() / "bin" / TOOL
    return path if path.is_file() and (folder() / PRELOAD).is_file() else None


def build(jobs: int = 2) -> Path:
    """Build the tool (a no-op where it is built); returns its path."""
    done = tool()
    if done:
        return done
    out = folder()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={version()}", "-d", tmp],
            check=True,
        )  # fmt: skip
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as t:
            t.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
        build_dir = Path(tmp) / "build"
        flags = ["-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DGGML_NATIVE=ON",
                 f"-DCMAKE_RUNTIME_OUTPUT_DIRECTORY={out / 'bin'}", f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out / 'bin'}"]  # fmt: skip
        subprocess.run(["cmake", "-S", src, "-B", build_dir, *flags], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", build_dir, "-j", str(jobs), "--target", TOOL], check=True)
    c = out / "flushlog.c"
    c.write_text(FLUSH_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", out / PRELOAD, c, "-ldl"], check=True)
    return out / "bin" / TOOL


@dataclass(frozen=True)
class Round:
    draft: tuple[int, ...] | None  # the token ids the round verified (None: its drafter logs none, as DFlash2's)
    drafted: int
    accepted: int


def _run(target, draft, spec_type: str, k: int, n: int, prompt: str, threads: int, verbosity: int, ctx: int) -> str:
    """Greedy llama-speculative-simple on `prompt`: its log."""
    exe = tool()
    if exe is None:
        raise FileNotFoundError(f"{TOOL} is not built: python scripts/llama_reference.py build")
    args = [exe, "-m", target, "-md", draft, "--spec-type", spec_type, "--spec-draft-n-max", str(k),
            "--temp", "0", "-t", str(threads), "-td", str(threads), "-c", str(ctx), "-n", str(n), "-p", prompt,
            "--poll", "0", "-lv", str(verbosity)]  # fmt: skip
    if _amx():  # as specdec loads them there: ggml's AMX weight layout crashes on these CPUs (docs/gpu.md)
        args.append("--no-repack")
    env = dict(os.environ, LD_PRELOAD=str(folder() / PRELOAD), LD_LIBRARY_PATH=str(exe.parent))
    run = subprocess.run([str(a) for a in args], capture_output=True, env=env, timeout=600)
    if run.returncode != 0:
        raise RuntimeError(f"{TOOL} exited {run.returncode}: {run.stderr.decode('utf-8', 'replace')[-2000:]}")
    return run.stderr.decode("utf-8", "replace")


def _amx() -> bool:
    from specdec_cli.backend import cpu

    return cpu.amx()


@dataclass(frozen=True)
class Timing:
    """What one run says of its time: the generation (after the prompt) and the drafter's part of it."""

    tokens: int  # decoded
    seconds: float  # the generation's
    rounds: int  # the drafter's calls to draft
    draft_ms: float  # in the drafter's draft() (its decodes included; its process() of the target's rows is not)
    drafted: int
    accepted: int


STATS = re.compile(
    r"#calls\(b,g,a\) = +\d+ +(\d+) +\d+.*#gen tokens = +(\d+), #acc tokens = +(\d+).*dur\(b,g,a\) = [\d.]+, ([\d.]+),"
)
DECODED = re.compile(r"decoded +(\d+) tokens in +([\d.]+) seconds")


def timed(target, draft, spec_type: str, k: int, n: int, prompt: str, threads: int = 2, ctx: int = 4096) -> Timing:
    """A run for its timing: the log at the level that prints the statistics, not every candidate."""
    log = _run(target, draft, spec_type, k, n, prompt, threads, 4, ctx)
    d, s = DECODED.search(log), STATS.search(log)
    if not d or not s:
        raise RuntimeError(f"{TOOL} printed no statistics: {log[-1000:]}")
    return Timing(
        int(d.group(1)), float(d.group(2)), int(s.group(1)), float(s.group(4)), int(s.group(2)), int(s.group(3))
    )


def rounds(target: Path, draft: Path, spec_type: str, k: int, n: int, prompt: str, threads: int = 2) -> list[Round]:
    """Greedy llama-speculative-simple on `prompt`: its rounds, in order."""
    out, found, candidates = [], [], []
    for line in _run(target, draft, spec_type, k, n, prompt, threads, 5, 2048).splitlines():
        if m := CANDIDATE.search(line):
            candidates.append(int(m.group(2)))
        elif m := ACCEPTED.search(line):
            accepted, drafted = int(m.group(1)), int(m.group(2))
            found.append(Round(tuple(candidates[:drafted]) if candidates or not drafted else None, drafted, accepted))
            candidates = []
    out.extend(found)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build llama-speculative-simple (once)")
    b.add_argument("-j", "--jobs", type=int, default=2)
    r = sub.add_parser("run", help="its rounds on a pair, one a line")
    r.add_argument("--target", type=Path, required=True)
    r.add_argument("--draft", type=Path, required=True)
    r.add_argument("--type", default="draft-eagle3", choices=["draft-eagle3", "draft-dflash"])
    r.add_argument("-k", type=int, default=4)
    r.add_argument("-n", type=int, default=40)
    r.add_argument("prompt")
    args = p.parse_args()
    if args.command == "build":
        print(build(args.jobs))
        return 0
    for i, rd in enumerate(rounds(args.target, args.draft, args.type, args.k, args.n, args.prompt)):
        print(f"round {i:3d}: accepted {rd.accepted}/{rd.drafted}" + (f" of {list(rd.draft)}" if rd.draft else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
