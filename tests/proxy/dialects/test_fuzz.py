# SPDX-License-Identifier: Apache-2.0
"""Hypothesis fuzzing of the four request parsers: no input makes anything but a 4xx ProviderError escape.

Three strategies: arbitrary bytes; arbitrary JSON documents; and mutations of a valid request from the cross-dialect
conversation (one subtree replaced by arbitrary JSON, or deleted), which reaches deep into each parser.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_polar.proxy.normalized import ChatRequest, ProviderError

from .test_cross_dialect import CASES

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = st.sampled_from(
    ["type", "role", "content", "text", "parts", "name", "input", "id", "call_id", "tools", "model", "x"]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["user", "assistant", "model", "tool", "text", "function", "tool_use", "message", "OBJECT"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS | st.text(max_size=6), inner, max_size=5),
    max_leaves=25,
)
NAMES = sorted(CASES)


def parse_or_4xx(name: str, body: Any) -> None:
    module, _, route = CASES[name]
    try:
        req = module.parse_request(body, route)
    except ProviderError as err:
        assert 400 <= err.status < 500
        status, shaped, _ = module.render_error(err)
        assert status == err.status and isinstance(shaped, dict)
        return
    assert isinstance(req, ChatRequest)
    json.dumps(req.normalized_dict())  # what is recorded must be JSON-serialisable


@SETTINGS
@given(name=st.sampled_from(NAMES), body=st.binary(max_size=200))
def test_arbitrary_bytes(name: str, body: bytes) -> None:
    parse_or_4xx(name, body)


@SETTINGS
@given(name=st.sampled_from(NAMES), doc=JSON)
def test_arbitrary_json(name: str, doc: Any) -> None:
    parse_or_4xx(name, json.dumps(doc).encode())
    if isinstance(doc, dict):
        parse_or_4xx(name, doc)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(NAMES))
def test_mutated_valid_requests(data: st.DataObject, name: str) -> None:
    body = copy.deepcopy(CASES[name][1])
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = [p for p in _paths(body) if p]
        path = data.draw(st.sampled_from(paths))
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()):
            parent[path[-1]] = data.draw(JSON)
        elif isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
    parse_or_4xx(name, json.dumps(body).encode())


def test_deeply_nested_schemas_are_a_400_not_a_crash() -> None:
    deep: Any = {"type": "STRING"}
    for _ in range(3000):
        deep = {"type": "OBJECT", "properties": {"a": deep}}
    body = {
        "contents": [{"parts": [{"text": "x"}]}],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": deep}]}],
    }
    parse_or_4xx("google_genai", body)
    args: Any = {}
    for _ in range(3000):
        args = {"a": args}
    anth = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": args}]}],
    }
    parse_or_4xx("anthropic_messages", anth)


def _captured() -> list[tuple[Any, Any, Any]]:
    from pathlib import Path

    from nemo_polar.proxy.dialects import detect

    out = []
    for path in sorted((Path(__file__).resolve().parents[2] / "data" / "cli_requests").glob("*.json")):
        for req in json.loads(path.read_text())["requests"]:
            query = "&".join(f"{k}={v}" for k, v in req["query"].items())
            hit = detect(req["method"], req["path"] + (f"?{query}" if query else ""))
            if hit is not None:
                body = json.loads(req["body"]) if isinstance(req["body"], str) else req["body"]
                out.append((hit[0], body, hit[1]))
    return out


CAPTURED = _captured()


@pytest.mark.skipif(not CAPTURED, reason="tests/data/cli_requests holds no captured CLI requests in this checkout")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_real_client_requests(data: st.DataObject) -> None:
    """The same mutation fuzzing over the requests captured from the real CLIs (when this checkout has them)."""
    module, original, route = data.draw(st.sampled_from(CAPTURED))
    body = copy.deepcopy(original)
    paths = [p for p in _paths(body) if p]
    path = data.draw(st.sampled_from(paths))
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()):
        parent[path[-1]] = data.draw(JSON)
    elif isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])
    try:
        req = module.parse_request(json.dumps(body).encode(), route)
    except ProviderError as err:
        assert 400 <= err.status < 500
        return
    assert isinstance(req, ChatRequest)
