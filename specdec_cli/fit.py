"""How large a run's contexts are, where the models' layers go (-ngl, -dev, -sm, -ts, -mg), and whether the
weights and caches fit in the memory of this machine and its devices."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from .backend import devices, gguf_file, layer_fit, memory
from .backend.devices import Device, Offload
from .backend.native import Model
from .errors import UsageError
from .option_limits import CTX_SIZE, MIN_CTX

NO_GPU = "this llama.cpp sees no GPU (a build without a GPU backend?)"  # as llama.cpp warns, and goes on
HEADROOM = 1 << 30  # what -ngl auto leaves free on each device: llama.cpp's --fit keeps 1 GiB (-fitt) for drivers


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


def check_memory(need: list[tuple[int, int, Offload | None]]) -> None:
    """KV caches and recurrent states that fit in memory: each (KV bytes, recurrent-state bytes, its model's
    placement) of a context, of which the share of its layers left on the CPU (host_share) is this machine's."""
    kv = sum(round(k * host_share(placed)) for k, _, placed in need)
    states = sum(round(r * host_share(placed)) for _, r, placed in need)
    free = available_memory()
    if free is not None and kv + states > free:
        parts = f"{_size(kv)} of KV cache" + (
            f" and {_size(states)} of recurrent state and its snapshots" if states else ""
        )
        raise UsageError(
            f"the contexts need {parts}, but only {_size(free)} of memory is available",
            hint="use a smaller -c/--ctx-size" + (" or -k (a snapshot per draft token)" if states else ""),
        )


def check_pair(
    plan: Plan,
    target: tuple[Model, int, int],
    draft: tuple[Model, int, int] | None,
    heads_bytes: int = 0,
    parked: int = 0,
) -> int:
    """check_memory for a pair: each (model, context tokens, recurrent states it keeps) by the plan's placement, the
    target's MTP heads' cache (`heads_bytes`) and the cells idle slots park in this machine's memory (`parked`,
    wherever the layers are: engine/kv.py's Kept). Returns the draft's bytes (for its fit when it loads)."""

    def need(m: Model, n_ctx: int, states: int) -> tuple[int, int]:
        return n_ctx * m.kv_bytes_per_token(), m.state_bytes() * states

    check_memory(
        [(*need(*target), plan.target)]
        + ([(*need(*draft), plan.draft)] if draft else [])
        + ([(heads_bytes, 0, plan.target)] if heads_bytes else [])
        + ([(parked, 0, None)] if parked else [])
    )
    return sum(need(*draft)) if draft else 0


@dataclass(frozen=True)
class Want:
    """What the options ask of one model's placement."""

    role: str  # "target", "draft"
    flag: str  # the option that sets its layers: -ngl, -ngld
    layers: int | str  # a count, "all" or "auto"
    devices: tuple[Device, ...]  # where its offloaded layers may go
    explicit: bool = False  # the devices were named (-dev, -devd), or RPC servers are in use: never llama.cpp's default
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] | None = None
    main_gpu: int = 0


def wants(cfg: Any, remote: list[Device]) -> tuple[Want, Want]:
    """The target's and the draft's Want. The target: the RPC servers' devices (--rpc) and this machine's (-dev,
    else its GPUs); the draft: -devd, else -dev, else this machine's GPUs, never a server's. The draft takes -sm,
    -ts and -mg where its devices are the target's (llama.cpp's draft inherits them), and a single device whole."""
    named = cfg.device is not None
    mine = tuple(devices.named(cfg.device) if named else devices.local())
    cpu_only = cfg.exact and bool(mine)  # exact mode: the target's layers on the CPU (exact_on_cpu says why)
    if cpu_only and (named or cfg.gpu_layers not in ("auto", 0)):
        exact_on_cpu(mine)
    target_devs = tuple(remote) + tuple(d for d in mine if d not in remote and not cpu_only)
    draft_devs = tuple(devices.named(cfg.device_draft)) if cfg.device_draft is not None else mine
    split = devices.tensor_split(cfg.tensor_split) if cfg.tensor_split is not None else None
    layout = dict(split_mode=cfg.split_mode, tensor_split=split, main_gpu=cfg.main_gpu)
    pinned = any(d.rpc for d in devices.listed())  # registered servers: llama.cpp's default would use them
    target = Want("target", "-ngl", cfg.gpu_layers, target_devs, named or pinned or cpu_only, **layout)
    draft_layout = layout if draft_devs == target_devs and len(draft_devs) > 1 else {}
    explicit = named or cfg.device_draft is not None or pinned
    return target, Want("draft", "-ngld", cfg.gpu_layers_draft, draft_devs, explicit, **draft_layout)


