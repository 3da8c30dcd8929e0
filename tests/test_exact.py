"""Exact mode (--exact): every row of a target decode is the row of that token decoded alone, bit for
bit, so speculative output is target-only output token for token, on quantized models too.

The low-level tests compare logits rows of verify batches 1..32 wide with one-token decodes at KV
lengths around 256, 512 and 1,024 cells (llama.cpp pads the KV length it attends over to 256, and
ggml's CPU flash attention changes path at 512). The end-to-end tests compare greedy outputs of every
drafter with --drafter none on prompts that cross 512 and 1,024 cells. SmolLM2-135M and the F32
fixtures run everywhere; the default pair where the `models` extra installed it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import config, run_engine
from specdec_cli.backend import context as native_context
from specdec_cli.backend import cpu, native
from specdec_cli.backend.context import Context
from specdec_cli.backend.native import Model
from specdec_cli.bench import suite
from specdec_cli.cli import main
from specdec_cli.engine.kv import Branches, Sequence
from specdec_cli.session import RunConfig, open_session

LONG_EDITS = Path(__file__).parent.parent / "scripts" / "long-edits.jsonl"
WIDTHS = list(range(1, 33))
KV_LENGTHS = (250, 510, 1020)  # each verify batch then runs past 256, 512 or 1,024 cells
TEXT = LONG_EDITS.read_text()  # a long text to tokenize, whatever it says


def differing_rows(model: Model, widths=WIDTHS, kv_lengths=KV_LENGTHS) -> list[tuple[int, int, float]]:
    """(KV length, batch width, largest difference) wherever a batch row differs from the row of the
    same token decoded alone after the same cache."""
    out = []
    with Context(model, n_ctx=2048, n_threads=2, n_seq=8, max_outputs=64) as ctx:
        tokens = model.tokenize(TEXT, special=False)
        for n in kv_lengths:
            seq = Sequence.empty(ctx)
            seq.append(tokens[:n])
            after = tokens[n : n + max(widths)]
            alone = np.stack([seq.append([t], outputs="all")[0].copy() for t in after])
            for w in widths:
                seq.rollback(n)
                rows = seq.append(after[:w], outputs="all")
                gap = float(np.abs(rows - alone[:w]).max())
                if gap:
                    out.append((n, w, gap))
    return out


def exact_mode_is_what_makes_rows_agree(path: Path, widths: list[int], kv_lengths=KV_LENGTHS) -> None:
    """The negative control of exact mode's guarantee, which holds on every host: wherever the default
    (fast) kernels make a batch row differ from the row of its token decoded alone, exact mode's row at
    the same place is bit for bit the lone one. Whether the fast kernels differ at all depends on the
    host's (AVX2, AVX-512, VNNI: cpu.features()) and the model's weight types: where they do not, there
    is nothing for exact mode to remove, and the control skips saying so, rather than failing or passing
    for nothing. Speculative output without exact mode is allowed to differ, not bound to: a row gap
    changes a greedy token only at a near-tie, so outputs are not what a control can assert on."""
    with Model(path) as m:
        fast = differing_rows(m, widths, kv_lengths)
    if not fast:
        pytest.skip(
            f"this host's fast kernels ({cpu.features()}) give {path.name} batch rows bit for bit equal to lone "
            f"rows (widths {widths[0]}..{widths[-1]}, KV lengths {', '.join(map(str, kv_lengths))}): exact mode "
            "has no difference to remove here"
        )
    lengths, batch_widths = sorted({n for n, _, _ in fast}), sorted({w for _, w, _ in fast})
    with Model(path, exact=True) as m:
        left = differing_rows(m, batch_widths, lengths)
    # A no-op --exact fails here: its rows would differ as the fast ones do.
    assert left == [], f"exact mode leaves {len(left)} of the {len(fast)} fast-kernel differences: {left[:4]}"


# --- rows, bit for bit -------------------------------------------------------------------------------
def test_f32_fixture_rows_are_bit_exact_in_exact_mode_and_not_without(models):
    with Model(models["target"], exact=True) as m:
        assert m.sgemm_weights  # F32 matrices: sgemm for two rows or more, vec_dot for one
        assert differing_rows(m) == []
    with Model(models["target"]) as m:
        assert differing_rows(m, [1, 2, 8, 16], [250])  # the default kernels: a row depends on its batch


def test_without_the_twin_a_lone_token_is_computed_differently(models, monkeypatch):
    """The twin (a lone token decoded beside a copy of itself) is what makes one-row decodes agree
    with batches on a model with sgemm weights: reference kernels alone are not enough."""
    monkeypatch.setattr(native, "sgemm_weights", lambda path: [])
    with Model(models["target"], exact=True) as m:
        assert any(w > 1 for _, w, _ in differing_rows(m, [1, 2, 3, 8], [250]))


def test_smollm2_rows_are_bit_exact_in_exact_mode(smollm2):
    """Without exact mode they need not be (repacked Q4_1/Q8_0 weights, split-KV attention): the
    control, test_smollm2_without_exact_mode_rows_differ_where_exact_mode_makes_them_agree."""
    with Model(smollm2, exact=True) as m:
        assert differing_rows(m) == []


def test_default_pair_rows_are_bit_exact_in_exact_mode(default_pair):
    target, _ = default_pair
    with Model(target, exact=True) as m:
        assert differing_rows(m, [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32]) == []


def test_tree_rows_are_bit_exact_in_exact_mode(models):
    """One tree decode: every branch's rows are the rows it gets decoded alone."""
    with Model(models["target"], exact=True) as m, Context(m, n_ctx=512, n_threads=2, n_seq=4) as ctx:
        prompt = m.tokenize("fork me, and then fork me again", special=False)
        tree = Branches(Sequence.empty(ctx))
        tree.main.append(prompt[:-1])
        tree.fork(0)
        tree.fork(0)
        tokens = [prompt[-1], 50, 60, 61, 70, 51]
        rows = tree.decode(tokens, [(0, 1, 2), (0, 1), (0,), (1,), (1,), (2,)]).copy()
        for nodes in ([0, 1, 2], [0, 1, 3, 4], [0, 5]):
            alone = Sequence.empty(ctx)
            alone.append(prompt[:-1])
            for i in nodes:
                assert np.array_equal(rows[i], alone.append([tokens[i]], outputs="all")[0]), nodes
            tree = Branches(alone)


