from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import write_fixture_set  # noqa: E402

from specdec_cli.drafting import cost as costmodel  # noqa: E402
from specdec_cli.drafting import measure as measurement  # noqa: E402
from specdec_cli.engine import shapes  # noqa: E402
from specdec_cli.models import store  # noqa: E402
from specdec_cli.run_inputs import Inputs  # noqa: E402
from specdec_cli.models.catalog import GEMMA3, QWEN_DRAFT, QWEN_TARGET, SMOLLM2, KnownModel  # noqa: E402
from specdec_cli.engine.stats import Stats, collect  # noqa: E402
from specdec_cli.session import RunConfig, open_session  # noqa: E402


@pytest.fixture(autouse=True)
def own_lookup_cache(tmp_path, monkeypatch) -> Path:
    """Every test its own lookup cache: runs must not draft from the user's answers or another test's."""
    folder = tmp_path / "lookup-cache"
    monkeypatch.setenv("SPECDEC_LOOKUP_CACHE", str(folder))
    return folder


@pytest.fixture(autouse=True)
def own_prefix_cache(tmp_path, monkeypatch) -> Path:
    """Every test (and the servers it starts) its own prefix cache: a test's long prompts must not be written
    to the user's cache, nor restored from another test's."""
    folder = tmp_path / "prefix-cache"
    monkeypatch.setenv("SPECDEC_PREFIX_CACHE", str(folder))
    return folder


@pytest.fixture(autouse=True)
def own_cost_curves(tmp_path, monkeypatch) -> Path:
    """Every test (and the processes it starts) its own kept cost curves: a test that measures must not
    get another's curve, nor the user's."""
    folder = tmp_path / "cost-curves"
    monkeypatch.setenv("SPECDEC_COST_CURVES", str(folder))
    return folder


STORE_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "LLAMA_CACHE", "OLLAMA_MODELS", "XDG_CACHE_HOME")


@pytest.fixture(autouse=True)
def no_model_stores(tmp_path, monkeypatch) -> Path:
    """Every test (and the processes it starts) sees none of the user's model stores (Hugging Face, llama.cpp,
    LM Studio, Ollama, their config): a run without --draft chooses a draft among them, and must not choose
    the user's. The catalogue's models stay where they are (SPECDEC_HOME is pinned before HOME moves)."""
    monkeypatch.setenv("SPECDEC_HOME", str(store.home()))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    for var in STORE_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "home"


def gguf(model: KnownModel, tmp_path_factory) -> Path:
    """The model's GGUF: the user's assembled copy if there is one, else assembled into a temp dir."""
    st = store.status(model)
    if st.state == store.READY:
        return st.path
    if st.state == store.NOT_DOWNLOADED:
        pytest.skip(f"{model.name} is not installed (pip install '.[models]' installs it)")
    home = tmp_path_factory.getbasetemp() / "specdec-home"
    old = os.environ.get("SPECDEC_HOME")
    os.environ["SPECDEC_HOME"] = str(home)
    try:
        return store.ensure(model)
    finally:
        if old is None:
            del os.environ["SPECDEC_HOME"]
        else:
            os.environ["SPECDEC_HOME"] = old


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> Path:
    return gguf(SMOLLM2, tmp_path_factory)


@pytest.fixture(scope="session")
def gemma3(tmp_path_factory) -> Path:
    """Gemma 3 270M (sliding-window attention): where the `models` extra installed it."""
    return gguf(GEMMA3, tmp_path_factory)


@pytest.fixture(scope="session")
def default_pair(tmp_path_factory) -> tuple[Path, Path]:
    """The real default pair (Qwen2.5-Coder 1.5B <- 0.5B): where the `models` extra installed it."""
    return gguf(QWEN_TARGET, tmp_path_factory), gguf(QWEN_DRAFT, tmp_path_factory)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """The tiny F32 GGUF set: target, draft (noisy), same (identical), other_vocab, chat."""
    return write_fixture_set(tmp_path_factory.mktemp("models"))


def run_engine(session, prompt: str, **overrides):
    """Generate through an open session; return (token ids, Stats, text)."""
    inputs, settings = split_inputs(overrides)
    r = collect(session.generate(session.prompt_tokens(prompt), inputs, **settings))
    return r.tokens, r.stats, r.text


