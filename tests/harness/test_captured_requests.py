# SPDX-License-Identifier: Apache-2.0
"""The captured first requests of the real CLIs (tests/data/cli_requests): well-formed, secret-free, and
classified as expected when the proxy's own dialect parser normalises them and the adapter classifies them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nemo_polar.harness_adapters import get_adapter

from nemo_polar.types import CallKind

DATA = Path(__file__).resolve().parents[1] / "data" / "cli_requests"
# variant -> expected call kinds of its model requests, in arrival order
EXPECTED = {
    "claude_code": ["main"],
    "codex": ["main"],
    "gemini_cli": ["main"],
    "gemini_cli_router": ["side", "main"],  # the model router's JSON call comes before the turn
    "qwen_code": ["main", "side"],  # managed memory extraction after the turn
    "opencode": ["side", "main"],  # the title generator runs first
    "pi": ["main"],
    "mini_swe_agent": ["main", "main", "main"],  # the fake model answers without a tool call: format retries
    # a forced shell tool call, then a forced text answer (the second main request carries the call and its result)
    "claude_code_tool": ["main", "main"],
    "codex_tool": ["main", "main"],
    "gemini_cli_tool": ["main", "main"],
    "qwen_code_tool": ["main", "main"],
    "opencode_tool": ["side", "main", "main"],
    "pi_tool": ["main", "main"],
}
SECRET_MARKERS = ("sk-polar-capture", "KEY-0123456789")


def _load(variant: str) -> dict[str, Any]:
    path = DATA / f"{variant}.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: run tests/data/cli_requests/capture.py {variant}")
    return json.loads(path.read_text())


@pytest.mark.parametrize("variant", list(EXPECTED))
def test_capture_is_complete_and_secret_free(variant: str) -> None:
    data = _load(variant)
    adapter = get_adapter(data["harness"])
    assert data["version"] == adapter.version, "re-capture after changing a pinned version"
    assert data["exit_code"] == 0
    assert data["first_model_request"] is not None
    text = json.dumps(data)
    assert not any(m in text for m in SECRET_MARKERS)
    for req in data["requests"]:
        for name in ("authorization", "x-api-key", "x-goog-api-key"):
            assert req["headers"].get(name, "<redacted>") == "<redacted>"
    assert "polar-capture-" not in json.dumps(data["requests"]), "temporary paths must be replaced"
    assert str(Path.home()) + "/" not in text, "machine paths must be replaced"


@pytest.mark.parametrize("variant", list(EXPECTED))
def test_captured_requests_are_classified_as_expected(variant: str) -> None:
    dialects = pytest.importorskip("nemo_polar.proxy.dialects", reason="the proxy's dialects are not installed")
    data = _load(variant)
    adapter = get_adapter(data["harness"])
    kinds = []
    for req in data["requests"]:
        query = "&".join(f"{k}={v}" for k, v in req["query"].items())
        hit = dialects.detect(req["method"], req["path"] + (f"?{query}" if query else ""), req["headers"])
        if hit is None:
            continue
        module, route = hit
        normalized = module.parse_request(req["body"], route).normalized_dict()
        kinds.append(adapter.classify_request(normalized, req["body"]))
        assert adapter.classify_request(normalized) in (kinds[-1], CallKind.MAIN)  # without the original body
    assert kinds == EXPECTED[variant]
