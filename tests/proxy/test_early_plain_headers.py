# SPDX-License-Identifier: Apache-2.0
"""Early headers for Google's plain `generateContent` (`streaming.reply_plain`, `EARLY_PLAIN_HEADERS`).

Gemini CLI's fetch gives up on any response whose headers take 60 s, its non-streamed side calls too (the routing
classifier, the next-speaker and loop checks). A slow plain Google call gets its status line and headers alone, then
its JSON body once the record is committed; the other dialects' plain calls keep their headers until the answer. The
harness's headers deadline is a socket timeout on `getresponse()`, in front of the FAKE upstream (polar_lab.
fake_upstream) whose answer is delayed. The first, third and fourth tests fail without the early headers; the other
two guard what must not change (a fast call's plain response and HTTP errors; the other dialects' plain calls).
"""

from __future__ import annotations

import http.client
import json
import socket
import time

import openai
import pytest

from .test_early_headers import _wait_records as _records

GOOGLE_PLAIN = "/v1beta/models/g:generateContent"
CONTENTS = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
PLAN = {"version": 1, "steps": [{"text": "FIRST"}, {"text": "SECOND"}]}


def _post(port: int, key: str, *, headers_deadline_s: float, path: str = GOOGLE_PLAIN, body: object = CONTENTS):
    """A plain request; the response comes back only if its headers arrive within the deadline."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=headers_deadline_s)
    conn.request(
        "POST", path, body=json.dumps(body), headers={"x-goog-api-key": key, "Authorization": f"Bearer {key}"}
    )
    resp = conn.getresponse()  # raises socket.timeout past the deadline, as the harness's fetch gives up
    assert conn.sock is not None
    conn.sock.settimeout(60)
    return resp


def _text(answer: dict) -> str:
    return "".join(p.get("text", "") for p in answer["candidates"][0]["content"]["parts"])


def test_a_slow_google_plain_call_gets_its_headers_then_its_json(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=1.2)
    late = make_proxy([fake.base_url], stream_headers_after_s=None)
    with pytest.raises(socket.timeout):  # headers only with the answer: the harness's deadline passes
        _post(late.port, late.session().api_key, headers_deadline_s=0.8)
    early = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = early.session()
    resp = _post(early.port, s.api_key, headers_deadline_s=0.8)
    assert resp.status == 200 and resp.getheader("Content-Type", "").startswith("application/json")
    answer = json.loads(resp.read())  # the body is the usual answer, nothing before it
    assert answer["candidates"][0]["finishReason"] == "STOP"
    assert _text(answer).split() == [f"w{i}" for i in range(fake.behaviour.n_gen)]
    (rec,) = _records(early, s.session_id, 1)
    assert rec.error is None and len(rec.generation_token_ids) == fake.behaviour.n_gen


def test_a_fast_google_plain_call_is_answered_as_before(fake_upstream, make_proxy):
    fake = fake_upstream()
    h = make_proxy([fake.base_url], stream_headers_after_s=5.0)
    resp = _post(h.port, h.session().api_key, headers_deadline_s=5.0)
    assert resp.status == 200 and resp.getheader("Content-Length") is not None  # one plain response, not chunked
    assert _text(json.loads(resp.read())).split()[0] == "w0"
    fake.behaviour.fail_status = 503  # a fast failure stays an HTTP error in Google's shape
    resp = _post(h.port, h.session().api_key, headers_deadline_s=5.0)
    assert resp.status == 503 and json.loads(resp.read())["error"]["code"] == 503


def test_a_failure_after_early_plain_headers_drops_the_body_and_keeps_the_plan_step(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=0.5, fail_status=503)
    h = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = h.session(plan=PLAN)
    resp = _post(h.port, s.api_key, headers_deadline_s=0.4)
    assert resp.status == 200
    with pytest.raises(http.client.IncompleteRead):  # headers were 200; the body breaks, a network error
        resp.read()
    (failed,) = _records(h, s.session_id, 1)
    assert failed.error is not None and failed.error["type"] == "upstream" and failed.generation_token_ids == []
    fake.behaviour.fail_status = None
    fake.behaviour.delay_s = 0.0
    retry = _post(h.port, s.api_key, headers_deadline_s=5.0)
    assert _text(json.loads(retry.read())) == "FIRST"  # the client's retry gets the step it never saw


def test_a_client_leaving_after_early_plain_headers_stops_the_call_and_keeps_the_plan_step(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=4.0)
    h = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = h.session(plan=PLAN)
    resp = _post(h.port, s.api_key, headers_deadline_s=0.6)
    assert resp.status == 200
    resp.close()  # the harness gives up before the answer
    (rec,) = _records(h, s.session_id, 1)
    assert rec.error is not None and rec.error["type"] == "client_disconnected"
    deadline = time.time() + 3
    while fake.abandoned < 1 and time.time() < deadline:
        time.sleep(0.02)
    assert fake.abandoned == 1  # the upstream call was closed: the engine stops working on it
    fake.behaviour.delay_s = 0.0
    retry = _post(h.port, s.api_key, headers_deadline_s=5.0)
    assert _text(json.loads(retry.read())) == "FIRST"


def test_other_dialects_plain_calls_keep_their_headers_until_the_answer(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=1.2)
    h = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = h.session()
    with pytest.raises(socket.timeout):
        _post(
            h.port,
            s.api_key,
            headers_deadline_s=0.8,
            path="/v1/chat/completions",
            body={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
    fake.behaviour.delay_s = 0.5
    fake.behaviour.fail_status = 503  # so a slow failure there is still a 5xx the SDK retries
    oa = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 503
