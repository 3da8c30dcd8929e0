"""The command line as scripts use it: exit codes, one-line errors, --json keys, plain output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from specdec_cli.cli import main

JSON_STATS = {
    "prompt_tokens", "generated_tokens", "rounds", "drafted", "accepted", "accept_rate", "mean_accepted",
    "per_position_accept", "tokens_per_second", "prefill_seconds", "draft_seconds", "verify_seconds",
    "wall_seconds", "by_drafter", "ttft_seconds", "wall_tokens_per_second", "measure_seconds",
}  # fmt: skip


def specdec(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


MEASURING = (
    "measuring this machine's costs"  # auto's progress line (a spinner on a terminal): said before a run's error
)


def one_line_error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith(MEASURING)]
    assert lines and lines[0].startswith("error: "), err
    assert len(lines) <= 2 and all(not line.startswith("Traceback") for line in lines), err
    return lines[0]


def test_json_has_the_contract_keys(capsys, models):
    code, out, _ = specdec(
        capsys, "generate", "hello", "--target", str(models["target"]), "--draft", str(models["draft"]),
        "--drafter", "model", "-n", "20", "-k", "3", "--json", "-t", "2",
    )  # fmt: skip
    assert code == 0
    obj = json.loads(out)
    assert set(obj) == {"text", "tokens", "stop_reason", "valid", "stats", "config"}
    assert obj["valid"] is None  # unconstrained
    assert JSON_STATS <= set(obj["stats"])
    assert len(obj["tokens"]) == obj["stats"]["generated_tokens"] == 20
    assert obj["stop_reason"] == "max_tokens"
    assert obj["config"]["drafter"] == "model" and obj["config"]["draft_tokens"] == 3
    s = obj["stats"]
    assert s["accept_rate"] == pytest.approx(s["accepted"] / s["drafted"], abs=1e-4)
    assert len(s["per_position_accept"]) == 3
    # The whole request: prefill and generation; the first token comes with the first round, after the prefill.
    assert s["wall_seconds"] == pytest.approx(s["prefill_seconds"] + s["generation_seconds"], abs=2e-4)
    assert s["wall_tokens_per_second"] == pytest.approx(20 / s["wall_seconds"], rel=1e-2)  # (rounded seconds)
    assert s["prefill_seconds"] < s["ttft_seconds"] <= s["wall_seconds"]
    assert s["wall_tokens_per_second"] < s["tokens_per_second"]


def test_json_reports_tree_drafting(capsys, models):
    code, out, err = specdec(
        capsys, "generate", "hello", "--target", str(models["target"]), "--draft", str(models["draft"]),
        "--drafter", "model", "-n", "30", "-k", "3", "--branches", "3", "--p-split", "0.02", "--json", "-t", "2",
    )  # fmt: skip
    assert code == 0, err
    obj = json.loads(out)
    s = obj["stats"]
    assert obj["config"]["branches"] == 3 and obj["config"]["p_split"] == 0.02
    assert s["tree_rounds"] > 0 and sum(s["branch_wins"]) == s["tree_rounds"] and len(s["branch_wins"]) <= 3
    assert 1 < s["mean_branches"] <= 3


def test_drafter_none_ignores_draft_and_reports_plain_decoding(capsys, models):
    code, out, _ = specdec(
        capsys, "generate", "hello", "--target", str(models["target"]), "--draft", str(models["draft"]),
        "--drafter", "none", "-n", "8", "--json",
    )  # fmt: skip
    s = json.loads(out)["stats"]
    assert code == 0 and s["drafted"] == 0 and s["mean_accepted"] == 1.0 and s["accept_rate"] == 0.0


def test_plain_output_goes_to_stdout_and_stats_to_stderr(capsys, models):
    args = ["generate", "hello", "--target", str(models["target"]), "--draft", str(models["draft"]), "-n", "16"]
    code, out, err = specdec(capsys, *args)
    _, js, _ = specdec(capsys, *args, "--json")
    assert code == 0
    assert out == json.loads(js)["text"] + "\n"
    assert "accept rate" in err and "tokens/s" in err


def test_chat_template_is_applied_by_default_when_present(capsys, models):
    args = ["generate", "hi", "--target", str(models["chat"]), "-n", "2", "--json"]
    with_chat = json.loads(specdec(capsys, *args)[1])
    without = json.loads(specdec(capsys, *args, "--no-chat")[1])
    assert with_chat["config"]["chat"] is True and without["config"]["chat"] is False
    # "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" in bytes, plus BOS
    assert with_chat["stats"]["prompt_tokens"] == 1 + len("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert without["stats"]["prompt_tokens"] == 1 + len("hi")


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--target", "{missing}"], 1, "model file not found"),
        (["--target", "{dir}"], 1, "is a directory"),
        (["--target", "{notgguf}"], 1, "is not a GGUF file"),
        (["--target", "{truncated}"], 1, "cannot load model"),
        (["--target", "{target}", "--draft", "{no_text}"], 2, "cannot draft for target"),
        (["--target", "{target}", "-n", "0"], 2, "--max-tokens must be at least 1"),
        (["--target", "{target}", "--draft", "{draft}", "-k", "0"], 2, "--draft-tokens must be at least 1"),
        (["--target", "{target}", "--temp", "-0.5"], 2, "--temp must be >= 0"),
        (["--target", "{target}", "--top-p", "0"], 2, "--top-p must be in (0, 1]"),
        (["--target", "{target}", "--top-p", "1.5"], 2, "--top-p must be in (0, 1]"),
        (["--target", "{target}", "--min-p", "2"], 2, "--min-p must be in [0, 1]"),
        (["--target", "{target}", "--drafter", "model"], 2, "--drafter model needs a draft model: --draft PATH"),
        (
            ["--target", "{target}", "--drafter", "magic"],
            2,
            "--drafter must be one of auto, model, mtp, eagle3, dflash, lookup, none (got 'magic')",
        ),
        (["--target", "{target}", "--draft", "{draft}", "--p-min", "1.5"], 2, "--p-min must be in [0, 1]"),
        (["--target", "{target}", "--draft", "{draft}", "--p-min", "-0.1"], 2, "--p-min must be in [0, 1]"),
        (["--target", "{target}", "--branches", "2"], 2, "--branches 2 needs a draft model"),
        (
            ["--target", "{target}", "--draft", "{draft}", "--drafter", "lookup", "--branches", "2"],
            2,
            "needs a draft model",
        ),
        (["--target", "{target}", "--draft", "{draft}", "--branches", "0"], 2, "--branches must be in 1..8"),
        (["--target", "{target}", "--draft", "{draft}", "--p-split", "0"], 2, "--p-split must be in (0, 1]"),
        (["--target", "{target}", "--draft", "{draft}", "-k", "many"], 2, "must be a whole number or 'auto'"),
        (["--target", "{target}", "--draft", "{draft}", "-k", "64"], 2, "--draft-tokens must be at most 63"),
        (["--target", "{recurrent}", "--drafter", "lookup"], 2, "cannot speculate: its architecture (mamba"),
        (["--target", "{target}", "--chat"], 2, "has no chat template"),
        (["--target", "{target}", "-n", "abc"], 2, "Invalid value for '-n' / '--max-tokens'"),
        (["--target", "{target}", "--bogus"], 2, "No such option"),
        (["--target", "{target}", "-c", "256", "--prompt-file"], 2, "No such option"),
    ],
)
def test_bad_input_is_one_clean_line(capsys, models, tmp_path, args, code, message):
    (tmp_path / "dir").mkdir()
    (tmp_path / "notgguf.gguf").write_text("this is not a model\n")
    data = models["target"].read_bytes()
    (tmp_path / "truncated.gguf").write_bytes(data[: len(data) // 2])
    paths = {
        "missing": tmp_path / "missing.gguf",
        "dir": tmp_path / "dir",
        "notgguf": tmp_path / "notgguf.gguf",
        "truncated": tmp_path / "truncated.gguf",
        **models,
    }
    argv = ["generate", "hello"] + [a.format(**paths) for a in args]
    got, out, err = specdec(capsys, *argv)
    assert got == code, err
    assert message in one_line_error(err)
    assert out == ""


def test_a_draft_of_another_tokenizer_drafts_through_text(capsys, models):
    args = ["generate", "hi", "--target", str(models["target"]), "--draft", str(models["other_vocab"]), "--json"]
    args += ["--drafter", "model", "-k", "3"]
    code, out, err = specdec(capsys, *args)
    assert code == 0, err
    assert json.loads(out)["stats"]["by_drafter"]["model"]["another_tokenizer"] is True


def test_a_target_that_cannot_roll_back_decodes_plainly_with_auto_and_refuses_the_other_drafters(capsys, models):
    rec = ["--target", str(models["recurrent"]), "--draft", str(models["recurrent"]), "-n", "5"]
    code, out, err = specdec(capsys, "generate", "hi", *rec, "--json")
    assert code == 0, err
    assert err.count("\n") == 1 and err.startswith("warning: recurrent.gguf cannot speculate: its architecture (mamba")
    assert "auto decodes it plainly" in err
    stats = json.loads(out)["stats"]
    assert stats["generated_tokens"] == 5 and stats["drafted"] == 0
    for drafter in ("model", "lookup"):
        code, _, err = specdec(capsys, "generate", "hi", *rec, "--drafter", drafter)
        assert code == 2 and f"--drafter {drafter}: target recurrent.gguf cannot speculate" in one_line_error(err)
        assert "mamba" in err.splitlines()[0]
    code, out, err = specdec(capsys, "generate", "hi", *rec, "--drafter", "none", "--json")
    assert code == 0 and err == "" and json.loads(out)["stats"]["generated_tokens"] == 5


def test_prompt_longer_than_context(capsys, models):
    code, _, err = specdec(capsys, "generate", "x" * 600, "--target", str(models["target"]), "-c", "256")
    assert code == 2 and "the prompt has 601 tokens but the context holds 256" in one_line_error(err)


def test_unexpected_errors_hide_the_traceback_unless_debug(capsys, models, monkeypatch):
    import specdec_cli.session as session

    def boom(self, prompt):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(session.Session, "prompt_tokens", boom)
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]))
    assert code == 1 and one_line_error(err) == "error: unexpected RuntimeError: kaboom"
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "--debug")
    assert code == 1 and "Traceback" in err


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_DEBUG"}
    return subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, env=env, **kw)


def test_prompt_from_stdin(models):
    a = cli("generate", "--target", str(models["target"]), "-n", "8", "--json", input="hello")
    b = cli("generate", "-", "--target", str(models["target"]), "-n", "8", "--json", input="hello")
    c = cli("generate", "hello", "--target", str(models["target"]), "-n", "8", "--json")
    assert a.returncode == b.returncode == c.returncode == 0, a.stderr + b.stderr
    assert json.loads(a.stdout)["tokens"] == json.loads(b.stdout)["tokens"] == json.loads(c.stdout)["tokens"]


def test_empty_stdin_is_a_usage_error(models):
    r = cli("generate", "--target", str(models["target"]), input="  \n")
    assert r.returncode == 2 and one_line_error(r.stderr).startswith(
        "error: the prompt read from standard input is empty"
    )


def test_ctrl_c_stops_cleanly_and_prints_statistics(models):
    """SIGINT mid-generation: exit 130, the text so far on stdout, the statistics on stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdec_cli", "generate", "hello", "--target", str(models["target"]),
         "--draft", str(models["draft"]), "-c", "16384", "-n", "16000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    first = proc.stdout.read(1)  # generation has started
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    err = err.decode()
    assert first and proc.returncode == 130, err
    assert "stop: interrupted" in err and "accept rate" in err
    assert "Traceback" not in err


