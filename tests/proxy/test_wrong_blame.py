# SPDX-License-Identifier: Apache-2.0
"""Upstream failures on a valid request are the server's fault: a retryable 5xx in the caller's provider shape, and a
failure record; broken token data from the engine is a failure, never stored as training data (issue 22 item 3).

The upstream is the FAKE vLLM server (`polar_lab.fake_upstream`) on loopback, told to fail the way vLLM does when its
answer holds NaN logprobs (400 "Out of range float values are not JSON compliant") or to answer with a null logprob
or a negative token id: failures a real model cannot be made to produce on demand.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

VLLM_NAN = "Out of range float values are not JSON compliant"
MSG = [{"role": "user", "content": "hi"}]

# dialect → (path, body, streamed path, streamed body, the streamed reply's terminal marker)
CASES: dict[str, tuple[str, dict[str, Any], str, dict[str, Any], bytes]] = {
    "openai_chat": (
        "/v1/chat/completions",
        {"model": "m", "messages": MSG},
        "/v1/chat/completions",
        {"model": "m", "messages": MSG, "stream": True},
        b"[DONE]",
    ),
    "anthropic_messages": (
        "/v1/messages",
        {"model": "m", "max_tokens": 16, "messages": MSG},
        "/v1/messages",
        {"model": "m", "max_tokens": 16, "messages": MSG, "stream": True},
        b"message_stop",
    ),
    "openai_responses": (
        "/v1/responses",
        {"model": "m", "input": "hi"},
        "/v1/responses",
        {"model": "m", "input": "hi", "stream": True},
        b"response.completed",
    ),
    "google_genai": (
        "/v1beta/models/m:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        "/v1beta/models/m:streamGenerateContent?alt=sse",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        b"finishReason",
    ),
}


def _post(url: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes, bool]:
    """(status, headers, body, complete): `complete` is False when the server dropped the connection mid-reply."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            try:
                return resp.status, dict(resp.headers), resp.read(), True
            except http.client.IncompleteRead as exc:
                return resp.status, dict(resp.headers), exc.partial, False
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read(), True


def _error_shape(dialect: str, body: bytes) -> str:
    """The error type the provider's own clients read, from a body in that provider's shape."""
    data = json.loads(body)
    if dialect == "anthropic_messages":
        assert data["type"] == "error"
        return str(data["error"]["type"])
    if dialect == "google_genai":
        assert data["error"]["code"] >= 500
        return str(data["error"]["status"])
    return str(data["error"]["type"])


@pytest.mark.parametrize("dialect", list(CASES))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_upstream_400_on_a_valid_request_is_a_retryable_5xx(
    fake_upstream: Any, make_proxy: Any, dialect: str, stream: bool
) -> None:
    fake = fake_upstream(fail_status=400, fail_message=VLLM_NAN)
    h = make_proxy([fake.base_url], served_model="m")
    s = h.session()
    path, body, spath, sbody, _ = CASES[dialect]
    status, headers, raw, _ = _post(h.base_url + (spath if stream else path), s.api_key, sbody if stream else body)
    assert status in (502, 503), raw
    assert {k.lower() for k in headers} >= {"retry-after"}
    assert _error_shape(dialect, raw) in {"api_error", "server_error", "INTERNAL", "UNAVAILABLE", "overloaded_error"}
    (rec,) = h.records(s.session_id)
    assert rec.error is not None and rec.error["type"] == "upstream"
    assert rec.error["upstream_status"] == 400 and VLLM_NAN in rec.error["message"]
    assert rec.prompt_token_ids == rec.generation_token_ids == rec.generation_log_probs == []


@pytest.mark.parametrize("corrupt", ["null_logprob", "negative_id"])
@pytest.mark.parametrize("dialect", list(CASES))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_broken_token_data_from_the_engine_is_a_recorded_upstream_failure(
    fake_upstream: Any, make_proxy: Any, dialect: str, stream: bool, corrupt: str
) -> None:
    fake = fake_upstream(corrupt=corrupt, n_gen=8)
    h = make_proxy([fake.base_url], served_model="m")
    s = h.session()
    path, body, spath, sbody, terminal = CASES[dialect]
    status, headers, raw, complete = _post(
        h.base_url + (spath if stream else path), s.api_key, sbody if stream else body
    )
    if stream and status == 200:
        # the stream had started: the client must not see a clean end of an answer the engine broke
        assert not complete or terminal not in raw
    else:
        assert status == 502, raw
        assert {k.lower() for k in headers} >= {"retry-after"}
        assert _error_shape(dialect, raw) in {"api_error", "server_error", "INTERNAL"}
    (rec,) = h.records(s.session_id)
    assert rec.error is not None and rec.error["type"] == "upstream", rec.error
    assert "the engine returned" in rec.error["message"]
    assert rec.prompt_token_ids == rec.generation_token_ids == rec.generation_log_probs == []
