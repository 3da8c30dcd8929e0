"""The sweep: every configuration over every prompt, each configuration's runs interleaved with the
baseline's on the same prompt, so that machine drift hits both alike and cancels in the speed-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .. import drafting
from ..drafting.corpus import Corpus
from ..engine.events import Notice
from ..engine.stats import Stats, collect
from ..run_inputs import Inputs
from ..session import Session
from .suite import Prompt


@dataclass(frozen=True)
class Config:
    drafter: str  # a drafter's name (drafting.DRAFTERS); the plain one is the baseline
    draft_tokens: int | None  # 0 for the baseline; None: auto, chosen every round
    temp: float
    branches: int = 1  # tree drafting: at most this many branches per round (drafters with trees)
    exact: bool = False  # exact mode (--exact): the target computes every row as it computes a token alone

    @property
    def is_baseline(self) -> bool:
        return drafting.is_plain(self.drafter)


@dataclass(frozen=True)
class Run:
    stats: Stats
    tokens: list[int]


@dataclass(frozen=True)
class RowResult:
    config: Config
    runs: list[Run]  # one per prompt: the median of R runs
    baseline: list[Run]  # the baseline's runs on the same prompts (same mode), interleaved with these
    fast_baseline: list[Run] | None = None  # exact rows, when fast mode runs too: its baseline, interleaved
    # Per prompt, every repeat (--runs) of this row and of the baseline beside it, in order: the noise
    repeats: list[list[Run]] | None = None
    base_repeats: list[list[Run]] | None = None


def plan(
    drafters: list[str],
    draft_tokens: list[int | None],
    temps: list[float],
    branches: list[int] | tuple[int, ...] = (1,),
    modes: list[bool] | tuple[bool, ...] = (False,),
) -> list[Config]:
    """The baseline first in each temperature and mode (exact or not), then every drafter at every draft
    length (None: auto); a drafter that chooses its own lengths once. Drafters with trees once per branch
    count."""
    configs = []
    for temp in temps:
        for exact in modes:
            configs.append(Config(drafting.plain(), 0, temp, exact=exact))
            for d in drafters:
                kind = drafting.kind(d)
                trees = branches if kind.trees else [1]
                if kind.chooses_k:
                    configs += [Config(d, None, temp, b, exact) for b in trees]
                elif not kind.plain:
                    configs += [Config(d, k, temp, b, exact) for k in draft_tokens for b in trees]
    return configs


def generations(configs: list[Config], prompts: list[Prompt], runs: int) -> int:
    """How many generations the sweep runs (for the progress bar), warm-ups included."""
    both = {c.exact for c in configs} == {False, True}
    per_prompt = sum(1 + (not c.is_baseline) + (both and c.exact) for c in configs) * runs
    return per_prompt * len(prompts) + len(configs)


def sweep(
    sessions: dict[bool, Session],
    prompts: list[Prompt],
    configs: list[Config],
    *,
    runs: int,
    seed: int,
    tick: Callable[[], None] = lambda: None,
    notice: Callable[[str], None] = lambda message: None,
) -> Iterator[RowResult]:
    """Yield each configuration's result as soon as it is finished; `notice` hears the engine's notices
    (a draft model that stopped drafting: its rows then decode plainly). `sessions` holds a session per
    mode the configurations use (exact or not): exact rows are compared with the exact baseline, and
    with the fast one too when it runs (exact mode's cost, side by side). A row's settings change the
    session's by RunConfig.override, as a request's do (the same rules)."""
    first = next(iter(sessions.values()))
    encoded = [first.prompt_tokens(p.text) for p in prompts]

    def generate(config: Config, i: int, corpus: Corpus | None = None) -> Run:
        k = {} if config.is_baseline else {"draft_tokens": config.draft_tokens}
        # (the prompt's schema or grammar, where it has one, constrains every row's answer alike)
        inputs = Inputs(instruction=prompts[i].text, corpus=corpus, grammar=prompts[i].gbnf)
        events = sessions[config.exact].generate(
            encoded[i],
            inputs,
            drafter=config.drafter,
            branches=config.branches,
            temp=config.temp,
            seed=seed + i,
            **k,
        )
        result = collect(events, lambda e: notice(e.message) if isinstance(e, Notice) else None)
        tick()
        return Run(result.stats, result.tokens)

    for config in configs:
        # The lookup cache as a script running these prompts in order would build it: prompt i drafts from
        # this configuration's answers to the prompts before it. Never the user's cache (a bench must not
        # depend on what ran before it), never a prompt's own earlier answer.
        cached = first.cfg.lookup_cache and drafting.kind(config.drafter).lookup and config.draft_tokens is None
        answers: list[np.ndarray] = []
        generate(config, 0, Corpus([]) if cached else None)  # warm-up: caches, page faults, CPU clocks
        base_config = Config(drafting.plain(), 0, config.temp, exact=config.exact)
        fast_config = Config(drafting.plain(), 0, config.temp) if config.exact and False in sessions else None
        mine, theirs, fast, mine_all, theirs_all = [], [], [], [], []
        for i in range(len(prompts)):
            tries, base_tries, fast_tries = [], [], []
            corpus = Corpus(answers) if cached else None
            for r in range(runs):
                # The order alternates (ABBA): drift on a shared machine, and whatever one run leaves the next
                # (caches, clocks), fall on both alike.
                first_mine = r % 2 == 0 or config.is_baseline
                if first_mine:
                    tries.append(generate(config, i, corpus))
                if not config.is_baseline:
                    base_tries.append(generate(base_config, i))
                if not first_mine:
                    tries.append(generate(config, i, corpus))
                if fast_config:
                    fast_tries.append(generate(fast_config, i))
            mine.append(_median(tries))
            if cached:
                answers.append(np.asarray(tries[0].tokens))
            theirs.append(_median(base_tries) if base_tries else mine[-1])
            fast += [_median(fast_tries)] if fast_tries else []
            mine_all.append(tries)
            theirs_all.append(base_tries or tries)
        yield RowResult(config, mine, theirs, fast or None, mine_all, theirs_all)


def _median(runs: list[Run]) -> Run:
    """The run of median wall time (prefill and generation: what the user waits for)."""
    ordered = sorted(runs, key=lambda r: r.stats.wall_seconds)
    return ordered[(len(ordered) - 1) // 2]
