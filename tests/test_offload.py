"""Offloading to GPUs with llama.cpp's options (-ngl, -ngld, -dev, -devd, -sm, -ts, -mg): each bad value is one
line and exit 2, the fit arithmetic that -ngl auto and the memory check share, where llama.cpp's log says the
buffers went, and a CPU build's runs unchanged. The `vulkan` tests run the CLI on a Vulkan build of the same
llama.cpp (Mesa's lavapipe will do): set SPECDEC_VULKAN_LIB to the folder of its shared libraries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specdec_cli import config, fit
from specdec_cli.backend import devices, gguf_file, layer_fit, native
from specdec_cli.backend.devices import GPU, Device
from specdec_cli.backend.layer_fit import Shape
from specdec_cli.errors import SpecdecError, UsageError
from test_cli import one_line_error, specdec

MIB = 2**20
NO_GPU = not devices.offload_devices()  # the CPU build CI runs


# --- the options: one line and exit 2 for each bad value -------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["-ngl", "-5"], "error: -ngl/--gpu-layers must be a number of layers (0 or more), 'all' or 'auto' (got '-5')"),
        (["-ngl", "lots"], "error: -ngl/--gpu-layers must be a number of layers (0 or more), 'all' or 'auto'"),
        (["-ngld", "-1"], "error: -ngld/--gpu-layers-draft must be a number of layers (0 or more)"),
        (["-dev", "Vulkan7"], "error: -dev/--device names no device of this machine: 'Vulkan7' (devices: "),
        (["-devd", "CUDA9"], "error: -devd/--device-draft names no device of this machine: 'CUDA9' (devices: "),
        (["-dev", "CPU"], "error: -dev/--device names 'CPU', which is the CPU, where the layers not offloaded stay"),
        (["-dev", "none,CPU"], "error: -dev/--device cannot mix none with device names (got 'none,CPU')"),
        (["-dev", ","], "error: -dev/--device must name devices, comma-separated, or none"),
        (["-sm", "garbage"], "error: -sm/--split-mode must be one of none, layer, row, tensor (got 'garbage')"),
        (["-ts", "3,-1"], "error: -ts/--tensor-split must be proportions of 0 or more (got '3,-1')"),
        (["-ts", "0,0"], "error: -ts/--tensor-split must give some device a share: every proportion is 0"),
        (["-ts", "a,b"], "error: -ts/--tensor-split must be proportions such as 3,1 (got 'a,b')"),
        (["-ts", "inf"], "error: -ts/--tensor-split must be proportions of 0 or more (got 'inf')"),
        (["-mg", "-1"], "error: -mg/--main-gpu must be 0 or more: an index into the devices (got -1)"),
    ],
)
def test_a_bad_offload_value_is_one_line_and_exit_2(capsys, models, args, message):
    code, out, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "-n", "2", *args)
    assert code == 2 and out == "", err
    assert one_line_error(err).startswith(message)


def test_a_device_that_does_not_exist_lists_those_that_do(capsys, models):
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "-dev", "Vulkan7")
    listed = ", ".join(d.label for d in devices.offload_devices()) or "none but the CPU"
    assert code == 2 and one_line_error(err).endswith(f"(devices: {listed})")


@pytest.mark.skipif(not NO_GPU, reason="counts the devices of a build without a GPU")
@pytest.mark.parametrize(
    "args, message",
    [
        (["-ts", "1,1"], "error: -ts/--tensor-split has 2 proportions, but the target has no device to offload to"),
        (["-mg", "1"], "error: -mg/--main-gpu 1 is out of range: the target has no device to offload to"),
        (["-dev", "none", "-ts", "1"], "error: -ts/--tensor-split has 1 proportion, but the target has no device"),
    ],
)
def test_a_split_for_more_devices_than_there_are_is_one_line_and_exit_2(capsys, models, args, message):
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "-n", "2", *args)
    assert code == 2 and one_line_error(err).startswith(message), err


def test_every_run_command_takes_the_offload_options():
    for command in ("generate", "bench", "serve", "batch"):
        r = subprocess.run(
            [sys.executable, "-m", "specdec_cli", command, "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "250"},
        )
        for flag in ("-ngl", "-ngld", "-dev", "-devd", "-sm", "-ts", "-mg"):
            assert f" {flag} " in r.stdout, (command, flag)


def test_a_pair_sets_the_offload_options_and_a_bad_one_names_its_key(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(
        '[pairs.gpu]\ntarget = "t.gguf"\ngpu_layers = 20\ngpu_layers_draft = "all"\ndevice = "none"\n'
        'split_mode = "none"\nmain_gpu = 0\n'
    )
    cfg = config.resolve({"gpu_layers": "7"}, "gpu", good)  # the command line wins, "7" as given
    assert (cfg.gpu_layers, cfg.gpu_layers_draft, cfg.device, cfg.split_mode) == (7, "all", "none", "none")
    assert cfg.as_dict()["gpu_layers"] == 7
    bad = tmp_path / "bad.toml"
    bad.write_text('[pairs.gpu]\ntarget = "t.gguf"\ngpu_layers = -3\n')
    with pytest.raises(SpecdecError, match=r"pairs\.gpu\.gpu_layers: must be a number of layers \(0 or more\)"):
        config.resolve({}, "gpu", bad)


# --- the arithmetic: llama.cpp's assignment, and how many layers fit ------------------------------------
def test_layers_are_cut_between_devices_as_llama_cpp_cuts_them():
    """The last n of n_layer + 1 layers, the output layer among them; split at the cumulative proportions."""
    assert layer_fit.assign(29, 29, layer_fit.cuts([1, 1], None)) == [0] * 15 + [1] * 14
    assert layer_fit.assign(29, 29, layer_fit.cuts([80, 80], (3, 1))) == [0] * 22 + [1] * 7
    assert layer_fit.assign(29, 29, layer_fit.cuts([30 << 30, 10 << 30], None)) == [0] * 22 + [1] * 7  # by free memory
    assert layer_fit.assign(29, 99, layer_fit.cuts([1], None)) == [0] * 29  # more than there are: every layer
    assert layer_fit.assign(29, 0, layer_fit.cuts([1], None)) == []


def test_one_offloaded_layer_is_the_output_layer():
    s = Shape(weights=(100,) * 28 + (500,), context=(10,) * 28 + (0,), compute=7)
    assert layer_fit.need(s, 1, [1.0]) == [(1, 500 + 7)]  # the output layer and a compute buffer
    assert layer_fit.need(s, 2, [1.0]) == [(2, 500 + 100 + 10 + 7)]
    assert layer_fit.need(s, 0, [1.0]) == [(0, 0)]


def test_the_most_layers_that_fit_each_device():
    """A 28-layer model of 300 MiB layers, 30 MiB of KV cache each and a 500 MiB output layer."""
    s = Shape(weights=(300 * MIB,) * 28 + (500 * MIB,), context=(30 * MIB,) * 28 + (0,), compute=300 * MIB)
    assert layer_fit.most_layers(s, [1.0], [10 << 30]) == 29  # 9.5 GiB: every layer
    # 6 GiB: 800 MiB for the output layer and the compute buffer, then 330 MiB per layer: 16 more
    assert layer_fit.most_layers(s, [1.0], [6 << 30]) == 1 + (6 * 1024 - 800) // 330
    assert layer_fit.most_layers(s, [1.0], [700 * MIB]) == 0  # not even the output layer
    # two devices, an even cut: the first holds the first half of the offloaded layers, the second the output layer
    assert layer_fit.most_layers(s, [0.5, 1.0], [6 << 30, 6 << 30]) == 29  # 15 layers on one, 14 on the other
    assert layer_fit.most_layers(s, [0.5, 1.0], [6 << 30, 2 << 30]) < 29


def fake_gpu(monkeypatch, free: int) -> Device:
    """A device with `free` bytes free (its memory is the only thing fit asks of it)."""
    monkeypatch.setattr(Device, "memory", lambda self: (free, 80 << 30))
    return Device(0, "CUDA0", "NVIDIA H100 80GB HBM3", GPU, False)


def test_a_model_that_does_not_fit_names_the_device_and_the_ngl_that_fits(models, monkeypatch):
    shape = layer_fit.shape(models["target"], 64 * 256, 64)  # -c 64: 256 bytes of KV cache per token
    two = layer_fit.need(shape, 2, [1.0])[0][1]  # what two layers take: room for no more
    gpu = fake_gpu(monkeypatch, two)
    with pytest.raises(UsageError) as e:
        fit.offload(fit.Want("target", "-ngl", "all", (gpu,)), models["target"], 64, 64 * 256)
    assert e.value.message.startswith("the target's 3 layers need ") and e.value.message.endswith(
        f"on CUDA0 (NVIDIA H100 80GB HBM3), which has {two / MIB:.1f} MiB free"
    )
    assert e.value.hint == "use -ngl 2 or less, or a smaller -c"
    placed, note = fit.offload(fit.Want("target", "-ngl", 2, (gpu,)), models["target"], 64, 64 * 256)
    assert placed.n_gpu_layers == 2 and placed.held == (("CUDA0", 2, two),) and note is None


def test_auto_offloads_every_layer_that_fits_leaving_headroom(models, monkeypatch):
    shape = layer_fit.shape(models["target"], 64 * 256, 64)
    two = layer_fit.need(shape, 2, [1.0])[0][1]
    gpu = fake_gpu(monkeypatch, fit.HEADROOM + two)
    placed, note = fit.offload(fit.Want("target", "-ngl", "auto", (gpu,)), models["target"], 64, 64 * 256)
    assert placed.n_gpu_layers == 2 and note.startswith("-ngl auto: 2 of the target's 3 layers fit in CUDA0's ")
    gpu = fake_gpu(monkeypatch, 80 << 30)
    placed, note = fit.offload(fit.Want("target", "-ngl", "auto", (gpu,)), models["target"], 64, 64 * 256)
    assert placed.n_gpu_layers == 3 and note is None  # every layer, as llama.cpp's default puts them
    assert fit.host_share(placed) == 0.0  # and so the KV cache: none of it in this machine's memory


def test_the_weights_counted_are_the_files_tensors(models):
    """Each layer's tensors, then the output layer's; token_embd stays on the CPU, unless the model multiplies by
    it for want of an output matrix: then llama.cpp copies it to the output layer's device."""
    h = gguf_file.header(models["target"])
    size = {t.name: t.nbytes for t in h.tensors}
    layers = layer_fit.layer_weights(h)
    assert len(layers) == 3 and sum(layers) == sum(size.values()) - size["token_embd.weight"]
    assert layers[-1] == size["output.weight"] + size["output_norm.weight"]
    tied = gguf_file.Header(h.version, h.metadata, [t for t in h.tensors if t.name != "output.weight"], 0)
    assert layer_fit.layer_weights(tied)[-1] == size["token_embd.weight"] + size["output_norm.weight"]