def exact_on_cpu(gpus: tuple[Device, ...]) -> None:
    """--exact with the target's layers asked onto a GPU: refused. Exact mode makes a verified row the row of a lone
    token by choosing ggml's CPU kernels; GPU backends (CUDA, Metal, Vulkan) pick their kernels by batch size and have
    no such mode, so the promise would be a silent one there. Without -ngl or -dev, exact mode keeps the target on
    the CPU by itself (the draft still offloads: its numerics never change the output)."""
    names = ", ".join(d.label for d in gpus)
    raise UsageError(
        f"--exact keeps the target on the CPU: a GPU's kernels ({names}) compute a verified row differently from a "
        "lone token",
        hint="leave out -ngl/-dev for --exact (the draft still goes to the GPU), or leave out --exact",
    )


class Plan(NamedTuple):
    target: Offload | None  # None: llama.cpp's own defaults
    draft: Offload | None  # as planned before the target loads (the draft's share, for auto to leave free)
    draft_want: Want | None  # what the draft asks, for its placement when it loads (None: llama.cpp's defaults)
    notes: list[str]  # where auto offloads fewer than all layers


def plan(cfg: Any, remote: list[Device], draft: Path | None) -> Plan:
    """Where the target's and the draft's layers go, decided before either loads (a model that cannot fit is one
    line, not the device's out-of-memory error), -ts, -mg and -sm checked against the target's devices (the
    draft inherits them only where its devices are the same). auto leaves the draft's share free for it; the draft's placement
    is decided again when it loads (`offload`, on the memory free then)."""
    target, draft_want = wants(cfg, remote)
    problem = devices.placement_problem(list(target.devices), target.tensor_split, target.main_gpu, target.split_mode)
    if problem:
        raise problem
    if not any(w.devices or w.explicit for w in (target, draft_want)):  # a CPU build: llama.cpp's parameters as ever
        asked = [w for w in (target, draft_want) if w.layers not in ("auto", 0) and (w is target or draft)]
        return Plan(None, None, None, [f"{w.flag} {w.layers}: {NO_GPU}; the {w.role} runs on the CPU" for w in asked])
    n_ctx = context_sizes(cfg.ctx_size, _Facts(cfg.target.name, _n_ctx_train(cfg.target)), None)[0]
    draft_placed, draft_note = offload(draft_want, draft, n_ctx) if draft is not None else (None, None)
    reserve = draft_placed.reserved if draft_placed is not None and target.layers == "auto" else {}
    placed, note = offload(target, cfg.target, n_ctx, reserve=reserve)
    return Plan(placed, draft_placed, draft_want, [n for n in (note, draft_note) if n])


def default_offload(path: Path) -> Offload | None:
    """Where a run at the defaults (-ngl auto, this machine's GPUs, the default -c) puts a model's layers."""
    want = Want("target", "-ngl", "auto", tuple(devices.local()))
    if not want.devices:
        return None
    return offload(want, path, context_sizes(None, _Facts(path.name, _n_ctx_train(path)), None)[0])[0]