def split_inputs(overrides: dict) -> tuple[Inputs, dict]:
    """A run's keywords as Session.generate takes them: its inputs (`gbnf`: a request's grammar), its settings."""
    names = {f.name for f in dataclasses.fields(Inputs)}
    given = {("grammar" if k == "gbnf" else k): v for k, v in overrides.items() if k in names or k == "gbnf"}
    return Inputs(**given), {k: v for k, v in overrides.items() if k not in names and k != "gbnf"}


def sample_counts(session, prompt: str, n: int, **overrides) -> tuple[dict, Stats]:
    """Generate with seeds 0..n-1: how often each output (a tuple of token ids) came, and the summed statistics."""
    tokens = session.prompt_tokens(prompt)
    counts, parts = {}, []
    for seed in range(n):
        inputs, settings = split_inputs(overrides)
        r = collect(session.generate(tokens, inputs, seed=seed, **settings))
        counts[tuple(r.tokens)] = counts.get(tuple(r.tokens), 0) + 1
        parts.append(r.stats)
    return counts, Stats.combine(parts)


def same_distribution(a_counts: dict, b_counts: dict) -> tuple[bool, float, int]:
    """Two-sample chi-square for equal sample sizes, sum (a-b)^2 / (a+b) with df = cells - 1, at the
    1e-4 level (Wilson-Hilferty critical value): (passes, statistic, cells)."""
    cells = sorted(set(a_counts) | set(b_counts))
    a = np.array([a_counts.get(x, 0) for x in cells], float)
    b = np.array([b_counts.get(x, 0) for x in cells], float)
    stat = float(((a - b) ** 2 / (a + b)).sum())
    df = len(cells) - 1
    critical = df * (1 - 2 / (9 * df) + 3.719 * np.sqrt(2 / (9 * df))) ** 3 if df else 0.0
    return stat < critical, stat, len(cells)


def accept_every_draft(monkeypatch) -> None:
    """A sampling test's negative control: every draft token accepted and the bonus drawn from p, so that the output
    follows the draft's distribution, which the chi-square then tells apart from the target's."""

    def accept_all(p, q, tokens, rng):
        return len(tokens), int(rng.choice(len(p[-1]), p=p[-1]))

    monkeypatch.setattr(shapes, "speculative_accept", accept_all)


def config(models, draft: str | None = "draft", **kw) -> RunConfig:
    base = dict(
        target=models["target"],
        draft=models[draft] if draft else None,
        drafter="model" if draft else "none",
        threads=2,
        ctx_size=512,
        debug=True,
    )
    return RunConfig(**(base | kw))


@pytest.fixture
def open_pair(models):
    """open_pair(draft="draft", **RunConfig fields) -> an open Session, closed after the test."""
    opened = []

    def _open(draft: str | None = "draft", **kw):
        cm = open_session(config(models, draft, **kw))
        opened.append(cm)
        return cm.__enter__()

    yield _open
    for cm in reversed(opened):
        cm.__exit__(None, None, None)


class FrozenCosts(costmodel.Costs):
    """A synthetic curve that the fixtures' real timings must not overwrite: the decision depends on it alone."""

    def observe_verify(self, n: int, seconds: float) -> None:
        pass

    def observe_draft(self, seconds_per_token: float) -> None:
        pass

    def copy(self, n_max: int | None = None) -> FrozenCosts:
        return self  # frozen: a session's copy for auto to refine stays this curve


def cheap_verification() -> FrozenCosts:
    """Memory-bound hardware: verifying 16 tokens costs 1.1 single decodes, a draft token 1/60 of one.
    Drafting pays there, so auto drafts, whatever this machine's own timings say."""
    return FrozenCosts({1: 0.03, 16: 0.033, 32: 0.04}, 0.0005, 32)


@pytest.fixture
def frozen_costs(monkeypatch):
    """Sessions opened in the test get `cheap_verification()` instead of this machine's measured costs,
    so that what auto decides is the same on every machine."""
    monkeypatch.setattr(measurement, "measure", lambda *args, **kw: cheap_verification())