def test_version_and_help():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("specdec ")
    r = cli("generate", "--help")
    for option in ("--target", "--draft", "--drafter", "--draft-tokens", "--max-tokens", "--temp", "--top-k",
                   "--top-p", "--min-p", "--seed", "--ctx-size", "--threads", "--chat", "--json", "--debug"):  # fmt: skip
        assert option in r.stdout


def test_a_native_crash_names_where_it_happened():
    """A SIGSEGV inside a native call (llama.cpp, a GPU driver) prints every thread's Python stack before the
    process dies, instead of an exit -11 with nothing on stderr (issue: GPUs)."""
    crash = (
        "import ctypes, importlib, sys\n"
        "m = importlib.import_module('specdec_cli.cli.main')\n"
        "@m.app.command('crash')\n"
        "def crash_in_native_code() -> None:\n"
        "    ctypes.string_at(0)\n"
        "sys.argv = ['specdec', 'crash']\n"
        "m.run()\n"
    )
    r = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True)
    assert r.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in r.stderr
    assert "in crash_in_native_code" in r.stderr, r.stderr


def test_a_usage_error_points_at_the_help_of_its_own_command(capsys, models):
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "--drafter", "magic")
    assert code == 2 and err.strip().splitlines()[1] == "hint: see 'specdec generate --help'"
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "--bogus")
    assert code == 2 and err.strip().splitlines()[1] == "hint: see 'specdec generate --help'"
    code, _, err = specdec(capsys, "nothing")
    assert code == 2 and err.strip().splitlines()[1] == "hint: see 'specdec --help'"
    from specdec_cli.cli.main import _command_path

    assert _command_path(["models", "pair", "x", "--json"]) == "specdec models pair"


def test_logprobs_without_json_is_refused_in_one_line_not_ignored(capsys, models):
    code, out, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "--logprobs", "2", "-n", "2")
    assert code == 2 and out == ""
    assert "--logprobs" in one_line_error(err) and "add --json" in err.strip().splitlines()[1]
    code, out, _ = specdec(
        capsys, "generate", "hi", "--target", str(models["target"]), "--logprobs", "2", "-n", "2", "--json"
    )
    assert code == 0 and len(json.loads(out)["logprobs"]) == 2


def test_a_draft_whose_tokens_spell_no_text_offers_a_way_on(capsys, models):
    code, _, err = specdec(
        capsys, "generate", "hi", "--target", str(models["target"]), "--draft", str(models["no_text"])
    )
    assert code == 2 and "spell no text" in one_line_error(err)
    assert "--drafter lookup" in err.strip().splitlines()[1]
