"""Benchmark results as data: rows per configuration and category, the recommendation, and the files
(JSON, CSV, SVG) as text; the command rewrites them atomically after every finished row (outputs.py)."""

from __future__ import annotations

import csv
import io
import json
import os
import platform
from pathlib import Path

from .. import drafting
from ..backend.cpu import features as cpu_features
from ..drafting.cost import Costs, predicted_speedup
from ..engine.stats import Stats
from .runner import RowResult
from .suite import Prompt

MODEL_GAP = 0.10  # predicted and measured speed-ups should agree within ~10%; larger gaps are flagged
# With one run per prompt (--runs 1) nothing measures the noise: assume +-3%, what two runs of the same settings on
# this project's machine differ by (1.01x, then 1.04x). With more runs, their spread is the noise.
ASSUMED_NOISE = 0.03

COLUMNS = [
    "drafter",
    "draft_tokens",
    "branches",
    "temp",
    "category",
    "prompts",
    "generated_tokens",
    "tokens_per_second",
    "baseline_tokens_per_second",
    "wall_tokens_per_second",
    "baseline_wall_tokens_per_second",
    "speedup",
    "generation_speedup",
    "ttft_seconds",
    "baseline_ttft_seconds",
    "ttft_ratio",
    "accept_rate",
    "per_token_accept",
    "mean_accepted",
    "per_position_accept",
    "draft_share",
    "verify_share",
    "predicted_speedup",
    "model_gap",
    "identical_to_baseline",
    "predicted_tokens_per_round",
    "drafter_rounds",
    "drafter_accept_rate",
    "drafter_ms_per_token",
    "mean_branches",
    "branch_wins",
    "exact",
    "speedup_vs_fast",
    "speedup_low",  # (after the older columns: a reader that goes by position still finds them)
    "speedup_high",
    "noise",
]


def rows_for(result: RowResult, prompts: list[Prompt], costs: Costs) -> list[dict]:
    """One row for all prompts ("all") and one per category."""
    groups = {"all": list(range(len(prompts)))}
    for i, p in enumerate(prompts):
        groups.setdefault(p.category, []).append(i)
    cfg = result.config
    out = []
    for category, idx in groups.items():
        mine = Stats.combine([result.runs[i].stats for i in idx])
        base = Stats.combine([result.baseline[i].stats for i in idx])
        # By wall time (prefill and generation: what the user waits for), per token; generation alone beside it.
        speedup = _ratio(mine.wall_tokens_per_second, base.wall_tokens_per_second)
        generation = _ratio(mine.tokens_per_second, base.tokens_per_second)
        vs_fast = None
        if result.fast_baseline:  # an exact row beside the fast target-only (interleaved): exact mode's net effect
            fast = Stats.combine([result.fast_baseline[i].stats for i in idx]).wall_tokens_per_second
            vs_fast = round(_ratio(mine.wall_tokens_per_second, fast), 4)
        predicted = _predicted(costs, mine, cfg)
        both = mine.predicted_vs_realised()
        gen = mine.generation_seconds or 1.0
        identical = None
        if cfg.temp == 0:
            same = sum(result.runs[i].tokens == result.baseline[i].tokens for i in idx)
            identical = round(same / len(idx), 4)
        out.append(
            {
                "drafter": cfg.drafter,
                "draft_tokens": "auto" if cfg.draft_tokens is None else cfg.draft_tokens,
                "branches": cfg.branches,
                "temp": cfg.temp,
                "category": category,
                "prompts": len(idx),
                "generated_tokens": mine.generated_tokens,
                "tokens_per_second": round(mine.tokens_per_second, 3),
                "baseline_tokens_per_second": round(base.tokens_per_second, 3),
                "wall_tokens_per_second": round(mine.wall_tokens_per_second, 3),
                "baseline_wall_tokens_per_second": round(base.wall_tokens_per_second, 3),
                "speedup": round(speedup, 4),
                **_spread(result, idx, speedup),
                "generation_speedup": round(generation, 4),
                "ttft_seconds": round(mine.ttft_seconds / len(idx), 4),  # a prompt's, on average
                "baseline_ttft_seconds": round(base.ttft_seconds / len(idx), 4),
                "ttft_ratio": round(_ratio(mine.ttft_seconds, base.ttft_seconds), 4),
                "accept_rate": round(mine.accept_rate, 4),
                "per_token_accept": round(mine.per_token_accept, 4),
                "mean_accepted": round(mine.mean_accepted, 4),
                "per_position_accept": [round(x, 4) for x in mine.per_position_accept],
                "draft_share": round(mine.draft_seconds / gen, 4),
                "verify_share": round(mine.verify_seconds / gen, 4),
                "predicted_speedup": round(predicted, 4) if predicted is not None else None,
                # the prediction is of generation alone (the cost model's rounds): against generation_speedup
                "model_gap": bool(
                    predicted is not None and generation and abs(predicted - generation) / generation > MODEL_GAP
                ),
                "identical_to_baseline": identical,
                # auto: what the cost model expected per round, against mean_accepted (what came)
                "predicted_tokens_per_round": round(both[0], 4) if both else None,
                "drafter_rounds": {name: d.rounds for name, d in sorted(mine.by_drafter.items())},
                # per drafter that drafted (auto mixes them): its acceptance and its cost per drafted token
                "drafter_accept_rate": {n: d.as_dict()["accept_rate"] for n, d in _drafted(mine)},
                "drafter_ms_per_token": {n: d.as_dict()["draft_ms_per_token"] for n, d in _drafted(mine)},
                # tree drafting: mean branches verified per round, and rounds won by each branch
                "mean_branches": round(mine.branches / mine.rounds, 4) if mine.rounds else 0.0,
                "branch_wins": list(mine.branch_wins),
                "exact": cfg.exact,
                "speedup_vs_fast": vs_fast,
            }
        )
    return out


