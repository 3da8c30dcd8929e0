"""The context fits the models: with no -c, the smaller of 4,096 tokens and what the target was trained
for, and for the draft the smaller of that and its own; only an explicit -c beyond a trained length is
an error. Every command makes its contexts through Session, so generate, bench, serve and --rpc runs
share this."""

from __future__ import annotations

import json

from conftest import config, run_engine
from test_cli import one_line_error, specdec
from specdec_cli.engine.events import Notice
from specdec_cli.engine.stats import collect
from specdec_cli.option_limits import CTX_SIZE
from specdec_cli.session import open_session


def test_a_model_trained_for_fewer_tokens_runs_with_no_context_given(capsys, models):
    code, out, err = specdec(capsys, "generate", "hello", "--target", str(models["short_ctx"]), "-n", "8", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["config"]["ctx_size"] == 1024 and doc["stats"]["generated_tokens"] == 8


def test_an_explicit_context_beyond_the_trained_length_is_one_error(capsys, models):
    code, _, err = specdec(capsys, "generate", "hello", "--target", str(models["short_ctx"]), "-c", "2048")
    assert code == 2
    assert "a context of 2,048 tokens is more than target short_ctx.gguf was trained for (1,024)" in one_line_error(err)
    code, out, err = specdec(capsys, "generate", "hi", "--target", str(models["short_ctx"]), "-c", "1024", "--json")
    assert code == 0 and json.loads(out)["config"]["ctx_size"] == 1024, err


def test_the_default_is_4096_for_a_model_trained_for_more(capsys, models):
    code, out, _ = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "-n", "2", "--json")
    assert code == 0 and json.loads(out)["config"]["ctx_size"] == CTX_SIZE


def test_a_draft_trained_for_less_gets_its_own_context_and_drafts_on_past_it_in_a_window(models):
    """Target 4,096 tokens, draft 1,024: past the draft's context its window slides within it (draft_window 0,
    the whole text, included), and the output is still target-only output."""
    prompt = "abcdefghij" * 99  # 991 tokens: the answer crosses 1,024
    for size in (512, 0):
        with open_session(config(models, "short_ctx", ctx_size=None, max_tokens=80, draft_window=size)) as s:
            assert (s.target_ctx.n_ctx, s.draft_ctx.n_ctx) == (CTX_SIZE, 1024)
            events = list(s.generate(s.prompt_tokens(prompt), draft_tokens=4))
            drafted = collect(iter(events))
            plain = run_engine(s, prompt, drafter="none")[0]
            assert s.draft_ctx.seq_pos_range(0)[1] < 1024
        assert drafted.tokens == plain and len(plain) == 80
        assert not [e for e in events if isinstance(e, Notice)] and drafted.stats.accepted > 40


def test_a_servers_default_slots_count_the_cells_idle_slots_park_in_memory(models, monkeypatch):
    """Idle slots park their kept cells in this machine's memory (engine/kv.py's Kept), wherever the layers are:
    memory for four slots' caches but not for three idle slots' parked cells gets fewer slots, not an OOM later."""
    from specdec_cli import fit

    cfg = config(models, draft=None, ctx_size=512)
    with open_session(cfg, slots=1) as s:
        one = 512 * s.target.kv_bytes_per_token()
    monkeypatch.setattr(fit, "available_memory", lambda: 4 * one + one // 2)  # four caches and half of one more
    with open_session(cfg, slots=0) as s:
        assert s.layout.slots == 2  # 2 caches + 1 parked = 3 fit; 3 + 2 = 5 do not
