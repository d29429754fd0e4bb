# SPDX-License-Identifier: Apache-2.0
"""Early headers for a call held by a paused admission (a weight update; `Proxy._generate`'s `admit`).

A weight update pauses admission, and a call that arrives meanwhile waits for the resume (up to `pause_wait_s`). Gemini
CLI's fetch gives up on any response whose headers take 60 s, so the wait runs inside the reply, under the early
headers' timer (`stream_headers_after_s`): a held stream, or a held Google plain call, gets its status line and headers
while still paused, then its answer after the resume, answered by the new weights. Here the harness's deadline is a
socket timeout on `getresponse()`. The first three tests (four cases) fail when the wait is outside the reply (the
headers then wait for the resume); the last guards what must not change (a pause outlasting `pause_wait_s` before any
header is still a 503 in the caller's shape).
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import openai
import pytest

from .test_early_headers import _wait_records as _records
from .test_early_plain_headers import CONTENTS, PLAN, _post

GOOGLE_STREAM = "/v1beta/models/g:streamGenerateContent?alt=sse"
GOOGLE_PLAIN = "/v1beta/models/g:generateContent"


def _google_text(body: bytes, stream: bool) -> str:
    if not stream:
        return "".join(p.get("text", "") for p in json.loads(body)["candidates"][0]["content"]["parts"])
    text = []
    for line in body.decode().splitlines():
        if line.startswith("data: "):
            for cand in json.loads(line[6:]).get("candidates", []):
                text += [p.get("text", "") for p in cand.get("content", {}).get("parts", [])]
    return "".join(text)


def _until(check, timeout_s: float = 3.0) -> bool:
    deadline = time.time() + timeout_s
    while not check() and time.time() < deadline:
        time.sleep(0.02)
    return bool(check())


def _held(fake_upstream, make_proxy, path: str, *, pause_wait_s: float, headers_deadline_s: float):
    """A proxy (headers after 0.1 s) paused for a weight update, and a Google call to it that got its headers."""
    fake = fake_upstream()
    h = make_proxy([fake.base_url], stream_headers_after_s=0.1, pause_wait_s=pause_wait_s)
    s = h.session(plan=PLAN)
    assert h.admin("POST", "/admin/policy_version", {"policy_version": 3})[0] == 200
    status, out = h.admin("POST", "/admin/pause", {"timeout_s": 1})
    assert status == 200 and out["drained"] is True
    resp = _post(h.port, s.api_key, headers_deadline_s=headers_deadline_s, path=path)
    assert resp.status == 200  # headers while still paused
    return fake, h, s, resp


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_a_call_held_by_a_pause_gets_its_headers_then_the_new_weights_answer(fake_upstream, make_proxy, stream):
    path = GOOGLE_STREAM if stream else GOOGLE_PLAIN
    fake, h, s, resp = _held(fake_upstream, make_proxy, path, pause_wait_s=30.0, headers_deadline_s=0.8)
    assert not [r for r in fake.requests if "messages" in r]  # the call has not reached the engine
    assert h.proxy._in_flight == 0  # held, not in flight: the weight update is not waiting for it
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(resp.read()))
    reader.start()
    time.sleep(0.3)
    assert not got  # nothing of the answer before the resume
    assert h.admin("POST", "/admin/policy_version", {"policy_version": 4})[0] == 200
    assert h.admin("POST", "/admin/resume")[1]["paused"] is False
    reader.join(10)
    assert got and _google_text(got[0], stream) == "FIRST"
    (rec,) = _records(h, s.session_id, 1)
    assert rec.error is None and rec.policy_version == 4  # answered by the weights after the update
    assert _until(lambda: h.proxy._in_flight == 0)  # left once its handler returned


def test_a_pause_outlasting_the_wait_after_early_headers_drops_the_connection_and_keeps_the_plan_step(
    fake_upstream, make_proxy
):
    fake, h, s, resp = _held(fake_upstream, make_proxy, GOOGLE_STREAM, pause_wait_s=0.6, headers_deadline_s=0.4)
    with pytest.raises(http.client.IncompleteRead):  # no clean end of an answer that never came
        resp.read()
    (failed,) = _records(h, s.session_id, 1)
    assert failed.error is not None and failed.error.get("kind") == "overloaded"
    assert not [r for r in fake.requests if "messages" in r] and h.proxy._in_flight == 0
    assert h.admin("POST", "/admin/resume")[0] == 200
    retry = _post(h.port, s.api_key, headers_deadline_s=5.0, path=GOOGLE_STREAM)
    assert _google_text(retry.read(), True) == "FIRST"  # the client's retry gets the step it never saw


def test_a_client_leaving_a_held_call_after_its_headers_keeps_the_plan_step(fake_upstream, make_proxy):
    fake, h, s, resp = _held(fake_upstream, make_proxy, GOOGLE_PLAIN, pause_wait_s=30.0, headers_deadline_s=0.8)
    resp.close()  # the harness gives up while the weights are updated
    (rec,) = _records(h, s.session_id, 1)
    assert rec.error is not None and rec.error["type"] == "client_disconnected"
    assert h.admin("POST", "/admin/resume")[0] == 200
    assert not [r for r in fake.requests if "messages" in r]  # the held call never reached the engine
    retry = _post(h.port, s.api_key, headers_deadline_s=5.0, path=GOOGLE_PLAIN, body=CONTENTS)
    assert _google_text(retry.read(), False) == "FIRST"
    assert _until(lambda: h.proxy._in_flight == 0)


def test_a_pause_outlasting_the_wait_before_any_header_is_still_a_503(fake_upstream, make_proxy):
    fake = fake_upstream()
    h = make_proxy([fake.base_url], stream_headers_after_s=5.0, pause_wait_s=0.3)
    s = h.session(plan=PLAN)
    assert h.admin("POST", "/admin/pause", {"timeout_s": 1})[0] == 200
    oa = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as e:
            oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=stream)
        assert e.value.status_code == 503
    recs = _records(h, s.session_id, 2)
    assert all(r.error is not None and r.error.get("kind") == "overloaded" for r in recs)
    assert h.proxy._in_flight == 0 and not [r for r in fake.requests if "messages" in r]
    assert h.admin("POST", "/admin/resume")[0] == 200
    assert (
        oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content
        == "FIRST"
    )
