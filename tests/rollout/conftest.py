# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the rollout tests: `upstream`, the model server behind the gateway's hosted proxy — the proxy's FAKE
upstream (`fake`, named as a fake: it checks wiring, never what a model produced) or real vLLM-CPU `tiny-qwen3`
(`vllm`, fixture `vllm_qwen3`; skipped with the backend's reason until it is prepared).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from nemo_polar.runtime.sandbox import bwrap_available


@pytest.fixture(params=["fake", "vllm"])
def upstream(request: pytest.FixtureRequest) -> dict[str, Any]:
    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed (make test installs Debian `bubblewrap`)")
    if request.param == "fake":
        return {"kind": "fake", "model": "tiny-qwen3"}
    if importlib.util.find_spec("tests.fixtures_backend") is None:
        pytest.skip("the vLLM-CPU backend fixtures have not landed")
    backend = request.getfixturevalue("vllm_qwen3")
    return {
        "kind": "vllm",
        "url": backend.base_url,
        "model": backend.model,
        "model_dir": str(backend.model_dir),
        "eot": list(backend.eot_token_ids),
    }
