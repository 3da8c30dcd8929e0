"""cpu.features(): the CPU features that choose ggml's kernels, named in the exact-mode controls' skips and
in bench's header and JSON."""

from __future__ import annotations

from specdec_cli.backend import cpu

# llama_print_system_info of this project's builds: only what the CPU backend has is listed.
AVX2_BUILD = b"CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
ZEN4_BUILD = (
    "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | "
    "LLAMAFILE = 1 | CUDA : ARCHS = 890 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | "
)
OLD_BUILD = "AVX = 1 | AVX_VNNI = 0 | AVX2 = 1 | AVX512 = 0 | AVX512_VNNI = 0 | NEON = 0 | LLAMAFILE = 1 | "
EPYC_CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx f16c avx2 fma bmi2\nbugs\t\t: x\n"
GRAVITON_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimddp sha512 sve i8mm bf16\n"


def test_ggml_system_info_is_read_for_its_cpu_backend_only():
    assert cpu.parse_system_info(AVX2_BUILD) >= {"AVX2", "FMA"}
    assert "AVX512" not in cpu.parse_system_info(AVX2_BUILD)
    zen4 = cpu.parse_system_info(ZEN4_BUILD)
    assert {"AVX512", "AVX512_VNNI", "AVX512_BF16"} <= zen4 and not {"ARCHS", "USE_GRAPHS"} & zen4
    assert cpu.parse_system_info("CUDA : ARCHS = 890 | ") is None
    assert cpu.parse_system_info("") is None


def test_an_older_line_without_backend_names_is_not_taken_for_the_cpu():
    assert cpu.parse_system_info(OLD_BUILD) is None  # no "CPU :": /proc/cpuinfo decides instead


def test_cpuinfo_flags_map_to_ggml_names():
    assert cpu.parse_cpuinfo(EPYC_CPUINFO) == {"AVX2"}
    assert cpu.parse_cpuinfo(GRAVITON_CPUINFO) == {"NEON", "DOTPROD", "SVE", "MATMUL_INT8"}
    assert cpu.parse_cpuinfo("processor\t: 0\n") == set()


def test_the_line_names_every_step_of_the_ladder_present_or_not():
    assert cpu.describe(cpu.parse_system_info(AVX2_BUILD), "x86_64") == "AVX2, no AVX-512, no AVX512-VNNI, no AVX-VNNI"
    zen4 = cpu.describe(cpu.parse_system_info(ZEN4_BUILD), "AMD64")
    assert zen4 == "AVX2, AVX-512, AVX512-VNNI, no AVX-VNNI, AVX512-BF16"
    arm = cpu.describe(cpu.parse_cpuinfo(GRAVITON_CPUINFO), "aarch64")
    assert arm == "NEON, DOTPROD, I8MM, SVE"
    assert cpu.describe({"RISCV_V", "LLAMAFILE"}, "riscv64") == "RISCV_V"
    assert cpu.describe(set(), "riscv64") == "riscv64"


def test_a_cpu_feature_the_build_leaves_out_says_so():
    line = cpu.describe({"AVX2"}, "x86_64", host={"AVX2", "AVX512"})
    assert line.startswith("AVX2, no AVX-512 (in the CPU, not in this build), no AVX512-VNNI")


def test_this_hosts_line_is_cached_and_names_ggmls_view():
    cpu.features.cache_clear()
    line = cpu.features()
    assert line and line is cpu.features() and "\n" not in line
    import platform

    if platform.machine().lower() in ("x86_64", "amd64"):
        assert line.split(", ")[0] in ("AVX2", "no AVX2") and "AVX-512" in line and "VNNI" in line
