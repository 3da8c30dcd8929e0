"""batch's views: progress while it runs (a bar at a terminal, a line per request otherwise), the summary."""

from __future__ import annotations

import sys
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..drafting import round_label
from . import _err, panel, prediction_row


class BatchView:
    """Requests done of the total, tokens/s, the speed-up over plain decoding as auto measures it, the ETA;
    at a terminal a live bar, otherwise one plain line per request (a log stays readable)."""

    def __init__(self, total: int):
        self.total, self.count = total, 0
        self.live = _err.is_terminal
        self._t0 = time.monotonic()
        self._progress = Progress(
            TextColumn("batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[speed]}"),
            TimeRemainingColumn(),
            console=_err,
            transient=False,
        )
        self._task = self._progress.add_task("batch", total=total, speed="")

    def __enter__(self) -> BatchView:
        if self.live:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self._progress.stop()

    def add(self, line, status: int, body: dict, tally, plain_seconds: float | None) -> None:
        """A request finished (its Line, status code and response body); `tally`: the batch so far."""
        self.count += 1
        elapsed = time.monotonic() - self._t0
        speed = _speed(tally, elapsed, plain_seconds)
        if self.live:
            self._progress.update(self._task, advance=1, speed=speed)
            return
        eta = elapsed / self.count * (self.total - self.count)
        what = f"{body['usage']['completion_tokens']} tokens" if status == 200 else f"error {status}"
        print(f"[{self.count}/{self.total}] {line.custom_id}: {what}; {speed}; eta {_clock(eta)}", file=sys.stderr)


def _speed(tally, elapsed: float, plain_seconds: float | None) -> str:
    out = f"{tally.tokens / elapsed if elapsed else 0.0:.1f} tok/s"
    speedup = tally.speedup(plain_seconds)
    return out + (f", {speedup:.2f}x plain decoding" if speedup is not None else "")


def batch_summary(tally, speedup: float | None, output: str, title: str) -> None:
    """The end: requests (done now, earlier, failed), tokens, wall time, speed, drafters, errors."""
    failed = len(tally.failed) + tally.earlier_failed
    ran = f"{tally.done} answered now" + (f", {tally.earlier} earlier" if tally.earlier else "")
    rows = [("requests", f"{tally.total} ({ran}; {failed} failed)" + (", interrupted" if tally.interrupted else ""))]
    if tally.done:
        rows += [
            ("tokens", f"{tally.tokens:,} generated, {tally.prompt_tokens:,} prompt"),
            (
                "wall",
                f"{tally.wall:.1f} s ({60 * tally.done / tally.wall:.1f} requests a minute)" if tally.wall else "-",
            ),
            (
                "speed",
                f"{tally.tokens / tally.wall:.1f} tokens/s overall, "
                f"{tally.tokens / tally.generation_seconds if tally.generation_seconds else 0:.1f} generating"
                + (f" ({speedup:.2f}x plain decoding, auto's measure)" if speedup is not None else ""),
            ),
        ]
    rounds = sum(tally.rounds.values())
    if rounds:
        shares = ", ".join(
            f"{round_label(name)} {n / rounds:.0%}" for name, n in sorted(tally.rounds.items(), key=lambda kv: -kv[1])
        )
        rows.append(
            ("drafters", f"{shares} of {rounds:,} rounds; accepted {tally.accepted:,} of {tally.drafted:,} drafted")
        )
    if tally.predicted:
        rows.append(prediction_row(tally.prediction_accepted, tally.prediction_rejected))
    for line, error in tally.failed[:5]:
        rows.append((f"  line {line.number}", f"{line.custom_id}: {error.status} {error.message}"))
    if len(tally.failed) > 5:
        rows.append(("  ...", f"{len(tally.failed) - 5} more"))
    rows.append(("results", output))
    panel(rows, title, _err.is_terminal)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
