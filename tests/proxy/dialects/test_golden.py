# SPDX-License-Identifier: Apache-2.0
"""Normalisation golden tests (issue 4): the requests captured from the six real CLIs normalise to committed output.

Inputs are the captures in `tests/data/cli_requests/<variant>.json`: every request of a real CLI run against the
proxy, secrets removed (the folder's README says how they were taken; `capture.py` re-takes them); the `<cli>_tool`
variants add each CLI's second main request, carrying its own wire form of a tool call and its result. Expected
outputs are committed next to them in
`tests/data/cli_requests/expected/<variant>.json`: for every model request of a capture, the record's `request`
(`model`, `messages`, `tools`, `tool_choice`, `response_format`, the caller's `sampling`) and the `stream`,
`include_usage` and `reasoning` flags. These tests only compare; they never write. After a deliberate change of the
normal form (or a re-capture), regenerate and review the diff by eye:

    .venv/bin/python -m tests.proxy.dialects.regen_golden [variant ...]

Besides the byte-for-byte comparison, the properties a correct normaliser must have are asserted on the goldens
themselves (so a wrong golden cannot be committed silently), and the first model request of each CLI is sent as
captured through the running proxy (FAKE upstream: only the recorded `request` is checked here) to show the
server records the same normal form.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.proxy.dialects.regen_golden import (
    CAPTURES,
    GOLDEN,
    REGEN,
    SIX_CLIS,
    captured_variants,
    dumps,
    model_requests,
    normal_forms,
)

VARIANTS = captured_variants()
SECRET_HEADERS = {"authorization": "Bearer {key}", "x-api-key": "{key}", "x-goog-api-key": "{key}"}


def _golden(variant: str) -> dict[str, Any]:
    path = GOLDEN / f"{variant}.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `{REGEN} {variant}` and review it")
    return json.loads(path.read_text())


def _first_difference(want: Any, got: Any, path: str = "$") -> str:
    if type(want) is not type(got):
        return f"{path}: expected {type(want).__name__}, got {type(got).__name__}"
    if isinstance(want, dict):
        for k in sorted(set(want) | set(got), key=str):
            if k not in got or k not in want:
                return f"{path}.{k}: {'missing' if k not in got else 'unexpected'}"
            if want[k] != got[k]:
                return _first_difference(want[k], got[k], f"{path}.{k}")
    if isinstance(want, list):
        if len(want) != len(got):
            return f"{path}: expected {len(want)} items, got {len(got)}"
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return f"{path}: expected {str(want)[:300]!r}, got {str(got)[:300]!r}"


def test_the_six_real_clis_are_captured_and_every_capture_has_a_golden() -> None:
    missing = [n for n in SIX_CLIS if n not in VARIANTS]
    assert not missing, f"captures missing: {missing} (tests/data/cli_requests/capture.py NAME)"
    goldens = sorted(p.stem for p in GOLDEN.glob("*.json"))
    assert goldens == VARIANTS, f"goldens and captures differ: run `{REGEN}`"


@pytest.mark.parametrize("variant", VARIANTS)
def test_captured_from_the_real_cli_against_the_proxy(variant: str) -> None:
    data = json.loads((CAPTURES / f"{variant}.json").read_text())
    assert data["exit_code"] == 0 and data.get("server", "").startswith("polar proxy"), "re-capture: capture.py"
    records = data["proxy_records"]
    assert len(records) == len(model_requests(variant))
    assert all(r["error"] is None and r["original_request_is_recorded_body"] for r in records)
    assert not re.search(r"polar-[A-Za-z0-9_-]{32}", json.dumps(data)), "the proxy session's key must be redacted"


@pytest.mark.parametrize("variant", VARIANTS)
def test_capture_normalises_to_the_committed_golden(variant: str) -> None:
    want = _golden(variant)
    got = json.loads(dumps(normal_forms(variant)))  # through JSON, as written (tuples → lists)
    assert got == want, f"{_first_difference(want, got)}\nif the change is intended: `{REGEN} {variant}`, review"


@pytest.mark.parametrize("variant", VARIANTS)
def test_goldens_have_the_properties_of_a_correct_normal_form(variant: str) -> None:
    """What review by eye checked, kept as assertions: an edited golden must still be a correct normal form."""
    golden = _golden(variant)
    capture = json.loads((CAPTURES / f"{variant}.json").read_text())
    assert golden["requests"] and golden["requests"][0]["index"] == capture["first_model_request"]
    for entry in golden["requests"]:
        req = entry["request"]
        text = json.dumps(req, ensure_ascii=False)
        assert "cache_control" not in text and "x-anthropic-billing-header" not in text and "cc_version=" not in text
        messages = req["messages"]
        # one leading system message at most: system blocks, developer messages and in-conversation system
        # messages are merged into it, in order
        assert [m["role"] for m in messages].count("system") <= 1
        assert all(m["role"] != "system" for m in messages[1:])
        assert all(m["role"] in ("system", "user", "assistant", "tool") for m in messages)
        assert messages[-1]["role"] in ("user", "tool")
        # these CLIs send text only: every part array collapses to one string
        assert all(isinstance(m["content"], str) for m in messages)
        for tool in req.get("tools", []):
            assert set(tool) == {"type", "function"} and tool["type"] == "function"
            fn = tool["function"]
            assert set(fn) <= {"name", "description", "parameters"} and fn["name"]
            assert fn["parameters"].get("type") == "object", fn["name"]  # JSON schema, lower-case types
        names = [t["function"]["name"] for t in req.get("tools", [])]
        assert len(names) == len(set(names))
        schema = (req.get("response_format") or {}).get("json_schema", {}).get("schema")
        if schema is not None:
            assert schema["type"] == "object" and "OBJECT" not in json.dumps(schema)


def _system_texts(variant: str) -> list[str]:
    """The system-prompt texts of the first model request, as the CLI sent them (billing header excluded)."""
    _, req, _ = model_requests(variant)[0]
    body = req["body"]
    if "system" in body:  # Anthropic: blocks, plus Claude Code's system messages inside `messages`
        blocks = body["system"] if isinstance(body["system"], list) else [{"text": body["system"]}]
        texts = [b["text"] for b in blocks if not b["text"].startswith("x-anthropic-billing-header")]
        return texts + [m["content"] for m in body["messages"] if m["role"] == "system"]
    if "input" in body:  # Responses: developer messages
        return [p["text"] for it in body["input"] if it.get("role") == "developer" for p in it["content"]]
    if "systemInstruction" in body:
        return [p["text"] for p in body["systemInstruction"]["parts"]]
    return [m["content"] for m in body["messages"] if m["role"] in ("system", "developer")]


@pytest.mark.parametrize("variant", SIX_CLIS)
def test_system_prompt_placement_of_each_cli(variant: str) -> None:
    """Every system text the CLI sent is in the leading system message, in the order sent, and nowhere else."""
    system = _golden(variant)["requests"][0]["request"]["messages"][0]
    assert system["role"] == "system"
    pos = 0
    for text in _system_texts(variant):
        found = system["content"].find(text.strip(), pos)
        assert found >= 0, text[:200]
        pos = found + len(text.strip())


# -- the same through the running proxy ------------------------------------------------------------------------


def _post(url: str, body: Any, headers: dict[str, str]) -> tuple[int, bytes]:
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("variant", SIX_CLIS)
def test_first_request_through_the_proxy_records_the_golden(variant: str, fake_upstream: Any, make_proxy: Any) -> None:
    h = make_proxy([fake_upstream().base_url])
    s = h.session()
    entry = _golden(variant)["requests"][0]
    captured = json.loads((CAPTURES / f"{variant}.json").read_text())["requests"][entry["index"]]
    headers = {
        k: (SECRET_HEADERS[k].format(key=s.api_key) if k in SECRET_HEADERS else v)
        for k, v in captured["headers"].items()
        if k not in ("host", "content-length", "connection", "accept-encoding", "transfer-encoding")
    }
    query = "&".join(f"{k}={v}" for k, v in captured["query"].items())
    status, _ = _post(f"{h.base_url}{captured['path']}{'?' + query if query else ''}", captured["body"], headers)
    assert status == 200
    (rec,) = h.records(s.session_id)
    assert rec.error is None and rec.dialect == entry["dialect"]
    assert rec.original_request == captured["body"]
    assert rec.request["messages"] == entry["request"]["messages"]
    assert rec.request.get("tools", []) == entry["request"].get("tools", [])
    assert rec.request.get("response_format") == entry["request"].get("response_format")