def offload(
    want: Want, path: Path, n_ctx: int, context_bytes: int | None = None, reserve: dict[str, int] | None = None
) -> tuple[Offload | None, str | None]:
    """(where the model's layers go, a note where -ngl auto offloads fewer than all of them). Offload None:
    llama.cpp's own defaults, untouched (no device to offload to, none named: a CPU build). A count or 'all'
    that does not fit a device's free memory is a UsageError naming the device and the -ngl that fits; auto
    takes the most that fit, HEADROOM and `reserve` (another model's bytes per device) left free.
    `context_bytes`: its KV cache and recurrent states (default: n_ctx tokens' and one state, by its header)."""
    if not want.devices and not want.explicit:
        return None, None
    mode = devices.SPLIT_MODES[want.split_mode]
    if not want.devices:  # -dev none: every layer on the CPU
        return Offload((), 0, mode, want.main_gpu, want.tensor_split), None
    used = [want.devices[want.main_gpu]] if want.split_mode == "none" else list(want.devices)
    free = [_free(d) for d in used]
    room = [f - (reserve or {}).get(d.name, 0) for d, f in zip(used, free)]
    path = gguf_file.check(path)  # a damaged header is one line here too
    if context_bytes is None:
        context_bytes = n_ctx * memory.kv_bytes_in_header(path) + memory.state_bytes(path)
    shape = layer_fit.shape(path, context_bytes, n_ctx)
    points = layer_fit.cuts(free, want.tensor_split if want.split_mode != "none" else None)
    note = None
    if want.layers == "auto":
        n = layer_fit.most_layers(shape, points, [r - HEADROOM for r in room])
        if n < shape.n:
            note = _auto_note(want, used, room, n, shape.n)
    else:
        n = shape.n if want.layers == "all" else min(want.layers, shape.n)
        _check(want, used, room, shape, points, n)
    held = [(d.name, k, b) for d, (k, b) in zip(used, layer_fit.need(shape, n, points)) if k]
    if want.split_mode == "tensor" and held:  # llama.cpp wraps the devices in one (its Meta backend), so named
        held = [(f"Meta({','.join(d.name for d in used)})", n, sum(b for _, _, b in held))]
    return Offload(tuple(want.devices), n, mode, want.main_gpu, want.tensor_split, shape.n, tuple(held)), note


def layout(p: Plan) -> str:
    """The plan's offloaded layers in a few words (" target Vulkan0=3 draft Vulkan0=3"); "" where none are."""
    parts = [(role, o) for role, o in (("target", p.target), ("draft", p.draft)) if o is not None and o.held]
    return "".join(f" {role} " + ",".join(f"{name}={k}" for name, k, _ in o.held) for role, o in parts)


def host_share(placed: Offload | None) -> float:
    """The share of a model's repeating layers, and so of its KV cache, that stays in this machine's memory
    (the output layer is the first offloaded)."""
    if placed is None or not placed.held:
        return 1.0
    repeating = placed.n_layers - 1
    return 1 - max(0, min(placed.n_gpu_layers, placed.n_layers) - 1) / repeating if repeating > 0 else 0.0


class _Facts(NamedTuple):  # what context_sizes reads of a model, from its header (before it loads)
    name: str
    n_ctx_train: int


def _n_ctx_train(path: Path) -> int:
    meta = gguf_file.header(gguf_file.check(path)).metadata
    return gguf_file.int_value(meta, f"{meta.get('general.architecture')}.context_length") or 0


def placement(model: Model, context_lines: list[str] = ()) -> dict:
    """Where a loaded model's layers and buffers went (its load's log, and its context's: `context_lines`)."""
    held = {name: k for name, k, _ in model.offload.held} if model.offload else {}
    return devices.placement(model.load_log + list(context_lines), model.n_layer + 1, held)


def _free(d: Device) -> int:
    """A device's free bytes; one that does not say has the host's memory (as llama.cpp falls back to it)."""
    free, total = d.memory()
    return free if free or total else available_memory() or 0


def _check(want: Want, used: list[Device], room: list[int], shape, points, n: int) -> None:
    for d, r, (k, b) in zip(used, room, layer_fit.need(shape, n, points)):
        if b > r:
            fits = layer_fit.most_layers(shape, points, room)
            what = "layer needs" if k == 1 else f"{k} layers need"
            hint = f"use {want.flag} {fits} or less" if fits else f"use {want.flag} 0 (every layer on the CPU)"
            raise UsageError(
                f"the {want.role}'s {what} {_size(b)} on {d.label}, which has {_size(max(r, 0))} free",
                hint=f"{hint}, or a smaller -c",
            )


def _auto_note(want: Want, used: list[Device], room: list[int], n: int, total: int) -> str:
    where = " and ".join(f"{d.name}'s {_size(max(r, 0))} free" for d, r in zip(used, room))
    spare = f"{_size(HEADROOM)} of it kept spare" + (" on each" if len(used) > 1 else "")
    if not n:
        return (
            f"{want.flag} auto: none of the {want.role}'s {total} layers fit in {where} ({spare}); they run on the CPU"
        )
    return (
        f"{want.flag} auto: {n} of the {want.role}'s {total} layers fit in {where} ({spare}); the others run on the CPU"
    )


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