# --- where llama.cpp says the buffers went -----------------------------------------------------------
VULKAN_LINES = [  # llama.cpp's log of a target with -ngl 2 on lavapipe (Vulkan0), verbatim
    "load_tensors: offloaded 2/4 layers to GPU\n",
    "load_tensors:   CPU_Mapped model buffer size =     0.43 MiB\n",
    "load_tensors:      Vulkan0 model buffer size =     0.22 MiB\n",
    "llama_context: Vulkan_Host  output buffer size =     0.00 MiB\n",
    "llama_kv_cache:        CPU KV buffer size =     0.50 MiB\n",
    "llama_memory_recurrent:        CPU RS buffer size =     0.00 MiB\n",
    "llama_memory_recurrent:    Vulkan0 RS buffer size =     0.00 MiB\n",
    "sched_reserve:    Vulkan0 compute buffer size =    41.02 MiB\n",
    "sched_reserve: Vulkan_Host compute buffer size =     8.26 MiB\n",
    "~llama_context:    Vulkan0 compute buffer size is  41.0234 MiB, matches expectation of  41.0234 MiB\n",
]
RPC_LINES = [  # a target on two RPC servers (the buffer types are named by endpoint)
    "load_tensors: RPC0[127.0.0.1:50052] model buffer size =    36.53 MiB\n",
    "load_tensors: RPC1[127.0.0.1:50053] model buffer size =    34.90 MiB\n",
    "load_tensors:   CPU_Mapped model buffer size =    28.69 MiB\n",
]