def cost_curve(costs: Costs) -> dict:
    """The measurement as the bench reports it (JSON `cost_curve`): t(n) as timed, relative to plain decoding."""
    r = lambda x: round(x, 6) if x is not None else None  # noqa: E731
    return {
        "target_seconds": {str(n): round(t, 6) for n, t in costs.measured.items()},
        "target_relative": {str(n): round(t / costs.plain, 3) for n, t in costs.measured.items()},
        "plain_seconds_per_token": r(costs.plain),
        "draft_seconds_per_token": r(costs.draft),
        "draft_catch_up_seconds": r(costs.draft_catch_up),
        "c": round(costs.draft_ratio, 4) if costs.draft_ratio is not None else None,
    }


def _spread(result: RowResult, idx: list[int], speedup: float) -> dict:
    """The speed-up's noise band: its lowest and highest over the repeats (repeat r of every prompt against the
    baseline's repeat r beside it), or +-ASSUMED_NOISE where one run per prompt measures none. The baseline
    against itself is 1.0 exactly."""
    runs = len(result.repeats[0]) if result.repeats else 1
    if result.config.is_baseline:
        return {"speedup_low": 1.0, "speedup_high": 1.0, "noise": "none"}
    if runs < 2:
        low, high, how = speedup / (1 + ASSUMED_NOISE), speedup * (1 + ASSUMED_NOISE), "assumed"
    else:
        ratios = []
        for r in range(runs):
            mine = Stats.combine([result.repeats[i][r].stats for i in idx]).wall_tokens_per_second
            theirs = Stats.combine([result.base_repeats[i][r].stats for i in idx]).wall_tokens_per_second
            ratios.append(_ratio(mine, theirs))
        low, high, how = min(ratios + [speedup]), max(ratios + [speedup]), f"{runs} repeats"
    return {"speedup_low": round(low, 4), "speedup_high": round(high, 4), "noise": how}


def beyond_noise(r: dict) -> int:
    """+1 where a row is faster than target alone beyond its noise band, -1 where slower, 0 within it."""
    return 1 if band_low(r) > 1.0 else (-1 if band_high(r) < 1.0 else 0)


def band_low(r: dict) -> float:  # (rows of older JSON files have no band: the assumed one)
    return r.get("speedup_low", r["speedup"] / (1 + ASSUMED_NOISE))


def band_high(r: dict) -> float:
    return r.get("speedup_high", r["speedup"] * (1 + ASSUMED_NOISE))


def _drafted(stats: Stats) -> list:
    return [(name, d) for name, d in sorted(stats.by_drafter.items()) if d.drafted]


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _predicted(costs: Costs, stats: Stats, cfg) -> float | None:
    """Leviathan's speed-up of generation with the measured costs, for a fixed draft length (a drafter that
    chooses its own predicts per round)."""
    kind = drafting.kind(cfg.drafter)
    if kind.plain:
        return 1.0
    if (
        cfg.draft_tokens is None
        or kind.chooses_k
        or cfg.branches > 1
        or kind.cost not in ("free", "model", "heads", "hidden")
    ):
        return None  # chosen per round; a tree's yield is not the chain's geometric series
    if kind.cost in ("free", "heads", "hidden"):
        mine = stats.by_drafter.get(cfg.drafter)
        costs = costs.copy()
        # A lookup draft costs no decode; a head's decode (or an EAGLE-3 step, a DFlash block's share) costs what
        # this row's took (the curve times a draft model's, not theirs)
        heads = mine.draft_seconds / mine.drafted if kind.cost != "free" and mine and mine.drafted else 0.0
        costs.draft, costs.draft_catch_up = heads, None
    elif costs.draft is None:
        return None
    # The geometric model needs the per-token acceptance, not accepted/drafted (which counts the
    # draft tokens after a rejection, never checked, as failures too).
    return predicted_speedup(costs, stats.per_token_accept, cfg.draft_tokens)


