"""llama.cpp's option names, and --help at 80 columns: what a llama.cpp user types works, or says what to type."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import one_line_error, specdec
from specdec_cli.option_table import REFUSED
from specdec_cli.options import LLAMA_NAMES, OPTIONS

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [
    [],
    ["generate"],
    ["bench"],
    ["batch"],
    ["serve"],
    ["rpc-server"],
    ["models"],
    *(["models", c] for c in ("list", "pair", "pull", "verify", "path", "info")),
    ["cache"],
    ["cache", "info"],
    ["cache", "clear"],
]


def test_llama_cpp_names_give_the_same_run_as_specdecs(capsys, models):
    target, draft = str(models["target"]), str(models["draft"])
    ours = ["hi", "--target", target, "--draft", draft, "--max-tokens", "4", "-k", "2", "--p-min", "0.1"]
    theirs = ["-p", "hi", "-m", target, "-md", draft, "--n-predict", "4", "--draft-max", "2", "--draft-p-min", "0.1"]
    runs = []
    for args in (ours, theirs):
        code, out, err = specdec(capsys, "generate", "--drafter", "model", "--json", *args)
        assert code == 0, err
        runs.append(json.loads(out))
    assert runs[0]["config"] == runs[1]["config"] and runs[0]["text"] == runs[1]["text"]
    assert runs[1]["config"]["draft_tokens"] == 2 and runs[1]["config"]["p_min"] == 0.1


def test_the_prompt_given_twice_is_one_usage_error(capsys, models):
    code, out, err = specdec(capsys, "generate", "hi", "-p", "there", "--target", str(models["target"]))
    assert code == 2 and out == ""
    assert "given twice, as PROMPT and as -p/--prompt" in one_line_error(err)


@pytest.mark.parametrize("name", ["--draft-min", "--draft-n-min", "--spec-draft-n-min"])
def test_a_minimum_draft_length_is_refused_with_what_specdec_does(capsys, models, name):
    code, out, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), name, "2")
    assert code == 2 and out == ""
    line = one_line_error(err)
    assert line.startswith(f"error: {name} is llama.cpp's") and "no minimum draft length" in line


@pytest.mark.parametrize(
    "args, said",
    [
        (["generate", "--temperature", "0.5"], "llama.cpp's --temperature is --temp here"),
        (["generate", "-sys", "be brief"], "llama.cpp's -sys is --system here"),  # Click names only its "-s"
        (["generate", "--n-gpu-layers", "3"], "llama.cpp's --n-gpu-layers is -ngl/--gpu-layers here"),
        (["bench", "--n-predict", "8"], "llama.cpp's --n-predict is -n/--max-tokens here"),  # bench's own -n
        (["bench", "--draft-max", "3"], "llama.cpp's --draft-max is --draft-tokens here"),
    ],
)
def test_a_llama_cpp_name_points_at_specdecs_not_at_a_spelling(capsys, args, said):
    code, out, err = specdec(capsys, *args)
    assert code == 2 and out == ""
    assert said in one_line_error(err)


def test_an_unknown_option_that_is_not_llama_cpps_keeps_clicks_message(capsys):
    code, _, err = specdec(capsys, "generate", "--bogus")
    assert code == 2 and "No such option: --bogus" in one_line_error(err)


def test_llama_cpp_names_are_each_one_options_and_none_is_refused_and_taken():
    flags = [f for o in OPTIONS for f in (*o.flags, *o.aliases)]
    assert len(flags) == len(set(flags))  # (Typer would take the last one silently)
    assert len(LLAMA_NAMES) == sum(len(o.aliases) + len(o.llama) for o in OPTIONS)
    assert not set(REFUSED) & (set(flags) | set(LLAMA_NAMES))
    assert all(o.panel for o in OPTIONS if o.key != "logprobs")  # (--logprobs: the general panel, with --json)


def _help(path: list[str], columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "dumb"}
    result = subprocess.run(
        [sys.executable, "-m", "specdec_cli", *path, "--help"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "specdec")
def test_every_help_reads_at_80_columns(path):
    text = _help(path, 80)
    assert "…" not in text  # no option name, value list or path cut
    assert max(len(line) for line in text.splitlines()) <= 80


def test_generate_help_is_grouped_as_llama_cpp_groups_its_options():
    text = _help(["generate"], 80)
    panels = [line.split("─")[1].strip() for line in text.splitlines() if line.startswith("╭─")]
    assert panels == [
        "Arguments", "Options", "Models", "Prompt", "Drafting", "Sampling", "Exact mode and caches", "Offload"
    ]  # fmt: skip
    assert len(text.splitlines()) < 220  # (315 in one panel, its descriptions ~20 characters wide)


def test_the_root_help_does_not_claim_lossless():
    text = " ".join(_help([], 80).split())
    assert "Lossless" not in text and "with --exact, its greedy output token for token" in text


def test_a_llama_name_without_its_value_is_told_so_not_called_unknown(capsys, models):
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "-m")
    assert code == 2 and "requires an argument" in one_line_error(err), err
