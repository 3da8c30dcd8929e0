"""Tree drafting (--branches): the multi-draft acceptance rule, forked caches, and the engine end to end."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FrozenCosts, config, run_engine, same_distribution, sample_counts
from specdec_cli.engine.acceptance import greedy_tree_accept, multi_draft_accept, speculative_accept
from specdec_cli.drafting.auto import AutoDrafter
from specdec_cli.drafting.cost import Costs
from specdec_cli.drafting.model import ModelDrafter
from specdec_cli.engine.events import Round
from specdec_cli.engine.kv import Branches, KVInvariantError, Sequence
from specdec_cli.engine.stats import collect
from specdec_cli.session import open_session

PROMPTS = ["hello world", "The quick brown fox", "abcabcabc", "zq"]


# --- the acceptance rules, pure numpy -----------------------------------------------------------------
def test_greedy_tree_accept_follows_the_branch_that_carries_the_targets_choice():
    # root -> 5 (node 0) -> 6 (node 2);  root -> 7 (node 1) -> 8 (node 3) -> 9 (node 4)
    tokens, parents = [5, 7, 6, 8, 9], [-1, -1, 0, 1, 3]
    argmax = [7, 0, 8, 0, 9, 4]  # row 0 after the root, row i+1 after node i
    assert greedy_tree_accept(argmax, tokens, parents) == ([1, 3, 4], 4)  # the whole branch, then the bonus
    argmax[4] = 3  # after node 3 the target wants 3, not 9
    assert greedy_tree_accept(argmax, tokens, parents) == ([1, 3], 3)
    assert greedy_tree_accept([2, 0, 0, 0, 0, 0], tokens, parents) == ([], 2)  # no child at the root


def test_multi_draft_rule_on_a_chain_is_the_single_draft_rule():
    rng = np.random.default_rng(0)
    for trial in range(200):
        k, v = int(rng.integers(1, 5)), 6
        p = rng.dirichlet(np.ones(v), size=k + 1)
        q = rng.dirichlet(np.ones(v), size=k) if trial % 2 else None
        draft = [int(x) for x in rng.integers(0, v, size=k)]
        a = speculative_accept(p, q, draft, np.random.default_rng(trial))
        path, token = multi_draft_accept(p, q, draft, list(range(-1, k - 1)), np.random.default_rng(trial))
        assert (len(path), token) == a and path == list(range(len(path)))


def _tree_rounds(rule, point_mass: bool, n: int, seed: int) -> float:
    """Total variation between the first two output tokens of n rounds and the exact joint of p.
    Random two-level trees over 4 tokens: two or three root siblings, each with one child. Sampled
    siblings are drawn without replacement (each from q minus the earlier ones); point masses are
    fixed tokens, as a greedy draft forks at temperature > 0."""
    v = 4
    rng = np.random.default_rng(seed)
    p_root = rng.dirichlet(np.ones(v))
    p_next = {t: rng.dirichlet(np.ones(v)) for t in range(v)}
    q_root = rng.dirichlet(np.ones(v) * 0.7)
    q_next = {t: rng.dirichlet(np.ones(v) * 0.7) for t in range(v)}
    counts: dict[tuple[int, int], int] = {}
    for _ in range(n):
        tokens, parents, qs = [], [], []
        rest = q_root.copy()
        for j in range(2 + int(rng.random() < 0.3)):
            q = rest / rest.sum()
            d = j if point_mass else int(rng.choice(v, p=q))
            tokens.append(d)
            parents.append(-1)
            qs.append(q)
            rest = rest.copy()
            rest[d] = 0.0
        for i in range(len(tokens)):
            q = q_next[tokens[i]]
            tokens.append((tokens[i] + 1) % v if point_mass else int(rng.choice(v, p=q)))
            parents.append(i)
            qs.append(q)
        rows = np.array([p_root] + [p_next[t] for t in tokens])  # row i+1 follows node i
        path, token = rule(rows, None if point_mass else np.array(qs), tokens, parents, rng)
        out = [tokens[i] for i in path] + [token]
        if len(out) == 1:  # nothing accepted: the next round samples the second token from the target
            out.append(int(rng.choice(v, p=p_next[out[0]])))
        counts[out[0], out[1]] = counts.get((out[0], out[1]), 0) + 1
    exact = {(a, b): p_root[a] * p_next[a][b] for a in range(v) for b in range(v)}
    return 0.5 * sum(abs(counts.get(key, 0) / n - prob) for key, prob in exact.items())


def _without_residual(p, q, tokens, parents, rng):
    """A plausible but wrong rule: each sibling tested against p itself, never against the residual."""
    node = -1
    path = []
    while True:
        for c in (i for i, parent in enumerate(parents) if parent == node):
            q_c = q[c][tokens[c]] if q is not None else 1.0
            if rng.random() * q_c < p[node + 1][tokens[c]]:
                path.append(c)
                node = c
                break
        else:
            return path, int(rng.choice(len(p[0]), p=p[node + 1]))


@pytest.mark.parametrize("point_mass", [False, True])
def test_multi_draft_rule_yields_exactly_the_target_distribution(point_mass):
    # 16 cells at n = 40k: sampling noise in total variation is ~0.01; the wrong rule is several times that.
    assert _tree_rounds(multi_draft_accept, point_mass, 40_000, 1) < 0.015
    assert _tree_rounds(_without_residual, point_mass, 40_000, 1) > 0.04


# --- forked caches ---------------------------------------------------------------------------------------
def test_tree_decode_gives_each_branch_the_rows_it_would_get_alone(open_pair):
    s = open_pair(None)
    prompt = s.prompt_tokens("fork me")
    tree = Branches(Sequence.empty(s.target_ctx))
    tree.main.append(prompt[:-1])
    tree.fork(0)
    tree.fork(0)
    # last, then a shared node, then three branches: [50, 60], [50, 61, 70], [51]
    tokens = [prompt[-1], 50, 60, 61, 70, 51]
    rows = tree.decode(tokens, [(0, 1, 2), (0, 1), (0,), (1,), (1,), (2,)]).copy()
    for branch, nodes in ((0, [0, 1, 2]), (1, [0, 1, 3, 4]), (2, [0, 5])):
        alone = Sequence.empty(s.target_ctx)  # clears every sequence: the cache now holds only this chain
        alone.append(prompt[:-1])
        ref = alone.append([tokens[i] for i in nodes], outputs="all")
        np.testing.assert_allclose(rows[nodes], ref, rtol=1e-4, atol=1e-4, err_msg=f"branch {branch}")
        tree = Branches(alone)
    del tree


def test_settle_keeps_the_winner_and_drops_every_other_branch(open_pair):
    s = open_pair(None)
    prompt = s.prompt_tokens("fork me")
    tree = Branches(Sequence.empty(s.target_ctx))
    tree.main.append(prompt)
    tree.fork(0)
    tree.fork(0)
    tree.decode([10, 20, 21, 30], [(0,), (1,), (1,), (2,)])
    with pytest.raises(KVInvariantError):
        tree.check(prompt)  # forks are still open
    tree.settle(1, len(prompt) + 1)
    tree.check(prompt + [20])  # branch 1's first token is now the main sequence's
    assert len(tree) == 1 and tree.main.seq_id == 0
    tree.fork(0)
    tree.decode([5], [(0,)])  # branch 0 grows, branch 1 does not
    with pytest.raises(ValueError):
        tree.decode([6], [(0, 1)])  # a shared token cannot follow branches of different lengths
    tree.settle(0, len(prompt) + 1)
    tree.check(prompt + [20])


# --- the engine end to end on the tiny F32 fixtures ------------------------------------------------------
@pytest.fixture(scope="module")
def target_only(models):
    with open_session(config(models, None, max_tokens=40)) as s:
        return {p: run_engine(s, p)[0] for p in PROMPTS}


@pytest.mark.parametrize("branches, k", [(2, 1), (2, 4), (3, 3), (4, 6), (8, 8)])
def test_greedy_with_branches_matches_target_only(open_pair, target_only, branches, k):
    s = open_pair("draft", drafter="model", branches=branches, p_split=0.02, max_tokens=40)
    trees = 0
    for prompt in PROMPTS:
        ids, stats, _ = run_engine(s, prompt, draft_tokens=k)  # debug: caches checked after every round
        assert ids == target_only[prompt], (prompt, branches, k)
        trees += stats.tree_rounds
        assert stats.branches / stats.rounds <= branches
    assert trees > 0  # the draft did fork


def test_random_tree_rounds_keep_both_caches_consistent(open_pair):
    """Random branch counts, depths, split thresholds, budgets and temperatures with the debug invariant
    after every round; then a consumer walks away mid-stream: both caches hold one sequence, a prefix."""
    rng = np.random.default_rng(0)
    opened = {}
    for trial in range(16):
        branches = int(rng.integers(2, 6))
        p_split = float(rng.choice([0.005, 0.02, 0.1]))
        key = (branches, p_split)
        s = opened.get(key) or opened.setdefault(
            key, open_pair("draft", drafter="model", branches=branches, p_split=p_split)
        )
        prompt = s.prompt_tokens("".join(chr(c) for c in rng.integers(32, 127, size=int(rng.integers(1, 20)))))
        kw = dict(
            draft_tokens=int(rng.integers(1, 10)), max_tokens=int(rng.integers(1, 50)),
            temp=float(rng.choice([0.0, 0.8])), seed=trial,
        )  # fmt: skip
        events = list(s.generate(prompt, **kw))
        stream = s.generate(prompt, **kw)
        stop_after = int(rng.integers(0, len(events)))
        for i, _ in enumerate(stream):
            if i == stop_after:
                break
        stream.close()
        for ctx in (s.target_ctx, s.draft_ctx):
            assert all(ctx.seq_pos_range(b) == (-1, -1) for b in range(1, ctx.n_seq)), trial
            assert ctx.seq_pos_range(0)[0] in (0, -1), trial


def test_rounds_report_branches_winner_and_verified_tokens(open_pair):
    s = open_pair("draft", drafter="model", branches=3, p_split=0.02, max_tokens=40)
    tokens = s.prompt_tokens(PROMPTS[0])
    rounds = [e for e in s.generate(tokens, draft_tokens=4) if isinstance(e, Round)]
    trees = [r for r in rounds if r.branches > 1]
    assert trees and all(r.branches <= 3 and 0 <= r.winner < r.branches for r in rounds)
    assert all(r.drafted <= 4 * r.branches and r.accepted <= min(4, r.drafted) for r in trees)
    d = collect(rounds).stats.as_dict()
    assert d["tree_rounds"] == len(trees) and sum(d["branch_wins"]) == len(trees)
    assert 0 < len(d["per_position_accept"]) <= 4  # positions are depths, not node indices
    assert d["mean_branches"] == pytest.approx(sum(r.branches for r in rounds) / len(rounds), abs=1e-4)


def test_sampling_with_branches_matches_target_only_distribution(open_pair):
    """End to end at temperature > 0 with the multi-draft rule: the first two tokens' joint distribution,
    tree drafting vs target-only sampling, two-sample chi-square at the 1e-4 level."""
    kw = dict(max_tokens=2, temp=1.5, top_k=3)
    spec = open_pair("draft", drafter="model", branches=3, p_split=0.05, **kw)
    plain = open_pair(None, **kw)
    spec_counts, stats = sample_counts(spec, "hello world", 1500, draft_tokens=2)
    plain_counts, _ = sample_counts(plain, "hello world", 1500, draft_tokens=2)
    assert stats.tree_rounds > 500  # most rounds were trees
    ok, stat, cells = same_distribution(spec_counts, plain_counts)
    assert ok, (stat, cells)
    assert cells > 3


# --- auto: branching only where the cost model says it pays ----------------------------------------------
def _auto(s, costs: Costs, branches: int) -> AutoDrafter:
    return AutoDrafter(costs, None, ModelDrafter(Sequence.empty(s.draft_ctx), 0.0, branches, 0.02))


@pytest.mark.parametrize("flat, forks", [(True, True), (False, False)])
def test_auto_forks_only_when_verification_is_cheap(open_pair, flat, forks):
    from specdec_cli.engine.speculative import Settings, generate

    s = open_pair("draft", drafter="model", max_tokens=30)
    n = 32
    curve = {1: 0.03, 16: 0.033, n: 0.04} if flat else {1: 0.03, n: 0.03 * n}
    costs = FrozenCosts(curve, 0.0005 if flat else 0.016, n)  # a cheap draft where verification is nearly free
    prompt = s.prompt_tokens(PROMPTS[1])
    events = generate(Sequence.empty(s.target_ctx), _auto(s, costs, 3), prompt, Settings(8, 30, debug=True))
    stats = collect(events).stats
    assert (stats.tree_rounds > 0) == forks


# --- errors ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(draft=None, drafter="none", branches=2), "--branches 2 needs a draft model"),
        (dict(draft=None, drafter="lookup", branches=3), "--branches 3 needs a draft model"),
        (dict(branches=0), "--branches must be in 1..8"),
        (dict(branches=9), "--branches must be in 1..8"),
        (dict(p_split=0.0), "--p-split must be in (0, 1]"),
        (dict(p_split=1.5), "--p-split must be in (0, 1]"),
    ],
)
def test_bad_tree_settings_are_clean_errors(models, kw, message):
    from specdec_cli.errors import UsageError

    with pytest.raises(UsageError) as e:
        draft = kw.pop("draft", "draft")
        config(models, draft, **kw)
    assert message in e.value.message


def test_combinations_of_branch_counts_are_planned_for_model_and_auto():
    from specdec_cli.bench.runner import plan
    from specdec_cli.ui import label

    configs = plan(["none", "model", "lookup", "auto"], [3], [0.0], [1, 2, 3])
    labels = [label(c.drafter, c.draft_tokens, c.branches) for c in configs]
    assert labels == ["none", *(f"model k=3{'' if b == 1 else f' b={b}'}" for b in (1, 2, 3)), "lookup k=3",
                      "auto", "auto b=2", "auto b=3"]  # fmt: skip
    assert [c.branches for c in configs] == [1, 1, 2, 3, 1, 1, 2, 3]


def test_trees_run_into_the_end_of_the_context_cleanly(open_pair):
    # Near the end of the context a tree is cut to the cells left; the run must end with "context" (or the
    # text's own end), never a llama.cpp error. The debug invariant runs after every round.
    s = open_pair("draft", drafter="model", branches=8, p_split=0.005, ctx_size=64, max_tokens=1000)
    _, stats, _ = run_engine(s, "hi", draft_tokens=8)
    assert stats.stop_reason in ("context", "eos") and stats.tree_rounds > 0
