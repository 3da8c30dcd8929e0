"""specdec on a backend that is not the CPU: llama.cpp's Vulkan backend on Mesa's software driver (lavapipe).

scripts/test_vulkan.sh runs the tests marked `vulkan` a second time with a Vulkan build of llama.cpp
(LLAMA_CPP_LIB_PATH), lavapipe admitted as a device and SPECDEC_TEST_BACKEND=vulkan: every layer then goes to
Vulkan0. In the ordinary pass the same tests run on the CPU, where they hold too. The first test makes sure the
second pass is not the CPU pass again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.vulkan
ON_VULKAN = os.environ.get("SPECDEC_TEST_BACKEND") == "vulkan"


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "specdec_cli", *map(str, args)], capture_output=True, text=True, env=env, **kw
    )


def generate(models, *args: str) -> dict:
    r = cli(
        "generate", "alpha beta", "--target", models["target"], "--temp", "0", "-n", "24", "--no-chat", "--json", *args
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.skipif(not ON_VULKAN, reason="the Vulkan pass only (scripts/test_vulkan.sh)")
def test_the_vulkan_pass_puts_every_layer_on_vulkan(models):
    placed = generate(models, "--drafter", "none")["config"]["placement"]["target"]
    assert placed["offloaded"] == placed["layers"], placed
    vulkan = {name: d for name, d in placed["devices"].items() if name.startswith("Vulkan")}
    assert vulkan and sum(d["layers"] for d in vulkan.values()) == placed["layers"], placed
    assert all(d["model_bytes"] > 0 and d["kv_bytes"] > 0 for d in vulkan.values()), placed


# A speculative loop's decodes (verify batches of 1-16 tokens, each followed by removing the rejected tail) through
# specdec's own Context: on lavapipe with flash attention on, 6 of 10 seeds died with SIGSEGV within 15 decodes
# (scripts/vulkan_fa_replay.py shows llama.cpp alone does it too). A process per seed (what ran before in a process
# decides whether it crashes), and a crash fails the test instead of ending pytest.
ROLLBACKS = textwrap.dedent(
    """
    import random, sys
    from specdec_cli.backend.context import Context
    from specdec_cli.backend.native import Model
    from specdec_cli.engine.kv import Sequence
    rng = random.Random(int(sys.argv[2]))
    with Model(sys.argv[1]) as model, Context(model, n_ctx=4096, n_threads=2, n_seq=8) as ctx:
        seq = Sequence.empty(ctx)
        seq.append([rng.randrange(ctx.n_vocab) for _ in range(rng.randrange(5, 40))], outputs="all")
        for _ in range(40):
            k = rng.choice([1, 1, 1, 2, 3, 4, 5, 8, 12, 16])
            n = len(seq)
            seq.append([rng.randrange(ctx.n_vocab) for _ in range(k)], outputs="all")
            seq.rollback(n + rng.randrange(1, k + 1))
    print("ok")
    """
)


def test_speculative_rollbacks_do_not_crash_the_backend(models):
    for seed in range(1, 11):
        r = subprocess.run(
            [sys.executable, "-c", ROLLBACKS, str(models["target"]), str(seed)], capture_output=True, text=True
        )
        died = f"killed by {signal.Signals(-r.returncode).name}" if r.returncode < 0 else f"exit {r.returncode}"
        assert r.returncode == 0 and r.stdout.strip() == "ok", f"seed {seed}: {died}\n{r.stderr[-3000:]}"


@pytest.mark.parametrize(
    "args",
    [
        ("--drafter", "lookup"),
        ("--drafter", "model", "-k", "4"),
        ("--drafter", "model", "-k", "3", "--branches", "3"),
        ("--drafter", "auto"),
    ],
    ids=["lookup", "model-k4", "tree", "auto"],
)
def test_every_drafter_runs_and_accounts_for_its_tokens(models, args):
    """Each drafter speculates on this backend: its statistics add up, and its greedy text is the target's alone
    here (the fixtures' rows have no near-ties at these prompts; README, GPUs, says where identity can part)."""
    plain = generate(models, "--drafter", "none")
    out = generate(models, "--draft", models["draft"], *args)
    s = out["stats"]
    assert s["generated_tokens"] == 24 and 0 <= s["accepted"] <= s["drafted"]
    assert s["rounds"] == s["generated_tokens"] - s["accepted"] or s["stop_reason"] != "max_tokens"
    assert out["tokens"] == plain["tokens"]


def test_sampling_with_a_seed_repeats(models):
    """A fixed draft length: auto's choices follow measured times, and with them how many random draws a run takes."""
    a = generate(models, "--draft", models["draft"], "--drafter", "model", "-k", "3", "--temp", "0.8", "--seed", "7")
    b = generate(models, "--draft", models["draft"], "--drafter", "model", "-k", "3", "--temp", "0.8", "--seed", "7")
    assert a["tokens"] == b["tokens"]


def test_bench_batch_and_serve_run(models, tmp_path: Path):
    r = cli(
        "bench",
        "--target",
        models["target"],
        "--draft",
        models["draft"],
        "-n",
        "8",
        "--runs",
        "1",
        "--drafters",
        "none,model",
        "--json",
        tmp_path / "bench.json",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "bench.json").read_text())
    requests = tmp_path / "requests.jsonl"
    requests.write_text('{"prompt": "alpha beta", "max_tokens": 8}\n{"prompt": "gamma", "max_tokens": 8}\n')
    r = cli("batch", requests, "-o", tmp_path / "out.jsonl", "--target", models["target"], "--draft", models["draft"])
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(row["error"] is None and row["response"]["status_code"] == 200 for row in rows)


