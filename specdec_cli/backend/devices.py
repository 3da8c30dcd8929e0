"""This machine's devices as llama.cpp sees them (ggml's device API), where a model's layers go, and where
llama.cpp says they went (how many fit: layer_fit.py).

The offload options keep llama.cpp's meanings (common/arg.cpp, llama_model_base::load_tensors): a model has
n_layer + 1 offloadable layers, the output layer being the first to go (-ngl 1 offloads it alone, n_layer + 1
every layer); -dev names the devices (none: no offload); the offloaded layers are cut between them by -ts, else
by their free memory; -sm none keeps them on the -mg'th. llama.cpp has no API for where the buffers went, only
its load log: `placement` reads the lines native.py captures.
"""

from __future__ import annotations

import ctypes
import math
import re
from dataclasses import dataclass, field

import llama_cpp.llama_cpp as L

from ..errors import UsageError
from . import native

CPU, GPU, IGPU, ACCEL, META = range(5)  # enum ggml_backend_dev_type (ggml-backend.h)
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}  # enum llama_split_mode
LAYER_WORDS = ("all", "auto")  # -ngl's words besides a count


class _Caps(ctypes.Structure):  # struct ggml_backend_dev_caps
    _fields_ = [(n, ctypes.c_bool) for n in ("is_async", "host_buffer", "buffer_from_host_ptr", "events")]


class _Props(ctypes.Structure):  # struct ggml_backend_dev_props
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("description", ctypes.c_char_p),
        ("memory_free", ctypes.c_size_t),
        ("memory_total", ctypes.c_size_t),
        ("type", ctypes.c_int),
        ("device_id", ctypes.c_char_p),
        ("caps", _Caps),
    ]


_LIB = None


