"""The CPU features that choose ggml's kernels on this host, as one short line ("AVX2, no AVX-512, ...").

They change what a verify batch costs against one token (tiled and VNNI dot products) and whether its rows
come out bit for bit as one-token rows without exact mode, so `bench` prints them beside the CPU's name.
ggml's own view comes first (`llama_print_system_info`: what this build's CPU backend uses, on this CPU);
/proc/cpuinfo's flags (what the CPU has) stand in when ggml gives none.
"""

from __future__ import annotations

import functools
import platform
import re
from pathlib import Path

# ggml's feature name, as the line shows it; the first four (x86) or four (Arm) are always named, present
# or not; the rest only when present.
X86 = [("AVX2", "AVX2"), ("AVX512", "AVX-512"), ("AVX512_VNNI", "AVX512-VNNI"), ("AVX_VNNI", "AVX-VNNI")]
X86_RARE = [("AVX512_BF16", "AVX512-BF16"), ("AMX_INT8", "AMX-INT8")]
ARM = [("NEON", "NEON"), ("DOTPROD", "DOTPROD"), ("MATMUL_INT8", "I8MM"), ("SVE", "SVE")]
ARM_RARE = [("SME", "SME")]

# /proc/cpuinfo's flag (x86 "flags", Arm "Features") for each of ggml's names above.
CPUINFO_FLAGS = {
    "avx2": "AVX2",
    "avx512f": "AVX512",
    "avx512_vnni": "AVX512_VNNI",
    "avx_vnni": "AVX_VNNI",
    "avx512_bf16": "AVX512_BF16",
    "amx_int8": "AMX_INT8",
    "asimd": "NEON",
    "asimddp": "DOTPROD",
    "i8mm": "MATMUL_INT8",
    "sve": "SVE",
    "sme": "SME",
}
# Build options, not CPU features.
NOT_FEATURES = {"LLAMAFILE", "OPENMP", "REPACK", "ACCELERATE", "KLEIDIAI", "SVE_CNT"}


def parse_system_info(info: str | bytes) -> set[str] | None:
    """ggml's names of the features its CPU backend uses, from llama_print_system_info's
    "CPU : SSE3 = 1 | AVX2 = 1 | ... | CUDA : ARCHS = 890 | ..." (a build lists what it has, an older
    one "AVX512 = 0" too); None without a CPU section."""
    if isinstance(info, bytes):
        info = info.decode("utf-8", "replace")
    features, backend, seen = set(), None, False
    for part in info.split("|"):
        m = re.fullmatch(r"\s*(?:(\S+) : )?(\w+) = (\S*)\s*", part)
        if m:
            backend = m[1] or backend
            seen = seen or backend == "CPU"
            if backend == "CPU" and m[3] not in ("0", ""):
                features.add(m[2])
    return features if seen else None


def parse_cpuinfo(text: str) -> set[str]:
    """ggml's names of the features /proc/cpuinfo's first "flags" (x86) or "Features" (Arm) line lists."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return {CPUINFO_FLAGS[f] for f in value.split() if f in CPUINFO_FLAGS}
    return set()


def describe(used: set[str], arch: str, host: set[str] | None = None) -> str:
    """One line: the ladder of `arch`'s features ggml's kernels use, each one present or "no X"; a feature
    the CPU has (`host`) that the build does not use says so."""
    if re.fullmatch(r"x86_64|amd64|i[3-6]86|x86", arch.lower()) or used & {n for n, _ in X86}:
        ladder, rare = X86, X86_RARE
    elif re.fullmatch(r"aarch64|arm64|armv8.*", arch.lower()) or "NEON" in used:
        ladder, rare = ARM, ARM_RARE
    else:
        return ", ".join(sorted(used - NOT_FEATURES)) or arch or "unknown CPU"
    out = []
    for name, shown in ladder:
        if name in used:
            out.append(shown)
        else:
            out.append(f"no {shown}" + (" (in the CPU, not in this build)" if host and name in host else ""))
    return ", ".join(out + [shown for name, shown in rare if name in used])


@functools.cache
def build_features() -> frozenset[str]:
    """ggml's names of the features this build's CPU backend uses on this CPU (empty where it does not say)."""
    try:
        import llama_cpp.llama_cpp as L

        return frozenset(parse_system_info(L.llama_print_system_info()) or ())
    except Exception:  # no llama_cpp, or a build without the call
        return frozenset()


def amx() -> bool:
    """ggml multiplies quantized weights with Intel's AMX tiles here. Its AMX buffer type (one of the "extra"
    weight layouts, tried first) crashes llama_decode with SIGSEGV on batches of two or more rows on the Xeon this
    was found on (llama-completion alike; Q4_0, Q4_1, Q4_K): models are loaded without the extra layouts there."""
    return "AMX_INT8" in build_features()


@functools.cache
def features() -> str:
    """This host's line, e.g. "AVX2, no AVX-512, no AVX512-VNNI, no AVX-VNNI". Cached: ggml's registry
    and /proc/cpuinfo are read once, on the first call (importing this module reads neither)."""
    try:
        host = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        host = None
    try:
        import llama_cpp.llama_cpp as L

        used = parse_system_info(L.llama_print_system_info())
    except Exception:  # no llama_cpp, or a build without the call: the CPU's own flags
        used = None
    if used is None:
        if host is None:
            return f"{platform.machine() or 'CPU'} (features unknown)"
        used, host = host, None
    return describe(used, platform.machine(), host)