def test_exact_mode_keeps_the_target_on_the_cpu_and_holds(models):
    """README, GPUs: exact mode's promise is a property of ggml's CPU kernels, so its target stays on the CPU (the
    draft does not: its numerics never change the output), and speculative output is the target's alone there."""
    plain = generate(models, "--exact", "--drafter", "none")
    spec = generate(models, "--exact", "--draft", models["draft"], "--drafter", "model", "-k", "4")
    assert spec["tokens"] == plain["tokens"]
    target = spec["config"]["placement"]["target"]
    assert target is None or target["offloaded"] == 0, target


@pytest.mark.skipif(not ON_VULKAN, reason="needs a GPU device to refuse (the Vulkan pass)")
def test_exact_mode_refuses_a_target_asked_onto_the_gpu(models):
    r = cli("generate", "hi", "--target", models["target"], "--exact", "-ngl", "all")
    assert r.returncode == 2 and r.stderr.startswith("error: --exact keeps the target on the CPU"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 2  # the error and its hint


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    import native_models

    return native_models.write_native_set(tmp_path_factory.mktemp("native"))


@pytest.mark.parametrize("draft", ["eagle3", "dflash"])
@pytest.mark.parametrize("where", [(), ("-ngld", "0")], ids=["draft-offloaded", "draft-on-cpu"])
def test_drafts_of_the_targets_hidden_states_run_here(native, draft, where):
    """EAGLE-3 and DFlash on this backend: the target's layer inputs read back from it, the draft (borrowing the
    target's embeddings and head) beside it on the device or on the CPU (-ngld 0); greedy text the target's alone,
    their designed drafts accepted."""
    args = ("--target", native["counter"], "--temp", "0", "-n", "40", "--no-chat", "--json")
    plain = cli("generate", "abcdefghijkl", *args, "--drafter", "none")
    spec = cli("generate", "abcdefghijkl", *args, "--draft", native[draft], "--drafter", draft, "-k", "4", *where)
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    got = json.loads(spec.stdout)
    assert got["tokens"] == json.loads(plain.stdout)["tokens"]
    assert got["stats"]["by_drafter"][draft]["accepted"] > 0