def test_placement_is_read_from_llama_cpps_log():
    p = devices.placement(VULKAN_LINES, 4, {"Vulkan0": 2}, {"Vulkan0": "Vulkan0"})
    assert p["layers"] == 4 and p["offloaded"] == 2
    assert p["devices"]["Vulkan0"] == {
        "layers": 2,
        "model_bytes": round(0.22 * MIB),
        "kv_bytes": 0,
        "compute_bytes": round(41.02 * MIB),
    }
    # the host's buffers (mapped weights, pinned Vulkan_Host staging) are the CPU's; the output buffer is not counted
    assert p["devices"]["CPU"] == {
        "layers": 2,
        "model_bytes": round(0.43 * MIB),
        "kv_bytes": round(0.5 * MIB),
        "compute_bytes": round(8.26 * MIB),
    }
    owners = {"RPC0[127.0.0.1:50052]": "RPC0", "RPC1[127.0.0.1:50053]": "RPC1"}
    p = devices.placement(RPC_LINES, 31, {"RPC0": 16, "RPC1": 15}, owners)
    assert {name: d["model_bytes"] for name, d in p["devices"].items()} == {
        "RPC0": round(36.53 * MIB),
        "RPC1": round(34.90 * MIB),
        "CPU": round(28.69 * MIB),
    }


