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
PAYS = 1.03  # a configuration "pays" from 3% faster than target-only (below that it is noise)

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
    overall = [r for r in rows if r["category"] == "all" and not drafting.is_plain(r["drafter"])]
    if not overall:
        return "Only the baseline ran: add --drafters model (with a draft) to see what speculation does here."
    best = max(overall, key=lambda r: r["speedup"])
    chooses = best["drafter"] in drafting.DRAFTERS and drafting.kind(best["drafter"]).chooses_k
    how = f"--drafter {best['drafter']}" + (f" -k {best['draft_tokens']}" if not chooses else "")
    how += f" --branches {best['branches']}" if best.get("branches", 1) > 1 else ""
    how += " --exact" if best.get("exact") else ""
    how += f" --temp {best['temp']:g}" if best["temp"] else ""
    if best["speedup"] >= PAYS:
        return (
            f"Use {how}: {best['speedup']:.2f}x target-only's speed on this machine by wall time, prefill included "
            f"({best['generation_speedup']:.2f}x by generation alone; accept rate {best['accept_rate']:.0%}, "
            f"{best['mean_accepted']:.2f} tokens per verification)."
        )
    k = best["draft_tokens"] if isinstance(best["draft_tokens"], int) else 3
    verify = f"verifying {k + 1} tokens costs {costs.relative(k + 1):.2f}x one"
    top = max(costs.measured)  # the largest batch timed
    if costs.draft is not None:
        ceiling = max(predicted_speedup(costs, 1.0, j) for j in range(1, top))
        why = f"A draft token costs c = {costs.draft_ratio:.2f} of a target token and {verify}, so even a draft accepted every time"
    else:  # lookup: drafting is free, only verification costs
        ceiling = max((j + 1) / costs.relative(j + 1) for j in range(1, top))
        why = f"Lookup drafts for free, but {verify}, so even a lookup right every time"
    return (
        f"Speculation does not pay here: the best configuration ({how}) runs at {best['speedup']:.2f}x. "
        f"{why} would reach at most {ceiling:.2f}x; these prompts were too far from that. Use --drafter none "
        "on this machine for them."
    )


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


def to_svg(rows: list[dict]) -> str:
    """Speed-up against draft length, one line per drafter and temperature, the target-only level and
    the auto rows (which choose their own lengths) as dashed levels."""
    series: dict[str, list[tuple[int, float]]] = {}
    levels: list[tuple[str, float]] = []
    for r in rows:
        if r["category"] == "all" and not drafting.is_plain(r["drafter"]):
            name = (
                f"{r['drafter']}" + (f" b={r['branches']}" if r.get("branches", 1) > 1 else "") + f" temp {r['temp']:g}"
            )
            chooses = r["drafter"] in drafting.DRAFTERS and drafting.kind(r["drafter"]).chooses_k
            if isinstance(r["draft_tokens"], int):
                series.setdefault(name, []).append((r["draft_tokens"], r["speedup"]))
            else:
                levels.append((f"{name}" + (" k=auto" if not chooses else ""), r["speedup"]))
    w, h, m = 560, 340, 50
    ks = sorted({k for pts in series.values() for k, _ in pts}) or [1]
    top = max([1.2] + [s for pts in series.values() for _, s in pts] + [s for _, s in levels]) * 1.1
    x = lambda k: m + (w - 2 * m) * (ks.index(k) / max(len(ks) - 1, 1))  # noqa: E731
    y = lambda s: h - m - (h - 2 * m) * s / top  # noqa: E731
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">speed-up over target-only vs draft length</text>',
        f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
        f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
        f'<line x1="{m}" y1="{y(1):.1f}" x2="{w - m}" y2="{y(1):.1f}" stroke="gray" stroke-dasharray="4"/>',
        f'<text x="{w - m + 4}" y="{y(1) + 4:.1f}" fill="gray">1.0x</text>',
        f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">draft tokens k</text>',
    ]
    for k in ks:
        parts.append(f'<text x="{x(k):.1f}" y="{h - m + 16}" text-anchor="middle">{k}</text>')
    for i in range(5):
        s = top * i / 4
        parts.append(f'<text x="{m - 6}" y="{y(s) + 4:.1f}" text-anchor="end">{s:.2f}</text>')
    for j, (name, pts) in enumerate(sorted(series.items())):
        colour = colours[j % len(colours)]
        pts = sorted(pts)
        path = " ".join(f"{x(k):.1f},{y(s):.1f}" for k, s in pts)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts += [f'<circle cx="{x(k):.1f}" cy="{y(s):.1f}" r="3" fill="{colour}"/>' for k, s in pts]
        parts.append(f'<text x="{m + 10}" y="{m + 16 * j}" fill="{colour}">{name}</text>')
    for j, (name, s) in enumerate(levels, start=len(series)):
        colour = colours[j % len(colours)]
        parts.append(
            f'<line x1="{m}" y1="{y(s):.1f}" x2="{w - m}" y2="{y(s):.1f}" stroke="{colour}" stroke-dasharray="8 3"/>'
        )
        parts.append(f'<text x="{m + 10}" y="{m + 16 * j}" fill="{colour}">{name} (dashed)</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