# --- greedy output, token for token ------------------------------------------------------------------
CONFIGS = [
    *(dict(drafter="model", draft_tokens=k) for k in (1, 3, 4, 8, 16)),
    dict(drafter="model", draft_tokens=4, branches=2),
    dict(drafter="model", draft_tokens=3, branches=3),
    dict(drafter="lookup", draft_tokens=4),
    dict(drafter="lookup", draft_tokens=None),
    dict(drafter="auto", draft_tokens=None),
]


def identity_failures(
    target: Path, draft: Path, prompts: list[str], exact: bool, max_tokens: int, configs: list[dict] = CONFIGS
) -> list[str]:
    """Every (prompt, drafter) whose greedy output differs from --drafter none's, in the given mode."""
    cfg = RunConfig(
        target=target, draft=draft, drafter="model", threads=2, max_tokens=max_tokens, exact=exact,
        p_split=0.02, debug=True,
    )  # fmt: skip
    failures = []
    with open_session(cfg) as s:
        for i, prompt in enumerate(prompts):
            tokens = s.prompt_tokens(prompt)
            base = run_engine(s, prompt, drafter="none")[0]
            for c in configs:
                overrides = {k: v for k, v in c.items() if k != "drafter"}
                ids = run_engine(s, prompt, drafter=c["drafter"], **overrides)[0]
                if ids != base:
                    at = next((j for j, (a, b) in enumerate(zip(ids, base)) if a != b), len(base))
                    failures.append(f"prompt {i} ({len(tokens)} tokens) {c}: differs at token {at}")
    return failures


def long_edits() -> list[str]:
    return [p.text for p in suite.load(str(LONG_EDITS), None)]


def test_smollm2_every_drafter_is_target_only_output_in_exact_mode(smollm2):
    """SmolLM2 drafts for itself with the default (fast) kernels, so near-ties can go either way in its
    drafts; the exact target must not care. The prompts (622 and 1,362 tokens) cross 512 and 1,024 cells."""
    assert identity_failures(smollm2, smollm2, long_edits()[:2], exact=True, max_tokens=48) == []


def test_smollm2_without_exact_mode_rows_differ_where_exact_mode_makes_them_agree(smollm2):
    """The test above holds because of exact mode: at the verify widths its drafters send (k + 1) and
    KV lengths past 256, 512 and 1,024 cells, the fast kernels' rows differ from lone rows (so its output
    may differ: on some hosts it does, from the first token) and exact mode's do not. Skips where this
    host's fast kernels are batch-invariant for SmolLM2 (exact_mode_is_what_makes_rows_agree)."""
    exact_mode_is_what_makes_rows_agree(smollm2, [1, 2, 4, 5, 8, 9, 16, 17])


