"""Each drafter is declared once (drafting.Kind): a new drafter is a Drafter and one declaration, and the
command line, the options' rules, the statistics and the bench know it from there."""

from __future__ import annotations

import json

import pytest

from specdec_cli import drafting
from specdec_cli.cli import main
from specdec_cli.engine.drafter import Draft, Drafter
from specdec_cli.errors import UsageError
from specdec_cli.options import RunConfig


class Echo(Drafter):
    """Drafts the last token again, k times (right on a run of one character)."""

    name = "echo"

    def propose(self, committed, k, sampler, rng) -> Draft:
        return Draft([committed[-1]] * k, None, source=self.name, k=k)


@pytest.fixture
def echo():
    declared = [
        drafting.declare(drafting.Kind(name="echo", build=lambda s: Echo(), help="the last token again")),
        drafting.declare(drafting.Kind(name="echo-model", build=lambda s: Echo(), model=drafting.NEEDS, help="-")),
    ]
    yield declared[0]
    for kind in declared:
        del drafting.DRAFTERS[kind.name]


def run(capsys, models, *args: str) -> dict:
    code = main(["generate", "aaaaaaaa", "--target", str(models["target"]), "-n", "24", "-t", "2", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_a_drafter_is_one_declaration(echo, models, capsys, tmp_path):
    plain = run(capsys, models, "--drafter", "none")
    mine = run(capsys, models, "--drafter", "echo", "-k", "3")
    assert mine["tokens"] == plain["tokens"] and mine["config"]["drafter"] == "echo"
    assert mine["stats"]["by_drafter"]["echo"]["drafted"] > 0  # its rounds, under its own name
    code = main(["generate", "aaaa", "--target", str(models["target"]), "-n", "8", "-t", "2", "--drafter", "echo"])
    assert code == 0 and "echo" in capsys.readouterr().err  # the statistics panel names its rounds
    with pytest.raises(UsageError, match="--drafter echo-model needs a draft model"):
        RunConfig(target=models["target"], drafter="echo-model")  # its traits are the options' rules
    j = tmp_path / "b.json"
    code = main(["bench", "--target", str(models["target"]), "--drafters", "echo", "--draft-tokens", "2,3",
                 "--categories", "math", "-n", "8", "-t", "2", "--json", str(j)])  # fmt: skip
    capsys.readouterr()
    assert code == 0
    rows = {(r["drafter"], r["draft_tokens"]) for r in json.loads(j.read_text())["rows"] if r["category"] == "all"}
    assert rows == {("none", 0), ("echo", 2), ("echo", 3)}  # swept at each -k, against the plain baseline


def test_an_unknown_drafter_names_the_declared_ones(models, capsys):
    code = main(["generate", "x", "--target", str(models["target"]), "--drafter", "magic"])
    err = capsys.readouterr().err
    assert code == 2 and "--drafter must be one of " + ", ".join(drafting.DRAFTERS) + " (got 'magic')" in err
