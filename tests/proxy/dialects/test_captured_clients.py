# SPDX-License-Identifier: Apache-2.0
"""Every model request captured from the real CLIs (tests/data/cli_requests, recorded by the harness work through a
loopback capture fake) parses, and the wire details docs/harnesses.md lists come out normalised as designed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.proxy.dialects import detect
from nemo_polar.proxy.normalized import ChatRequest

DATA = Path(__file__).resolve().parents[2] / "data" / "cli_requests"
FILES = sorted(DATA.glob("*.json")) if DATA.is_dir() else []


def parsed(variant: str) -> list[tuple[dict[str, Any], ChatRequest]]:
    path = DATA / f"{variant}.json"
    if not path.exists():
        pytest.skip(f"{path} not captured in this checkout")
    out = []
    for req in json.loads(path.read_text())["requests"]:
        query = "&".join(f"{k}={v}" for k, v in req["query"].items())
        hit = detect(req["method"], req["path"] + (f"?{query}" if query else ""), req["headers"])
        if hit is None:
            assert (req["method"], req["path"]) == ("HEAD", "/")  # the only non-model call clients make
            continue
        module, route = hit
        body = req["body"]
        out.append((req, module.parse_request(body.encode() if isinstance(body, str) else body, route)))
    return out


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_captured_request_parses(path: Path) -> None:
    reqs = parsed(path.stem)
    assert reqs
    for _, req in reqs:
        text = json.dumps(req.normalized_dict())
        assert "cache_control" not in text
        assert req.messages[0]["role"] in ("system", "user")
        assert sum(m["role"] == "system" for m in req.messages) <= 1


def test_claude_code() -> None:
    ((_, req),) = parsed("claude_code")
    assert req.extra["billing_header_removed"] is True
    text = json.dumps(req.normalized_dict())
    assert "x-anthropic-billing-header" not in text and "cc_version" not in text
    system = req.messages[0]["content"]
    assert "Available agent types for the Agent tool" in system  # the `system` message inside `messages`
    assert system.index("You are a Claude agent") < system.index("Available agent types")
    assert req.reasoning is True and req.stream and req.sampling.max_tokens == 32000
    assert "Bash" in [t["function"]["name"] for t in req.tools]


def test_codex() -> None:
    ((_, req),) = parsed("codex")
    assert req.extra["dropped_tools"] == ["web_search"]
    names = [t["function"]["name"] for t in req.tools]
    assert "exec_command" in names
    for flat, entry in req.extra.get("tool_map", {}).items():
        assert flat in names and flat.endswith(entry["name"])
    assert req.messages[0]["role"] == "system" and req.messages[-1]["role"] == "user"


def test_gemini_cli_router_side_call_asks_for_json() -> None:
    reqs = parsed("gemini_cli_router")
    router = [r for _, r in reqs if r.response_format is not None]
    assert router and router[0].response_format["type"] == "json_schema"
    assert not router[0].stream
    assert [r.stream for _, r in reqs] == [False, True]


def test_qwen_code_part_arrays_collapse() -> None:
    for req_raw, req in parsed("qwen_code"):
        raw_msgs = json.loads(req_raw["body"]) if isinstance(req_raw["body"], str) else req_raw["body"]
        assert any(isinstance(m.get("content"), list) for m in raw_msgs["messages"])
        assert all(isinstance(m["content"], str) for m in req.messages)
        assert req.include_usage
