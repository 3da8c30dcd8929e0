"""Everything the user sees. All Rich code lives here; the rest of specdec returns data.

Data (generated text, JSON) goes to stdout; the legend, statistics and errors go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from ..drafting import DRAFTERS, is_plain, round_label, source_order
from ..engine.events import Origin, Token
from ..engine.stats import Stats

# A correction is the target's own token, as normal as a plain one: plain text, like the target's. Only what the
# draft got right stands out, in calm colours (red read as errors: a third of an answer was red).
STYLES = {
    Origin.DRAFT: "green",
    Origin.CORRECTION: "",
    Origin.BONUS: "cyan",
    Origin.PLAIN: "",
}
LEGEND = [
    (Origin.DRAFT, "accepted draft"),
    (Origin.BONUS, "bonus (whole draft accepted)"),
    (Origin.PLAIN, "the target's own (its correction of a draft, or no draft)"),
]
# Plain rounds of a run that time the target alone well enough to compare with (a round is one token's decode).
PLAIN_ROUNDS = 8
POSITIONS_SHOWN = 8  # per position in the panel: the first 8 (auto may draft 15; the rest are rare and noisy)

_err = Console(stderr=True, highlight=False)


def live_terminal() -> bool:
    """Colour stream only for a person at a terminal; pipes and NO_COLOR get plain text."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def error(message: str, hint: str | None = None) -> None:
    # soft_wrap: one logical line each, however narrow the terminal (scripts grep for "error:")
    _err.print(Text(f"error: {message}", style="bold red"), soft_wrap=True)
    if hint:
        _err.print(Text(f"hint: {hint}", style="dim"), soft_wrap=True)


def warning(message: str) -> None:
    _err.print(Text(f"warning: {message}", style="yellow"), soft_wrap=True)


def note(message: str) -> None:
    _err.print(Text(message, style="dim"), soft_wrap=True)


def measuring(threads: int, folder: Path) -> AbstractContextManager[object]:
    """While auto measures this machine's costs (seconds, before the first token): a spinner on a terminal, one
    line otherwise (a log, a pipe), so that the wait reads as what it is and not as a hung prefill."""
    from .models import short

    what = f"measuring this machine's costs for auto: once per model and -t {threads}, kept a day"
    if _err.is_terminal:  # (one line at 80 columns: a spinner that wraps redraws badly; transient, the panel's
        return _err.status(Text(what, style="dim"))  # "cost curve" row stays)
    note(f"{what} ({short(str(folder))})")
    return nullcontext()


class TokenStream:
    """Writes tokens as they arrive: coloured by origin on a terminal, raw bytes-as-text otherwise."""

    def __init__(self, live: bool, drafter: str | None = None):
        """drafter: the run's (None: unknown); a run that never drafts (none) gets no legend: every token is plain."""
        self.live = live
        self.drafts = drafter is None or not is_plain(drafter)
        self._out = Console(highlight=False, soft_wrap=True) if live else None

    def start(self) -> None:
        if self.live and self.drafts:
            legend = Text("legend: ", style="dim")
            for origin, label in LEGEND:
                swatch = ("■ ", STYLES[origin]) if STYLES[origin] else ("plain: ", "")
                legend.append(*swatch).append(label + "  ", style="dim")
            _err.print(legend)

    def token(self, event: Token) -> None:
        self.text(event.text, STYLES[event.origin])

    def text(self, text: str, style: str = "") -> None:
        if not text:
            return
        if self._out is not None:
            self._out.print(Text(text, style=style), end="")
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    def end(self) -> None:
        if self._out is not None:
            self._out.print()
        else:
            sys.stdout.write("\n")
            sys.stdout.flush()


@dataclass(frozen=True)
class Asked:
    """What a run was asked for, beside what it did (the panel shows both), and what the cost model knows of the
    target alone here."""

    drafter: str  # as the session took it (none where the target cannot roll back)
    draft_tokens: int | None  # None: auto, chosen every round
    branches: int = 1
    exact: bool = False
    plain_seconds: float | None = None  # the cost curve's t(1), target alone's seconds per token (None: no curve)


