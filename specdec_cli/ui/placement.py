"""Where a model's layers and buffers went (devices.placement's record), in words."""

from __future__ import annotations


def where(placement: dict | None) -> str | None:
    """'29/29 layers on CUDA0', '17/29 layers on CUDA0 (12 on the CPU)', '29/29 layers on CUDA0 15 + CUDA1 14';
    None when every layer is on the CPU (nothing worth saying)."""
    if not placement or not placement["offloaded"]:
        return None
    on = [(name, d["layers"]) for name, d in placement["devices"].items() if name != "CPU" and d["layers"]]
    devices = on[0][0] if len(on) == 1 else " + ".join(f"{name} {n}" for name, n in on)
    rest = placement["layers"] - placement["offloaded"]
    return f"{placement['offloaded']}/{placement['layers']} layers on {devices}" + (
        f" ({rest} on the CPU)" if rest else ""
    )


def rows(placement: dict) -> list[tuple[str, str]]:
    """One row per device: its layers and the buffers llama.cpp gave it there."""
    out = []
    for name, d in placement["devices"].items():
        sizes = [(k, d[f"{k}_bytes"]) for k in ("model", "kv", "compute") if d[f"{k}_bytes"]]
        said = ", ".join(f"{k.replace('kv', 'KV')} {_mib(b)}" for k, b in sizes) or "no buffers"
        out.append((f"  {name}", f"{d['layers']}/{placement['layers']} layers; {said}"))
    return out


def _mib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.2f} MiB"