def test_only_placement_lines_are_captured_and_only_inside_a_capture(models):
    from specdec_cli.backend.native import Model

    with native.capture() as outer:
        with Model(models["target"]) as m:
            pass
    assert m.load_log and all(line.startswith("load_tensors:") for line in m.load_log)
    assert outer == []  # the model's load kept its own lines
    with Model(models["target"]) as again:
        pass
    assert again.load_log == m.load_log


def test_a_cpu_run_says_every_layer_is_on_the_cpu(capsys, models):
    args = ["--target", str(models["target"]), "--draft", str(models["draft"]), "--drafter", "model"]
    code, out, err = specdec(capsys, "generate", "hi", *args, "-n", "4", "--json", "-dev", "none")
    assert code == 0, err
    placement = json.loads(out)["config"]["placement"]
    for role in ("target", "draft"):
        p = placement[role]
        assert p["layers"] == 3 and p["offloaded"] == 0 and list(p["devices"]) == ["CPU"], p
        cpu = p["devices"]["CPU"]
        assert cpu["layers"] == 3 and cpu["model_bytes"] > 0 and cpu["compute_bytes"] > 0
        assert cpu["kv_bytes"] == 4096 * 256  # -c 4096 of 256 bytes (2 layers, 2 KV heads of 16, F16 K and V)


@pytest.mark.skipif(not NO_GPU, reason="a build without a GPU: the defaults must be llama.cpp's own")
def test_a_cpu_build_passes_llama_cpps_default_parameters(capsys, models, monkeypatch):
    seen = []
    load = native.L.llama_model_load_from_file

    def recording(path, params):
        seen.append(
            (params.devices, params.n_gpu_layers, params.split_mode, params.main_gpu, bool(params.tensor_split))
        )
        return load(path, params)

    monkeypatch.setattr(native.L, "llama_model_load_from_file", recording)
    args = ["--target", str(models["target"]), "--draft", str(models["draft"]), "--drafter", "model"]
    code, out, err = specdec(capsys, "generate", "hi", *args, "-n", "4", "--json")
    said = [line for line in err.splitlines() if not line.startswith("measuring this machine's costs")]
    assert code == 0 and said == [], err  # (-k auto measures the machine first, and says so: nothing else)
    assert len(seen) >= 2 and set(seen) == {(None, -1, 1, 0, False)}  # devices NULL, every layer, layer split
    placement = json.loads(out)["config"]["placement"]
    assert placement["target"]["offloaded"] == 0 and list(placement["target"]["devices"]) == ["CPU"]


@pytest.mark.skipif(not NO_GPU, reason="a build without a GPU")
def test_a_layer_count_without_a_gpu_warns_as_llama_cpp_does(capsys, models):
    code, _, err = specdec(capsys, "generate", "hi", "--target", str(models["target"]), "-n", "2", "-ngl", "99")
    assert code == 0
    assert err.splitlines()[0].startswith("warning: -ngl 99: this llama.cpp sees no GPU")


