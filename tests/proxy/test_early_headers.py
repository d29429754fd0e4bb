# SPDX-License-Identifier: Apache-2.0
"""Early stream headers (`ProxyConfig.stream_headers_after_s`, `polar proxy --stream-headers-after-s`).

A long prompt on a busy engine can take minutes to its first token, and Gemini CLI's fetch gives up on a response
whose headers have not come in 60 s (then retries, and the abandoned call's plan step is spent). The proxy sends a
slow stream's status line and headers alone; these tests stand in for the harness's headers deadline with a socket
timeout on `getresponse()`, in front of the FAKE upstream (polar_lab.fake_upstream) whose first byte is delayed.
"""

from __future__ import annotations

import http.client
import json
import socket
import time

import openai
import pytest

from nemo_polar.proxy.cli import _headers_after

GOOGLE_STREAM = "/v1beta/models/g:streamGenerateContent?alt=sse"
CONTENTS = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
PLAN = {"version": 1, "steps": [{"text": "FIRST"}, {"text": "SECOND"}]}


def _post(port: int, key: str, *, headers_deadline_s: float) -> tuple[http.client.HTTPResponse, int]:
    """A Gemini-shaped stream request; the status comes back only if the headers arrive within the deadline."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=headers_deadline_s)
    conn.request(
        "POST",
        GOOGLE_STREAM,
        body=json.dumps(CONTENTS),
        headers={"x-goog-api-key": key, "Content-Type": "application/json"},
    )
    resp = conn.getresponse()  # raises socket.timeout past the deadline, as the harness's fetch gives up
    assert conn.sock is not None
    conn.sock.settimeout(60)
    return resp, resp.status


def _wait_records(h, session_id: str, n: int) -> list:
    deadline = time.time() + 20
    while time.time() < deadline:
        recs = h.records(session_id)
        if len(recs) >= n and all(r.error is not None or r.generation_token_ids for r in recs):
            return recs
        time.sleep(0.05)
    return h.records(session_id)


def test_a_slow_first_token_still_gets_its_headers_in_time(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=1.2)
    late = make_proxy([fake.base_url], stream_headers_after_s=None)
    with pytest.raises(socket.timeout):  # headers only with the first token: the harness's deadline passes
        _post(late.port, late.session().api_key, headers_deadline_s=0.8)
    early = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = early.session()
    resp, status = _post(early.port, s.api_key, headers_deadline_s=0.8)
    assert status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    body = resp.read().decode()  # after the early headers: keep-alive newlines, then Google's SSE chunks, nothing else
    chunks = [json.loads(line[len("data: ") :]) for line in body.split("\n") if line.startswith("data: ")]
    assert body.lstrip("\n").startswith("data: ") and chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    text = "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"])
    assert text.split() == [f"w{i}" for i in range(fake.behaviour.n_gen)]
    (rec,) = _wait_records(early, s.session_id, 1)
    assert rec.error is None and len(rec.generation_token_ids) == fake.behaviour.n_gen


def test_a_failure_after_early_headers_drops_the_stream_and_keeps_the_plan_step(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=0.5, fail_status=503)
    h = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = h.session(plan=PLAN)
    oa = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    with pytest.raises(openai.APIConnectionError):  # headers were 200; the cut stream is a network error, retryable
        for _ in oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True):
            pass
    (failed,) = _wait_records(h, s.session_id, 1)
    assert failed.error is not None and failed.error["type"] == "upstream" and failed.generation_token_ids == []
    fake.behaviour.fail_status = None
    fake.behaviour.delay_s = 0.0
    answer = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "FIRST"  # the client's retry gets the step it never saw


def test_a_client_leaving_after_early_headers_is_a_failure_and_keeps_the_plan_step(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=0.8)
    h = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = h.session(plan=PLAN)
    resp, status = _post(h.port, s.api_key, headers_deadline_s=0.6)
    assert status == 200
    resp.close()  # the harness gives up before the first token
    (rec,) = _wait_records(h, s.session_id, 1)
    assert rec.error is not None and rec.error["type"] == "client_disconnected"
    fake.behaviour.delay_s = 0.0
    oa = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    answer = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "FIRST"


def test_fast_failures_stay_http_errors_in_the_callers_shape(fake_upstream, make_proxy):
    fake = fake_upstream(fail_status=503)
    h = make_proxy([fake.base_url], stream_headers_after_s=5.0)
    s = h.session()
    oa = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        for _ in oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True):
            pass
    assert e.value.status_code == 503


def test_the_cli_flag_reads_seconds_or_never():
    import argparse

    assert _headers_after("12.5") == 12.5 and _headers_after("never") is None
    for bad in ("0", "-1", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            _headers_after(bad)