DEFAULT_PAIR_PROMPTS = [0, 14]  # the built-in suite's, beside the 523- and 1,131-token edits


def test_default_pair_every_drafter_is_target_only_output_in_exact_mode(default_pair):
    target, draft = default_pair
    prompts = long_edits()[:2] + [suite.SUITE[i].text for i in DEFAULT_PAIR_PROMPTS]
    assert identity_failures(target, draft, prompts, exact=True, max_tokens=40) == []


def test_default_pair_without_exact_mode_rows_differ_where_exact_mode_makes_them_agree(default_pair):
    """The test above holds because of exact mode: the target's fast rows differ from lone rows at its
    verify widths (so outputs may differ: on some hosts they do), exact mode's do not. Skips where this
    host's fast kernels are batch-invariant for the target (exact_mode_is_what_makes_rows_agree)."""
    target, _ = default_pair
    exact_mode_is_what_makes_rows_agree(target, [1, 2, 4, 5, 8, 9, 16, 17])


def test_fixture_trees_are_target_only_output_in_exact_mode(models):
    """Tree rounds leave the winner's cells out of position order unless they are decoded again: with
    F32 weights and rows summed over cells in cell order, that alone changes outputs."""
    prompts = ["hello world", "The quick brown fox", "abcabcabc", "zq", "fork here and there"]
    base_cfg = config(models, None, exact=True, max_tokens=60)
    with open_session(base_cfg) as plain:
        expected = {p: run_engine(plain, p)[0] for p in prompts}
    for branches, k in ((2, 4), (3, 5), (8, 8)):
        with open_session(config(models, "draft", exact=True, branches=branches, p_split=0.02, max_tokens=60)) as s:
            for p in prompts:
                assert run_engine(s, p, draft_tokens=k)[0] == expected[p], (p, branches, k)


@pytest.mark.parametrize("drafter", ["none", "model"])
def test_exact_mode_runs_to_the_contexts_last_cell_and_stops_for_the_context(models, drafter):
    """A lone token's twin takes a cell of its own: at the context's last cell it had none, and the run failed
    (llama_decode: no free slot) where it should end as any run does at the context's end."""
    cfg = config(models, "draft" if drafter == "model" else None, exact=True, ctx_size=256, max_tokens=1000)
    with open_session(cfg) as s:
        tokens, stats, _ = run_engine(s, "hello world hello world")
        assert stats.stop_reason == "context"
        assert len(s.prompt_tokens("hello world hello world")) + len(tokens) >= s.n_ctx - 1


# --- the option ----------------------------------------------------------------------------------------
def test_exact_is_in_the_json_config_and_the_config_file(models, tmp_path, capsys):
    args = ["generate", "hi", "--target", str(models["target"]), "-n", "4", "--json"]
    assert main([*args, "--exact"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["exact"] is True
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["config"]["exact"] is False
    cfg = tmp_path / "specdec.toml"
    cfg.write_text(f'[pairs.default]\ntarget = "{models["target"]}"\ndrafter = "none"\nexact = true\n')
    assert main(["generate", "hi", "--config", str(cfg), "-n", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["exact"] is True
    cfg.write_text(f'[pairs.default]\ntarget = "{models["target"]}"\ndrafter = "none"\nexact = "yes"\n')
    assert main(["generate", "hi", "--config", str(cfg), "-n", "4"]) == 1
    assert "pairs.default.exact: must be bool" in capsys.readouterr().err


def test_exact_on_a_gpu_build_runs_and_says_where_the_guarantee_ends(models, monkeypatch, capsys):
    """Other backends are not refused: their kernels are their own, and the warning says so."""
    init = native_context.ReferenceKernels.__init__

    def with_a_gpu(self, ctx_ptr):
        init(self, ctx_ptr)
        self.others = 1

    monkeypatch.setattr(native_context.ReferenceKernels, "__init__", with_a_gpu)
    assert main(["generate", "hi", "--target", str(models["target"]), "-n", "2", "--exact"]) == 0
    assert "warning: --exact holds on CPU backends only" in capsys.readouterr().err


def test_a_build_without_the_reference_kernels_is_one_line(models, monkeypatch, capsys):
    monkeypatch.setattr(native_context, "native_lib", lambda: None)
    assert main(["generate", "hi", "--target", str(models["target"]), "-n", "2", "--exact"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --exact needs ggml's reference CPU kernels") and "Traceback" not in err