def test_llama_log_still_forwards_every_line(models, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "specdec_cli", "generate", "hi", "--target", str(models["target"]), "-n", "2", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "SPECDEC_LLAMA_LOG": "1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "load_tensors:" in r.stderr and "llama_kv_cache:" in r.stderr and "assigned to device" in r.stderr
    assert json.loads(r.stdout)["config"]["placement"]["target"]["devices"]["CPU"]["kv_bytes"] > 0


def test_models_info_says_where_the_layers_would_go(capsys, models):
    code, out, err = specdec(capsys, "models", "info", str(models["target"]), "--json")
    assert code == 0, err
    p = json.loads(out)["placement"]
    assert p["layers"] == 3 and p["devices"]["CPU"]["model_bytes"] > 0 and p["devices"]["CPU"]["kv_bytes"] == 0
    code, out, _ = specdec(capsys, "models", "info", str(models["target"]))
    if NO_GPU:
        assert "every layer on the CPU" in out


# --- a real GPU backend: Vulkan (lavapipe will do) -------------------------------------------------------
VULKAN = os.environ.get("SPECDEC_VULKAN_LIB")
vulkan = pytest.mark.skipif(not VULKAN, reason="set SPECDEC_VULKAN_LIB to a Vulkan build's lib folder")


def on_vulkan(tmp_path, *args: str, **extra) -> subprocess.CompletedProcess:
    """The CLI (or `-c CODE`) on the Vulkan build, its first device only, a cache of its own for each run."""
    home = tmp_path / f"home{len(list(tmp_path.glob('home*')))}"
    env = {
        **os.environ,
        "LLAMA_CPP_LIB_PATH": VULKAN,
        "LD_LIBRARY_PATH": VULKAN,
        "GGML_VK_VISIBLE_DEVICES": "0",
        "SPECDEC_HOME": str(home),
        "SPECDEC_COST_CURVES": str(home / "curves"),
        **extra,
    }
    command = [sys.executable, *(args if args[0] == "-c" else ("-m", "specdec_cli", *args))]
    return subprocess.run(command, capture_output=True, text=True, env=env)


def vulkan_run(tmp_path, models, *args: str) -> dict:
    run = ["generate", "alpha beta", "--target", str(models["target"]), "--draft", str(models["draft"])]
    r = on_vulkan(tmp_path, *run, "--temp", "0", "-n", "16", "--no-chat", "--json", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.vulkan
@vulkan
def test_vulkan_ngl_puts_that_many_layers_on_the_device(tmp_path, models):
    cpu = vulkan_run(tmp_path, models, "--drafter", "none", "-dev", "none")
    assert cpu["config"]["placement"]["target"]["offloaded"] == 0
    for ngl, offloaded in (("0", 0), ("2", 2), ("all", 3), ("auto", 3)):
        out = vulkan_run(tmp_path, models, "--drafter", "none", "-ngl", ngl)
        p = out["config"]["placement"]["target"]
        assert p["offloaded"] == offloaded and p["devices"]["CPU"]["layers"] == 3 - offloaded, (ngl, p)
        assert out["tokens"] == cpu["tokens"], ngl  # the same greedy text wherever the layers are
        if offloaded:
            gpu = p["devices"]["Vulkan0"]
            assert gpu["layers"] == offloaded and gpu["model_bytes"] > 0 and gpu["compute_bytes"] > 0
            assert gpu["kv_bytes"] == 4096 * 128 * (offloaded - 1)  # a repeating layer's cache goes with it


@pytest.mark.vulkan
@vulkan
def test_vulkan_devices_by_name_for_the_target_and_the_draft(tmp_path, models):
    out = vulkan_run(tmp_path, models, "--drafter", "model", "-dev", "Vulkan0", "-devd", "none")
    target, draft = out["config"]["placement"]["target"], out["config"]["placement"]["draft"]
    assert target["offloaded"] == 3 and target["devices"]["Vulkan0"]["kv_bytes"] == 4096 * 256
    assert draft["offloaded"] == 0 and list(draft["devices"]) == ["CPU"]
    out = vulkan_run(tmp_path, models, "--drafter", "model", "-dev", "none", "-ngld", "1")  # -devd follows -dev
    assert out["config"]["placement"]["draft"]["offloaded"] == 0


@pytest.mark.vulkan
@vulkan
@pytest.mark.parametrize(
    "args, message",
    [
        (["-dev", "Vulkan7"], "error: -dev/--device names no device of this machine: 'Vulkan7' (devices: Vulkan0 ("),
        (["-ts", "1,1"], "error: -ts/--tensor-split has 2 proportions, but the target has 1 device (Vulkan0)"),
        (["-mg", "1"], "error: -mg/--main-gpu 1 is out of range: the target has 1 device (Vulkan0)"),
        (["-sm", "row"], "error: -sm/--split-mode row: Vulkan0 cannot split a matrix's rows"),
    ],
)
def test_vulkan_refusals_are_one_line(tmp_path, models, args, message):
    r = on_vulkan(tmp_path, "generate", "hi", "--target", str(models["target"]), "-n", "2", *args)
    assert r.returncode == 2 and one_line_error(r.stderr).startswith(message), r.stderr[-2000:]


def write_big(path: Path, n_layer: int = 24, embd: int = 2048, ff: int = 8192) -> Path:
    """A llama model of 3 GiB of F16 weights (more than lavapipe's 2 GiB) in a sparse file: its header real, its
    data section a hole that reads as zeros. Nothing is written but the header."""
    from gguf import GGUFWriter
    from tiny_models import _add_byte_tokenizer, byte_vocab

    tokens = byte_vocab()
    w = GGUFWriter(str(path), "llama")
    for add, value in (
        (w.add_context_length, 4096),
        (w.add_embedding_length, embd),
        (w.add_block_count, n_layer),
        (w.add_feed_forward_length, ff),
        (w.add_head_count, 16),
        (w.add_head_count_kv, 16),
        (w.add_rope_dimension_count, embd // 16),
        (w.add_layer_norm_rms_eps, 1e-5),
        (w.add_file_type, 1),
    ):
        add(value)
    _add_byte_tokenizer(w, tokens, None)
    shapes = {"token_embd.weight": ((len(tokens), embd), np.float32), "output_norm.weight": ((embd,), np.float32)}
    shapes["output.weight"] = ((len(tokens), embd), np.float16)
    for i in range(n_layer):
        shapes |= {f"blk.{i}.{n}.weight": ((embd,), np.float32) for n in ("attn_norm", "ffn_norm")}
        shapes |= {
            f"blk.{i}.{n}.weight": ((embd, embd), np.float16) for n in ("attn_q", "attn_k", "attn_v", "attn_output")
        }
        shapes |= {f"blk.{i}.ffn_{n}.weight": ((ff, embd), np.float16) for n in ("gate", "up")}
        shapes[f"blk.{i}.ffn_down.weight"] = ((embd, ff), np.float16)
    for name, (shape, dtype) in shapes.items():
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file(path=str(path))
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    data = -(-path.stat().st_size // 32) * 32  # (GGUF's default alignment)
    os.truncate(path, data + sum(-(-t.nbytes // 32) * 32 for part in w.tensors for t in part.values()))
    return path


@pytest.mark.vulkan
@vulkan
def test_vulkan_a_model_too_big_for_the_device_is_one_line_with_the_ngl_that_fits(tmp_path):
    free = on_vulkan(
        tmp_path, "-c", "from specdec_cli.backend import devices; print(devices.by_name('Vulkan0').memory()[0])"
    )
    if int(free.stdout) > 3 << 30:
        pytest.skip("Vulkan0 holds the 3 GiB model (lavapipe says 2 GiB)")
    big = write_big(tmp_path / "big.gguf")
    r = on_vulkan(tmp_path, "generate", "hi", "--target", str(big), "-n", "2", "-ngl", "all")
    assert r.returncode == 2, r.stderr[-2000:]
    line = one_line_error(r.stderr)
    assert line.startswith("error: the target's 25 layers need ") and " on Vulkan0 (" in line and " free" in line
    hint = r.stderr.splitlines()[1]
    assert hint.startswith("hint: use -ngl ") and hint.endswith(" or less, or a smaller -c")
    n = int(hint.split()[3])
    assert 0 < n < 25
    r = on_vulkan(tmp_path, "generate", "hi", "--target", str(big), "-n", "2", "-ngl", str(n + 1))
    assert r.returncode == 2 and r.stderr.splitlines()[1] == hint


@pytest.mark.vulkan
@vulkan
def test_vulkan_models_info_and_the_log(tmp_path, models):
    r = on_vulkan(tmp_path, "models", "info", str(models["target"]))
    assert r.returncode == 0 and "3/3 layers on Vulkan0" in r.stdout, r.stderr[-2000:]
    r = on_vulkan(tmp_path, "generate", "hi", "--target", str(models["target"]), "-n", "2", SPECDEC_LLAMA_LOG="1")
    assert r.returncode == 0 and "load_tensors:      Vulkan0 model buffer size" in r.stderr
    assert Path(VULKAN, "libggml-vulkan.so").exists()