def recommendation(rows: list[dict], costs: Costs) -> str:
    """The fastest configuration where it beats target alone beyond its noise band, and the others within noise of
    it (their bands overlap: which is faster is not known); else why speculation does not pay here."""
    overall = [r for r in rows if r["category"] == "all" and not drafting.is_plain(r["drafter"])]
    if not overall:
        return "Only the baseline ran: add --drafters model (with a draft) to see what speculation does here."
    best = max(overall, key=lambda r: r["speedup"])
    setting = options_of(best)
    if beyond_noise(best) > 0:
        rivals = [r for r in overall if r is not best and band_high(r) >= band_low(best)]
        text = (
            f"Use {setting}: {best['speedup']:.2f}x target-only's speed on this machine by wall time, prefill included "
            f"({best['generation_speedup']:.2f}x by generation alone; accept rate {best['accept_rate']:.0%}, "
            f"{best['mean_accepted']:.2f} tokens per verification)."
        )
        if rivals:
            named = ", ".join(f"{options_of(r)} ({r['speedup']:.2f}x)" for r in rivals[:3])
            more = f" and {len(rivals) - 3} more" if len(rivals) > 3 else ""
            text += f" Within noise of it ({_band(best)}): {named}{more}; " + (
                "rerun with --runs 3 to tell them apart." if best.get("noise") == "assumed" else "any of them will do."
            )
        return text
    k = best["draft_tokens"] if isinstance(best["draft_tokens"], int) else 3
    verify = f"verifying {k + 1} tokens costs {costs.relative(k + 1):.2f}x one"
    top = max(costs.measured)  # the largest batch timed
    if costs.draft is not None:
        ceiling = max(predicted_speedup(costs, 1.0, j) for j in range(1, top))
        why = f"A draft token costs c = {costs.draft_ratio:.2f} of a target token and {verify}, so even a draft accepted every time"
    else:  # lookup: drafting is free, only verification costs
        ceiling = max((j + 1) / costs.relative(j + 1) for j in range(1, top))
        why = f"Lookup drafts for free, but {verify}, so even a lookup right every time"
    runs = "within noise of target-only" if beyond_noise(best) == 0 else "slower than target-only"
    return (
        f"Speculation does not pay here: the best configuration ({setting}) runs at {best['speedup']:.2f}x, "
        f"{runs} ({_band(best)}). {why} would reach at most {ceiling:.2f}x; these prompts were too far from that. "
        "Use --drafter none on this machine for them."
    )


def options_of(r: dict) -> str:
    """A row's settings as the options that give them."""
    chooses = r["drafter"] in drafting.DRAFTERS and drafting.kind(r["drafter"]).chooses_k
    how = f"--drafter {r['drafter']}" + (f" -k {r['draft_tokens']}" if not chooses else "")
    how += f" --branches {r['branches']}" if r.get("branches", 1) > 1 else ""
    how += " --exact" if r.get("exact") else ""
    return how + (f" --temp {r['temp']:g}" if r["temp"] else "")


def noise_words(rows: list[dict]) -> str:
    """How the rows' noise bands were had, in words (a caption's, a chart's)."""
    measured = {r.get("noise", "assumed") for r in rows} - {"none", "assumed"}
    return "lowest to highest over the repeats" if measured else f"+-{ASSUMED_NOISE:.0%} assumed (--runs 1)"


def _band(r: dict) -> str:
    """A row's noise band in words: '0.98-1.07x over 3 repeats', '+-3% assumed with --runs 1'."""
    if r.get("noise", "assumed") == "assumed":
        return f"+-{ASSUMED_NOISE:.0%} assumed with --runs 1"
    return f"{band_low(r):.2f}-{band_high(r):.2f}x over {r['noise']}"


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from importlib.metadata import version

    return {
        "cpu": cpu,
        # ggml's kernels on this CPU (AVX2, AVX-512, VNNI...): they shape the cost curve
        "cpu_features": cpu_features(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": version("llama-cpp-python"),
    }


def to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(
            {
                **r,
                "per_position_accept": " ".join(str(x) for x in r["per_position_accept"]),
                **{
                    key: " ".join(f"{k}:{v}" for k, v in r[key].items())
                    for key in ("drafter_rounds", "drafter_accept_rate", "drafter_ms_per_token")
                },
                "branch_wins": " ".join(str(x) for x in r["branch_wins"]),
            }
        )
    return buf.getvalue()