def ggml() -> ctypes.CDLL:
    """ggml's backend, device and RPC functions, with their signatures, through libllama's handle (native)."""
    global _LIB
    if _LIB is None:
        native.init_backend()
        lib = native.native_lib()
        vp, sz, s = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        signatures = {
            "ggml_backend_rpc_add_server": ([s], vp),
            "ggml_backend_register": ([vp], None),
            "ggml_backend_reg_dev_count": ([vp], sz),
            "ggml_backend_reg_dev_get": ([vp, sz], vp),
            "ggml_backend_reg_name": ([vp], s),
            "ggml_backend_dev_count": ([], sz),
            "ggml_backend_dev_get": ([sz], vp),
            "ggml_backend_dev_by_name": ([s], vp),
            "ggml_backend_dev_type": ([vp], ctypes.c_int),
            "ggml_backend_dev_backend_reg": ([vp], vp),
            "ggml_backend_dev_name": ([vp], s),
            "ggml_backend_dev_description": ([vp], s),
            "ggml_backend_dev_memory": ([vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
            "ggml_backend_dev_get_props": ([vp, ctypes.POINTER(_Props)], None),
            "ggml_backend_dev_buffer_type": ([vp], vp),
            "ggml_backend_dev_host_buffer_type": ([vp], vp),
            "ggml_backend_buft_name": ([vp], s),
            "ggml_backend_reg_get_proc_address": ([vp, s], vp),
            "ggml_backend_rpc_start_server": ([s, s, sz, sz, ctypes.POINTER(vp)], None),
        }
        for name, (args, res) in signatures.items():
            fn = getattr(lib, name, None)
            if fn is not None:  # (a build without RPC has no rpc functions: rpc.require says so first)
                fn.argtypes, fn.restype = args, res
        _LIB = lib
    return _LIB


# --- the devices ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    handle: int  # ggml_backend_dev_t
    name: str  # "CUDA0", "Vulkan0", "RPC0"
    description: str  # "NVIDIA H100 80GB HBM3"
    kind: int  # enum ggml_backend_dev_type
    rpc: bool  # another machine's, through an RPC server
    bus_id: str | None = field(default=None, compare=False)  # its PCI bus id, where known

    @property
    def label(self) -> str:
        return f"{self.name} ({self.description})"

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes now; (0, 0) where the device does not say."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml().ggml_backend_dev_memory(self.handle, ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value


def device(handle: int) -> Device:
    """The device of a ggml_backend_dev_t."""
    lib = ggml()
    props = _Props()
    lib.ggml_backend_dev_get_props(handle, ctypes.byref(props))
    rpc = lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(handle)) == b"RPC"
    name, desc = (lib.ggml_backend_dev_name(handle) or b"?"), (lib.ggml_backend_dev_description(handle) or b"")
    bus = props.device_id.decode() if props.device_id else None
    return Device(handle, name.decode(), desc.decode().strip(), lib.ggml_backend_dev_type(handle), rpc, bus)


def listed() -> list[Device]:
    """Every device ggml has registered, the CPU and RPC servers' included."""
    lib = ggml()
    return [device(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]


def default() -> list[Device]:
    """The devices llama.cpp gives a model by default (llama_prepare_model_devices): RPC servers first, then the
    discrete GPUs (one per bus id: a GPU that two backends see is used once), else the integrated ones."""
    rpcs, gpus, igpus = [], [], []
    for d in listed():
        if d.kind == GPU and d.rpc:
            rpcs.append(d)
        elif d.kind == GPU and not any(g.bus_id and g.bus_id == d.bus_id for g in gpus):
            gpus.append(d)
        elif d.kind == IGPU and (not igpus or _reg(d) == _reg(igpus[-1])):  # one backend's integrated GPUs
            igpus.append(d)
    return rpcs + (gpus or igpus)


def _reg(d: Device) -> int:
    return ggml().ggml_backend_dev_backend_reg(d.handle)


def local() -> list[Device]:
    """The default devices of this machine (no RPC server): where a draft goes."""
    return [d for d in default() if not d.rpc]


def offload_devices() -> list[Device]:
    """Every device -dev may name: all but the CPU and its accelerators (BLAS, AMX)."""
    return [d for d in listed() if d.kind not in (CPU, ACCEL)]


def buffer_owners() -> dict[str, str]:
    """Buffer-type names (as llama.cpp's log prints them) to their device's name, for the devices' own memory;
    a host buffer (CUDA_Host, CPU_Mapped, CPU_REPACK) is the CPU's."""
    lib, out = ggml(), {}
    for d in offload_devices():
        buft = lib.ggml_backend_dev_buffer_type(d.handle)
        if buft:
            out[lib.ggml_backend_buft_name(buft).decode()] = d.name
    return out


@dataclass(frozen=True)
class Offload:
    """Where a model's layers go, as llama_model_params says it, and how many each device gets."""

    devices: tuple[Device, ...]  # () : none (-dev none), every layer on the CPU
    n_gpu_layers: int  # llama.cpp's count: n_layer + 1 is every layer
    split_mode: int = SPLIT_MODES["layer"]
    main_gpu: int = 0
    tensor_split: tuple[float, ...] | None = None
    n_layers: int = 0  # the model's: n_layer + 1
    held: tuple[tuple[str, int, int], ...] = ()  # (device name, layers, bytes) as load_tensors assigns them

    @property
    def reserved(self) -> dict[str, int]:
        """Bytes each device holds of the model and its context (another model's fit leaves them)."""
        return {name: b for name, _, b in self.held}

    def apply(self, params) -> tuple:
        """Set llama_model_params; the arrays it then points at, which must outlive the load."""
        devs = (ctypes.c_void_p * (len(self.devices) + 1))(*(d.handle for d in self.devices), None)
        params.devices = ctypes.cast(devs, ctypes.c_void_p)
        params.n_gpu_layers = self.n_gpu_layers
        params.split_mode = self.split_mode
        params.main_gpu = self.main_gpu
        if self.tensor_split is None:
            return (devs,)
        # llama_max_devices() floats, the devices' proportions first (llama.cpp reads one per device)
        split = (ctypes.c_float * max(L.llama_max_devices(), len(self.tensor_split)))(*self.tensor_split)
        params.tensor_split = split
        return devs, split


# --- the options' values ---------------------------------------------------------------------------
def by_name(name: str) -> Device | None:
    """The device llama.cpp's -dev finds by this name (ggml_backend_dev_by_name: any case), or None."""
    handle = ggml().ggml_backend_dev_by_name(name.encode())
    return device(handle) if handle else None


def names_problem(value: str) -> str | None:
    """What is wrong with a -dev value, or None: `none`, or names of this machine's non-CPU devices."""
    items = [n.strip() for n in str(value).split(",")]
    if not all(items):
        return f"must name devices, comma-separated, or none (got {value!r})"
    if "none" in items:
        return None if items == ["none"] else f"cannot mix none with device names (got {value!r})"
    found = [by_name(item) for item in items]
    for item, d in zip(items, found):
        if d is None:
            have = ", ".join(o.label for o in offload_devices()) or "none but the CPU"
            return f"names no device of this machine: {item!r} (devices: {have})"
        if d.kind in (CPU, ACCEL):
            return f"names {item!r}, which is the CPU, where the layers not offloaded stay: name GPUs, or none"
    if len({d.name for d in found}) != len(found):
        return f"names a device twice (got {value!r})"
    return None


def named(value: str) -> list[Device]:
    """-dev's devices (none: no offload), in the order given; the names are checked (names_problem)."""
    items = [n.strip() for n in value.split(",")]
    return [] if items == ["none"] else [by_name(n) for n in items]


def layers(value: int | str) -> int | str:
    """-ngl's value: a count of layers, 'all' or 'auto' (a config file may give a count as a number)."""
    if isinstance(value, str) and value.strip().lower() in LAYER_WORDS:
        return value.strip().lower()
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"must be a number of layers (0 or more), 'all' or 'auto' (got {value!r})")


def tensor_split(value: str) -> tuple[float, ...]:
    """-ts's proportions: numbers >= 0, not all 0, split at commas or slashes (as llama.cpp splits them)."""
    items = [x.strip() for x in re.split(r"[,/]+", str(value))]
    try:
        out = tuple(float(x) for x in items)
    except ValueError:
        raise ValueError(f"must be proportions such as 3,1 (got {value!r})") from None
    if not all(math.isfinite(x) and x >= 0 for x in out):
        raise ValueError(f"must be proportions of 0 or more (got {value!r})")
    if not any(out):
        raise ValueError(f"must give some device a share: every proportion is 0 (got {value!r})")
    return out


def _rule(parse):
    """A value's problem as `parse` words it (its ValueError), or None."""

    def problem(value) -> str | None:
        try:
            parse(value)
        except ValueError as e:
            return str(e)
        return None

    return problem


layers_problem, split_problem = _rule(layers), _rule(tensor_split)


def placement_problem(
    devs: list[Device], split: tuple[float, ...] | None, main_gpu: int, mode: str = "layer"
) -> UsageError | None:
    """-ts, -mg and -sm against the devices a model gets: no more proportions than devices, -mg one of them,
    rows split only where the backend can (llama.cpp fails the load otherwise)."""
    names = ", ".join(d.name for d in devs)
    count = f"{len(devs)} device{'s' if len(devs) > 1 else ''} ({names})" if devs else "no device to offload to"
    if split is not None and len(split) > len(devs):
        return UsageError(
            f"-ts/--tensor-split has {len(split)} proportion{'s' if len(split) > 1 else ''}, but the target has {count}",
            hint="give one proportion per device, in -dev's order",
        )
    if main_gpu and main_gpu >= len(devs):
        options = f"-mg 0 to {len(devs) - 1}" if len(devs) > 1 else "-mg 0"
        return UsageError(
            f"-mg/--main-gpu {main_gpu} is out of range: the target has {count}",
            hint=f"use {options}" if devs else "leave -mg out",
        )
    if mode != "row":
        return None
    split_buffers = b"ggml_backend_split_buffer_type"  # what llama.cpp's row split asks of a device's backend
    unsplit = [d.name for d in devs if not ggml().ggml_backend_reg_get_proc_address(_reg(d), split_buffers)]
    if unsplit:
        return UsageError(
            f"-sm/--split-mode row: {', '.join(unsplit)} cannot split a matrix's rows (llama.cpp's CUDA and SYCL "
            "backends can)",
            hint="use -sm layer",
        )
    return None


# --- what llama.cpp says it did ------------------------------------------------------------------------
_BUFFER = re.compile(r"^(\w+): +(\S+) +(model|KV|RS|compute) buffer size = +([\d.]+) MiB")
_KINDS = {"model": "model_bytes", "KV": "kv_bytes", "RS": "kv_bytes", "compute": "compute_bytes"}


def buffers(lines: list[str], owners: dict[str, str]) -> dict[str, dict[str, int]]:
    """Bytes per device and kind (model_bytes, kv_bytes: KV cache and recurrent state, compute_bytes) from
    llama.cpp's load log ("load_tensors:   CUDA0 model buffer size =  1234.56 MiB"). Host buffers (CPU_Mapped,
    CPU_REPACK, CUDA_Host) are the CPU's; a buffer type no device owns (a row split's) keeps its own name."""
    out: dict[str, dict[str, int]] = {}
    for line in lines:
        m = _BUFFER.match(line)
        if not m:
            continue
        buf, kind, mib = m.group(2), _KINDS[m.group(3)], float(m.group(4))
        meta = buf.startswith("Meta(") and owners.get("Meta(")  # -sm tensor: llama.cpp's one device over several
        where = owners.get(buf) or meta or ("CPU" if buf.startswith("CPU") or buf.endswith("_Host") else buf)
        slot = out.setdefault(where, {"model_bytes": 0, "kv_bytes": 0, "compute_bytes": 0})
        slot[kind] += round(mib * 2**20)
    return out


def placement(lines: list[str], n_total: int, layers_on: dict[str, int], owners: dict[str, str] | None = None) -> dict:
    """Where a model (and its contexts) went: its layers (n_layer + 1, as llama.cpp counts them), how many are
    offloaded, and per device its layers and buffers. `layers_on`: the layers each device was given (the CPU
    holds the rest; "Meta(A,B)": -sm tensor's devices, as one); `lines`: what the log said of the buffers."""
    meta = [n for n in layers_on if n.startswith("Meta(")]
    owners = {**(buffer_owners() if owners is None else owners), **({"Meta(": meta[0]} if meta else {})}
    found = buffers(lines, owners)
    offloaded = sum(layers_on.values())
    devices = {name: {"layers": n} for name, n in layers_on.items()}
    devices["CPU"] = {"layers": n_total - offloaded}
    empty = {"model_bytes": 0, "kv_bytes": 0, "compute_bytes": 0}
    for name in list(devices) + [n for n in found if n not in devices]:
        devices[name] = {"layers": devices.get(name, {}).get("layers", 0), **empty, **found.get(name, {})}
    return {"layers": n_total, "offloaded": offloaded, "devices": devices}
