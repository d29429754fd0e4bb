# SPDX-License-Identifier: Apache-2.0
"""The embedded inference backend: real vLLM on this CPU, serving `smollm2` and `tiny-qwen3` (docs/backend.md).

`prepare()` builds a separate vllm venv and the model folders under the cache (`POLAR_CACHE_DIR`, else
`~/.cache/nemo-polar`); `LocalVLLM` serves one model on loopback for the life of a `with` block. The project
talks to the server over HTTP only, exactly as it would to NeMo RL's vLLM in production; nothing here imports
vllm. Facts and measurements: docs/backend.md.
"""

from nemo_polar.backend.build import PrepareError, is_prepared, prepare
from nemo_polar.backend.config import MODEL_NAMES, MODELS, ModelSpec, cache_dir, model_dir
from nemo_polar.backend.server import (
    NOT_PREPARED,
    BackendError,
    BackendNotPrepared,
    LocalVLLM,
    ServerInfo,
    launch_detached,
    list_servers,
    stop_servers,
)

__all__ = [
    "MODELS",
    "MODEL_NAMES",
    "NOT_PREPARED",
    "BackendError",
    "BackendNotPrepared",
    "LocalVLLM",
    "ModelSpec",
    "PrepareError",
    "ServerInfo",
    "cache_dir",
    "is_prepared",
    "launch_detached",
    "list_servers",
    "model_dir",
    "prepare",
    "stop_servers",
]
