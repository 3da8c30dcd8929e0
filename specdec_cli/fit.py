"""How large a run's contexts are, and whether their caches fit in the memory this machine has."""

from __future__ import annotations

from .backend.native import Model
from .errors import UsageError
from .options import CTX_SIZE, MIN_CTX


def available_memory() -> int | None:
    """Bytes of memory the system can give without swapping (Linux's MemAvailable); None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def context_sizes(requested: int | None, target: Model, draft: Model | None) -> tuple[int, int | None]:
    """(target's, draft's) context in tokens. -c as given, which no model may be trained for less than: a
    bigger one only allocates memory that the model cannot use. Unset: the smaller of CTX_SIZE and what the
    target was trained for, and for the draft the smaller of that and its own (its window slides within it; a
    draft whose cache cannot slide stops drafting when the text outgrows it: drafting/model.py)."""
    if requested is not None:
        for role, m in (("target", target), ("draft", draft)):
            if m is not None and requested > m.n_ctx_train > 0:
                raise UsageError(
                    f"a context of {requested:,} tokens is more than {role} {m.name} was trained for ({m.n_ctx_train:,})",
                    hint=f"use -c/--ctx-size {m.n_ctx_train} or less, or leave -c out (it then fits the models)",
                )
        return requested, requested if draft is not None else None

    def fit(limit: int, m: Model) -> int:
        return max(min(limit, m.n_ctx_train), MIN_CTX) if m.n_ctx_train > 0 else limit

    n = fit(CTX_SIZE, target)
    return n, fit(n, draft) if draft is not None else None


def check_memory(need: list[tuple[int, int]]) -> None:
    """KV caches and recurrent states that fit in memory: each (KV bytes, recurrent-state bytes) of a context."""
    kv, states = sum(k for k, _ in need), sum(r for _, r in need)
    free = available_memory()
    if free is not None and kv + states > free:
        parts = f"{_size(kv)} of KV cache" + (
            f" and {_size(states)} of recurrent state and its snapshots" if states else ""
        )
        raise UsageError(
            f"the contexts need {parts}, but only {_size(free)} of memory is available",
            hint="use a smaller -c/--ctx-size" + (" or -k (a snapshot per draft token)" if states else ""),
        )


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
