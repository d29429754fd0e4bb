# SPDX-License-Identifier: Apache-2.0
"""A harness that hangs up mid-call (its own timeout, a session killed at its deadline).

The proxy's HTTP front (`Proxy.site`, proxy/front.py) cancels the call's handler when its client hangs up, as
aiohttp's server does with handler cancellation (`Proxy.runner`, `SERVER_OPTIONS`); that closes the upstream call
(vLLM then aborts the request and frees its engine slot; the FAKE upstream here counts such calls in `abandoned`),
leaves a `client_disconnected` failure record
(before this, a plain call ran to its end and was recorded as a completed answer nobody read), and gives the call's
plan step back, so the harness's retry is served the same step. Each test's client gives up after 0.4-0.6 s on an
upstream that answers after 4 s; the asserts wait at most 3 s for the abandonment, so they fail when the proxy only
notices at the answer.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import openai
import pytest

PLAN = {"version": 1, "steps": [{"text": "FIRST"}, {"text": "SECOND"}]}
MSG = [{"role": "user", "content": "hi"}]


def _give_up(port: int, key: str, body: dict, after_s: float, path: str = "/v1/chat/completions") -> None:
    """Send a call and hang up after `after_s` without its answer (a harness's timeout)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=after_s)
    conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with pytest.raises(socket.timeout):
        conn.getresponse()
    conn.close()


def _until(check, timeout_s: float = 3.0) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return bool(check())


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_hung_up_call_stops_the_engine_and_keeps_the_plan_step(fake_upstream, make_proxy, stream):
    fake = fake_upstream(delay_s=4.0)
    h = make_proxy([fake.base_url], stream_headers_after_s=None)
    s = h.session(plan=PLAN)
    _give_up(h.port, s.api_key, {"model": "m", "messages": MSG, "stream": stream}, after_s=0.4)
    assert _until(lambda: fake.abandoned == 1), "the upstream call was not closed when the client hung up"
    assert _until(lambda: any(r.error for r in h.records(s.session_id)))
    (rec,) = h.records(s.session_id)
    assert rec.error is not None and rec.error["type"] == "client_disconnected"
    assert rec.generation_token_ids == [] and rec.original_request["messages"] == MSG
    fake.behaviour.delay_s = 0.0
    oa = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    answer = oa.chat.completions.create(model="m", messages=MSG)
    assert answer.choices[0].message.content == "FIRST"  # the retry gets the step the hung-up call never showed
    assert [r.error is None for r in h.records(s.session_id)] == [False, True]


def test_a_client_leaving_after_early_headers_stops_the_engine_at_once(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=4.0)
    h = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = h.session(plan=PLAN)
    conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=5)
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    conn.request(
        "POST",
        "/v1beta/models/g:streamGenerateContent?alt=sse",
        body=json.dumps(body),
        headers={"x-goog-api-key": s.api_key, "Content-Type": "application/json"},
    )
    assert conn.getresponse().status == 200  # the early headers
    conn.close()  # the harness gives up before the first token
    assert _until(lambda: fake.abandoned == 1)
    assert _until(lambda: any(r.error for r in h.records(s.session_id)))
    (rec,) = h.records(s.session_id)
    assert rec.error is not None and rec.error["type"] == "client_disconnected"


def test_a_call_held_by_a_paused_admission_can_be_given_up(fake_upstream, make_proxy):
    fake = fake_upstream()
    h = make_proxy([fake.base_url], pause_wait_s=30.0)
    s = h.session(plan=PLAN)
    status, _ = h.admin("POST", "/admin/pause", {"timeout_s": 1})
    assert status == 200
    _give_up(h.port, s.api_key, {"model": "m", "messages": MSG}, after_s=0.6)  # held for the weight update
    assert _until(lambda: any(r.error for r in h.records(s.session_id)))
    (rec,) = h.records(s.session_id)
    assert rec.error is not None and rec.error["type"] == "client_disconnected"
    assert not fake.requests  # the call never reached the engine
    status, _ = h.admin("POST", "/admin/resume", {})
    assert status == 200
    oa = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    assert oa.chat.completions.create(model="m", messages=MSG).choices[0].message.content == "FIRST"


def test_other_calls_are_unaffected_by_one_that_hangs_up(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=1.0)
    h = make_proxy([fake.base_url])
    s = h.session()
    done: list[str] = []

    def patient() -> None:
        oa = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
        done.append(oa.chat.completions.create(model="m", messages=MSG).choices[0].message.content or "")

    t = threading.Thread(target=patient)
    t.start()
    _give_up(h.port, s.api_key, {"model": "m", "messages": MSG}, after_s=0.3)
    t.join(10)
    assert len(done) == 1 and done[0]
    assert _until(lambda: len(h.records(s.session_id)) == 2 and all(r.finished_at for r in h.records(s.session_id)))
    errors = sorted(str(r.error and r.error["type"]) for r in h.records(s.session_id))
    assert errors == ["None", "client_disconnected"] and fake.abandoned == 1
