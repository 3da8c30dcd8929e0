"""Real GGUF models from the package index. SmolLM2-135M runs in CI (the test extra installs it);
the 1.6 GB default pair runs where the `models` extra is installed, and skips otherwise."""

from __future__ import annotations

import json

from conftest import run_engine

from specdec_cli.cli import main
from specdec_cli.engine.kv import Sequence
from specdec_cli.session import RunConfig, open_session

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain recursion to a child."]


def test_smollm2_as_its_own_draft_accepts_everything_and_matches_target_only(smollm2):
    base = dict(target=smollm2, threads=2, max_tokens=48, debug=True)
    with (
        open_session(RunConfig(**base)) as plain,
        open_session(RunConfig(**base, draft=smollm2, drafter="model")) as spec,
    ):
        for prompt in PROMPTS:
            expected, _, text = run_engine(plain, prompt)
            assert text.strip()
            for k in (2, 5):
                ids, stats, _ = run_engine(spec, prompt, draft_tokens=k)
                assert ids == expected, (prompt, k)
                assert stats.drafted > 0 and stats.accept_rate == 1.0, (prompt, k)


def test_smollm2_chat_template_is_applied(smollm2):
    with open_session(RunConfig(target=smollm2, threads=2)) as s:
        chat = s.prompt_tokens("hi")
        raw = s.target.tokenize("hi", special=True)
        im_start = s.target.tokenize("<|im_start|>", special=True)[-1]
        assert len(chat) > len(raw) and chat.count(im_start) >= 2  # (system,) user and assistant turns
    with open_session(RunConfig(target=smollm2, threads=2, chat=False)) as s:
        assert s.prompt_tokens("hi") == raw


def test_smollm2_through_the_cli(smollm2, capsys):
    assert (
        main(
            [
                "generate",
                "Say hi.",
                "--target",
                str(smollm2),
                "--draft",
                str(smollm2),
                "--drafter",
                "model",
                "-n",
                "16",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["chat"] is True and out["stats"]["accept_rate"] == 1.0
    assert main(["models", "info", str(smollm2), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts["architecture"], facts["vocab_size"], facts["chat_template"]) == ("llama", 49152, True)
    assert facts["quantisation"] == "Q4_1" and 100e6 < facts["parameters"] < 200e6


def test_default_pair_greedy_matches_target_only_up_to_near_ties(default_pair):
    """Q4 weights: a batch of tokens and one token at a time can differ in the last bits, so at a
    near-tie the two may pick different tokens. Where they differ, it must be such a tie."""
    target, draft = default_pair
    base = dict(target=target, threads=2, max_tokens=48)
    with (
        open_session(RunConfig(**base)) as plain,
        open_session(RunConfig(**base, draft=draft, drafter="model")) as spec,
    ):
        for prompt in ["Write a Python function that checks whether a number is prime.", "What is a hash table?"]:
            expected, _, _ = run_engine(plain, prompt)
            ids, stats, _ = run_engine(spec, prompt, draft_tokens=3)
            assert stats.accept_rate > 0.5
            if ids != expected:
                i = next(i for i, (a, b) in enumerate(zip(ids, expected)) if a != b)
                seq = Sequence.empty(plain.target_ctx)
                row = seq.append(plain.prompt_tokens(prompt) + expected[:i])[0]
                gap = abs(float(row[ids[i]]) - float(row[expected[i]]))
                assert gap < 0.5, f"{prompt!r}: outputs differ at token {i} where the logits differ by {gap:.3f}"


def test_default_pair_can_pair(default_pair, capsys):
    target, draft = default_pair
    assert main(["models", "info", str(target), "--draft", str(draft), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["can_pair"] is True and facts["vocab_size"] == 151936


def test_default_pair_from_two_stores_chooses_the_half_b_draft_and_says_so(default_pair, tmp_path, monkeypatch, capsys):
    """The 1.5B in the Hugging Face cache (as `hf download` lays it out), the 0.5B and SmolLM2 in Ollama's store:
    a run that names the 1.5B by its repository and no draft drafts with the 0.5B, and says so."""
    from test_model_stores import hf_repo, ollama

    target, draft = default_pair
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "specdec"))  # no catalogue model: only the stores
    home = tmp_path / "home"
    hf_repo(home / ".cache/huggingface/hub", "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", {target.name: target}, link=True)
    ollama(home / ".ollama/models", "qwen2.5-coder:0.5b", draft, link=True)
    args = ["generate", "Say hi.", "--target", "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "-n", "4", "--json", "-t", "2"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    config = json.loads(out)["config"]
    assert config["draft_chosen_by"] == "auto" and config["draft"].endswith(".ollama/models/blobs/sha256-" + "d" * 64)
    assert "draft: qwen2.5-coder:0.5b (ollama), the only local model that can draft for" in err