def stat_rows(stats: Stats, asked: Asked | None = None) -> list[tuple[str, str]]:
    other = stats.generation_seconds - stats.draft_seconds - stats.verify_seconds
    return (
        _asked_rows(stats, asked)
        + [
            ("generated", f"{stats.generated_tokens} tokens (stop: {stats.stop_reason or 'interrupted'})"),
            (
                "wall",
                f"{stats.wall_seconds:.2f} s, {stats.wall_tokens_per_second:.2f} tokens/s; first token after "
                f"{stats.ttft_seconds:.2f} s",
            ),
            ("prefill", f"{stats.prompt_tokens} prompt tokens in {stats.prefill_seconds:.2f} s"),
            *_measured_rows(stats),
            ("generation", f"{stats.tokens_per_second:.2f} tokens/s over {stats.generation_seconds:.2f} s"),
            ("rounds", f"{stats.rounds} target verifications"),
            ("drafted / accepted", f"{stats.drafted} / {stats.accepted}  (accept rate {stats.accept_rate:.1%})"),
            ("mean accepted", f"{stats.mean_accepted:.2f} tokens per verification (plain decoding: 1.00)"),
            ("per position", _positions(stats)),
            (
                "time split",
                f"draft {stats.draft_seconds:.2f} s, verify {stats.verify_seconds:.2f} s, other {other:.2f} s",
            ),
        ]
        + _prediction_rows(stats)
        + _tree_rows(stats, asked.branches if asked else None)
        + _drafter_rows(stats)
    )


def _asked_rows(stats: Stats, asked: Asked | None) -> list[tuple[str, str]]:
    """The settings asked for (drafter, k), and this run against the target alone: by this run's own plain rounds
    where it had PLAIN_ROUNDS of them (the target alone as it ran, the loop's per-token work included), else
    predicted from the cost curve's t(1), this machine's measured decode (a run of the target alone is the
    comparison itself)."""
    if asked is None:
        return []
    kind = DRAFTERS.get(asked.drafter)
    k = "auto (chosen each round)" if asked.draft_tokens is None else str(asked.draft_tokens)
    text = f"--drafter {asked.drafter}" + ("" if kind and kind.plain else f", -k {k}")
    text += (f", --branches {asked.branches}" if asked.branches > 1 else "") + (", --exact" if asked.exact else "")
    rows = [("asked", text)]
    plain = stats.by_drafter.get("none")
    if plain is not None and plain.rounds >= PLAIN_ROUNDS:
        per_token, how = plain.seconds / plain.emitted, f"against this run's {plain.rounds} plain rounds"
    else:
        per_token, how = asked.plain_seconds, "predicted"
    if kind and not kind.plain and per_token and stats.generation_seconds:
        ratio = stats.tokens_per_second * per_token
        rows.append(("vs target alone", f"{ratio:.2f}x, {how} (target alone: {1000 * per_token:.1f} ms a token here)"))
    return rows


def _positions(stats: Stats) -> str:
    """Acceptance at draft positions 1, 2, ...: accepted / drafted there, so that a round auto drafted short is
    no rejection further on; the first POSITIONS_SHOWN."""
    rates = stats.per_position_drafted_accept
    shown = " ".join(f"{x:.0%}" for x in rates[:POSITIONS_SHOWN]) or "-"
    return shown + (f" … ({len(rates)} in all)" if len(rates) > POSITIONS_SHOWN else "")


def _measured_rows(stats: Stats) -> list[tuple[str, str]]:
    """A run that measured this machine first (auto's first here): that time, apart from the prompt's."""
    if not stats.measure_seconds:
        return []
    return [("cost curve", f"this machine measured in {stats.measure_seconds:.2f} s, before the prefill")]


def prediction_row(accepted: int, rejected: int) -> tuple[str, str]:
    """What came of a predicted answer's draft tokens (OpenAI's accepted and rejected prediction tokens)."""
    return ("prediction", f"{accepted:,} of its draft tokens accepted, {rejected:,} rejected")


def _prediction_rows(stats: Stats) -> list[tuple[str, str]]:
    """A run given a predicted answer (--prediction): what came of it, drafted from or not."""
    given = stats.prediction_tokens is not None
    return [prediction_row(stats.prediction_accepted, stats.prediction_rejected)] if given else []


