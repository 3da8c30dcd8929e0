#!/usr/bin/env python3
"""What the model stores cost: `specdec models list` over many GGUF files (the first time, when every header is
read, and again, from the header cache), and what a `generate` start-up pays for them (the draft chosen among
them where no --draft is given).

    python scripts/stores_bench.py --files 1000 --runs 7 [--against /path/to/older/checkout]

It lays out a temporary HOME as the tools write their stores (Hugging Face hub cache, llama.cpp's cache, LM
Studio, Ollama; a quarter of the files each), from one tiny GGUF (tests/tiny_models.py) copied under other names,
and points SPECDEC_HOME at an empty folder. Timed from outside, as a user waits: each command a fresh process,
`--runs` times, interleaved with its comparison, medians. The start-up: `generate -n 1` on the tiny target with
no --draft, the stores present against an empty HOME; with --against, also against that checkout's `generate`
(PYTHONPATH) in the same HOME: the start-up of today's release.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from tiny_models import byte_vocab, random_weights, write_model  # noqa: E402


def build(home: Path, model: Path, n: int) -> None:
    """n copies of `model` across the four stores' layouts (as tests/test_model_stores.py writes them)."""
    per = max(n // 4, 1)
    hub = home / ".cache" / "huggingface" / "hub"
    for i in range(per):
        root = hub / f"models--org{i}--Repo{i}-GGUF"
        commit = hashlib.sha1(str(i).encode()).hexdigest()
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text(commit)
        (root / "blobs").mkdir()
        shutil.copy(model, root / "blobs" / "b")
        (root / "snapshots" / commit).mkdir(parents=True)
        (root / "snapshots" / commit / f"repo{i}-Q4_K_M.gguf").symlink_to("../../blobs/b")
    llama = home / ".cache" / "llama.cpp"
    llama.mkdir(parents=True)
    for i in range(per):
        (llama / f"manifest=org{i}=Old{i}-GGUF=latest.json").write_text(
            json.dumps({"ggufFile": {"rfilename": f"old{i}-Q8_0.gguf"}})
        )
        shutil.copy(model, llama / f"org{i}_Old{i}-GGUF_old{i}-Q8_0.gguf")
    for i in range(per):
        d = home / ".lmstudio" / "models" / f"pub{i}" / f"Lm{i}-GGUF"
        d.mkdir(parents=True)
        shutil.copy(model, d / f"lm{i}-Q4_0.gguf")
    o = home / ".ollama" / "models"
    (o / "blobs").mkdir(parents=True)
    for i in range(n - 3 * per):
        blob = hashlib.sha256(f"{i}".encode()).hexdigest()
        shutil.copy(model, o / "blobs" / f"sha256-{blob}")
        m = o / "manifests" / "registry.ollama.ai" / "library" / f"model{i}"
        m.mkdir(parents=True)
        layer = {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{blob}", "size": 1}
        (m / "latest").write_text(json.dumps({"schemaVersion": 2, "layers": [layer]}))


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--against", default=None, help="an older checkout: its generate's start-up, same HOME")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokens = byte_vocab()
        target = write_model(tmp / "target.gguf", random_weights(1234, len(tokens)), tokens)
        stores, empty = tmp / "home", tmp / "empty"
        empty.mkdir()
        build(stores, target, a.files)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LLAMA_CACHE", "OLLAMA", "XDG_"))}
        base |= {"SPECDEC_HOME": str(tmp / "specdec"), "SPECDEC_COST_CURVES": str(tmp / "curves")}
        env = {**base, "HOME": str(stores), "PYTHONPATH": str(HERE.parent)}
        specdec = [sys.executable, "-m", "specdec_cli"]
        listing = [*specdec, "models", "list", "--json"]
        first = timed(listing, env)
        out = json.loads(subprocess.run(listing, env=env, capture_output=True, text=True, check=True).stdout)
        found = sum(m["source"] != "specdec" for m in out["models"])
        again = statistics.median(timed(listing, env) for _ in range(a.runs))
        print(f"models list over {found} GGUF files: first {first:.3f} s, again {again:.3f} s (median of {a.runs})")

        gen = [*specdec, "generate", "hi", "--target", str(target), "-n", "1", "-t", "1", "--no-lookup-cache"]
        variants = {"stores": env, "no stores": {**env, "HOME": str(empty)}}
        if a.against:
            variants["against, stores"] = {**env, "PYTHONPATH": a.against}
        for e in variants.values():
            timed(gen, e)  # warm-up: page cache, the cost curve
        times: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(a.runs):
            for name in variants if r % 2 == 0 else list(variants)[::-1]:
                times[name].append(timed(gen, variants[name]))
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in med.items():
            print(f"generate start-up (-n 1, tiny target, no --draft), {k}: {v:.3f} s")
        print(f"stores present cost {1000 * (med['stores'] - med['no stores']):+.0f} ms", end="")
        if a.against:
            print(
                f"; against the other checkout in the same HOME {1000 * (med['stores'] - med['against, stores']):+.0f} ms"
            )
        print()


if __name__ == "__main__":
    main()
