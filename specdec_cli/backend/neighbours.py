"""How much of this machine's CPU other programs take while specdec times it (drafting/measure.py: doubt).

A decode's time alone cannot tell a slow machine from a busy one: llama.cpp's threads wait at every step for the one
the OS descheduled, so a run beside another program's threads measures anything from right to 60x slow, and a
moderately slow curve passes every check of its shape. The kernel counts who ran: /proc/stat's ticks of every CPU
(the hypervisor's steal included: another guest's work) less this process's own (/proc/self/stat, its threads
included) is what the others took, on the CPUs this process may use (a container's share of a bigger host).
Linux only; elsewhere nothing is known and nothing is said.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # per second, per CPU
MIN_SECONDS = 0.1  # a shorter window holds too few ticks to tell


@dataclass(frozen=True, slots=True)
class Sample:
    busy: int  # ticks this process's CPUs spent running anything: not idle, not waiting for I/O
    own: int  # ticks this process's threads ran
    at: float  # time.monotonic()


def sample() -> Sample | None:
    """The counts now, over the CPUs this process may run on (None: no /proc here, or one this does not read)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        # (the command's name comes in parentheses and may hold spaces: the fields after its last ')' are fixed)
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return Sample(_busy(lines, _cpus()), int(own[11]) + int(own[12]), time.monotonic())  # (fields 14 and 15)
    except (OSError, IndexError, ValueError):
        return None


def _busy(lines: list[str], mine: set[int] | None) -> int:
    busy = 0
    for line in lines:
        fields = line.split()
        if len(fields) < 9 or not fields[0].startswith("cpu") or not fields[0][3:].isdigit():
            continue  # (the first line sums every CPU; others count interrupts, processes, ...)
        if mine is None or int(fields[0][3:]) in mine:
            # user nice system idle iowait irq softirq steal [guest guest_nice: within user and nice already]
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
            busy += user + nice + system + irq + softirq + steal
    return busy


def others(before: Sample | None, after: Sample | None) -> float | None:
    """Cores' worth of CPU time that other programs took between two samples (1.0: one core, the whole time); None
    where it cannot be told (no /proc, or a window shorter than MIN_SECONDS)."""
    if before is None or after is None or after.at - before.at < MIN_SECONDS:
        return None
    taken = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, taken / TICKS / (after.at - before.at))


def since(before: Sample | None) -> float | None:
    """`others` from `before` to now, the window waited out to MIN_SECONDS where less has passed (a tiny model's
    quick measurement: ~10 ms, once a day; others that hold the cores take them all meanwhile)."""
    if before is None:
        return None
    time.sleep(max(0.0, before.at + MIN_SECONDS - time.monotonic()))
    return others(before, sample())


def cores() -> int:
    """The CPUs this process may run on, whose ticks `sample` counts (another program's on the others do not
    slow it)."""
    mine = _cpus()
    return len(mine) if mine is not None else os.cpu_count() or 1


def _cpus() -> set[int] | None:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not on Linux
        return None