def _tree_rows(stats: Stats, asked: int | None = None) -> list[tuple[str, str]]:
    """Tree drafting, when a round forked: branches per round, which branch won, verified vs accepted. Without
    --branches only auto forks, where lookup offers alternatives (its trees): the line says so."""
    if not stats.tree_rounds:
        return []
    wins = " ".join(f"{b}:{w}" for b, w in enumerate(stats.branch_wins))
    whose = " (auto's lookup trees)" if asked == 1 else ""
    return [
        (
            "branches",
            f"{stats.tree_rounds} rounds forked{whose}, {stats.branches / stats.rounds:.2f} branches per round, "
            f"won by branch {wins}; verified {stats.drafted}, accepted {stats.accepted}",
        )
    ]


def _drafter_rows(stats: Stats) -> list[tuple[str, str]]:
    """Per drafter, whenever one drafted: rounds, mean chosen k, yield, its cost per draft token, the draft
    model's entropy."""
    parts = stats.by_drafter
    if not any(d.drafted for d in parts.values()):
        return []
    rows = []
    for name in sorted(parts, key=source_order):
        d = parts[name]
        text = f"{d.rounds} rounds ({d.rounds / stats.rounds:.0%})"
        if not is_plain(name):
            text += f", mean k {d.chosen_k / d.rounds:.1f}, drafted {d.drafted}, accepted {d.accepted}"
        if d.drafted and d.draft_seconds:
            text += f", {1000 * d.draft_seconds / d.drafted:.2f} ms per draft token"
        if d.entropy_rounds:
            text += f", draft entropy {d.entropy / d.entropy_rounds:.2f} nats"
        if d.foreign_rounds:
            per = f"{d.draft_fed / d.accepted:.1f}" if d.accepted else "-"
            text += f"; another tokenizer's: {per} of its tokens fed per accepted"
        rows.append((f"  {round_label(name)}", text))
    both = stats.predicted_vs_realised()
    if both:
        rows.append(("predicted / realised", f"{both[0]:.2f} / {both[1]:.2f} tokens per round"))
    return [("drafters", "")] + rows if rows else []


def show_stats(stats: Stats, title: str, live: bool, asked: Asked | None = None) -> None:
    panel(stat_rows(stats, asked), title, live)


def print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


# --- models --------------------------------------------------------------------------------------
class byte_progress:
    """`with byte_progress("assembling x", total) as advance: advance(n)`: a progress bar with ETA on stderr."""

    def __init__(self, label: str, total: int):
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=_err,
            transient=False,
        )
        self._task = self._progress.add_task(label, total=total)

    def __enter__(self):
        self._progress.start()
        return lambda n: self._progress.advance(self._task, n)

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


def key_values(title: str, rows: list[tuple[str, str]]) -> None:
    """A two-column table on stdout (it is the command's data), plain when piped."""
    if live_terminal():
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for k, v in rows:
            table.add_row(k, v)
        Console(highlight=False).print(Panel(table, title=title, title_align="left", expand=False))
    else:
        width = max(len(k) for k, _ in rows)
        print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))


def label(
    drafter: str, draft_tokens: int | str | None, branches: int = 1, k_for_auto: bool = False, exact: bool = False
) -> str:
    """A configuration in words, as generate, serve and bench show it: 'model k=3 b=2', 'lookup k=auto',
    'auto', 'none', '... (exact)'. The auto drafter chooses its own k: named only where asked (`k_for_auto`)."""
    kind = DRAFTERS.get(drafter)
    k = "auto" if draft_tokens is None else draft_tokens
    shown = kind is None or (not kind.plain and (not kind.chooses_k or k_for_auto))
    out = drafter + (f" k={k}" if k and shown else "")
    return out + (f" b={branches}" if branches > 1 else "") + (" (exact)" if exact else "")


def panel(rows: list[tuple[str, str]], title: str, live: bool) -> None:
    """Name-value rows on stderr: a panel at a terminal, aligned plain lines otherwise (a log, a pipe)."""
    if live:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for name, value in rows:
            table.add_row(name, value)
        _err.print(Panel(table, title=title, title_align="left", expand=False))
    else:
        width = max(len(name) for name, _ in rows)
        print(f"-- {title}", file=sys.stderr)
        for name, value in rows:
            print(f"{name:<{width}}  {value}", file=sys.stderr)


from .batch import BatchView, batch_summary  # noqa: E402  (their own modules: they use the helpers above)
from .bench import BenchView, show_bench  # noqa: E402

__all__ = ["BatchView", "BenchView", "batch_summary", "show_bench"]
