# SPDX-License-Identifier: Apache-2.0
"""Keep-alive newlines after Google's early headers (`streaming._EarlyHeaders`, `google_genai.EARLY_KEEPALIVE`).

Gemini CLI's fetch (undici) gives up on a body that stays idle for 300 s. After a slow Google call's early headers, a
newline leaves every `stream_headers_after_s` until the first event (a stream) or the answer (a plain call): JSON
allows whitespace before a value and Gemini's SSE parser (`^\\s*data: `) skips it before an event. Here the harness's
idle deadline is a socket timeout on every read after the headers, shorter than the FAKE upstream's delay and longer
than the keep-alive interval. The first two tests fail without the newlines (the read times out); the answers are
read with the official google-genai SDK too. The last guards the other dialects: no byte before their first event.
"""

from __future__ import annotations

import http.client
import json
import re
import socket

import openai
import pytest
from google import genai
from google.genai import types as gtypes

from .test_early_headers import _wait_records as _records

CONTENTS = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
GEMINI_SSE_EVENT = re.compile(rb"^\s*data: (.*)(?:\n\n|\r\r|\r\n\r\n)")  # Gemini CLI's SDK's `responseLineRE`


def _read_body(port: int, key: str, path: str, *, headers_deadline_s: float, idle_deadline_s: float) -> bytes:
    """A request whose headers must come within one deadline and every later read within another (undici's
    `headersTimeout` / `bodyTimeout`)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=headers_deadline_s)
    conn.request("POST", path, body=json.dumps(CONTENTS), headers={"x-goog-api-key": key})
    resp = conn.getresponse()
    assert resp.status == 200
    assert conn.sock is not None
    conn.sock.settimeout(idle_deadline_s)
    return resp.read()


def _gemini_events(body: bytes) -> list[dict]:
    """The events as Gemini CLI's parser cuts them (leading whitespace skipped by its pattern)."""
    events = []
    while m := GEMINI_SSE_EVENT.match(body):
        events.append(json.loads(m.group(1)))
        body = body[m.end() :]
    assert body.strip() == b""
    return events


def test_a_slow_google_plain_call_keeps_its_body_alive_until_the_answer(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=0.9)
    h = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = h.session()
    body = _read_body(
        h.port, s.api_key, "/v1beta/models/g:generateContent", headers_deadline_s=0.8, idle_deadline_s=0.45
    )
    lead = len(body) - len(body.lstrip(b"\n"))
    assert lead >= 2 and body[lead:].startswith(b"{")  # newlines while the answer was on its way, then the JSON
    answer = json.loads(body)
    words = "".join(p.get("text", "") for p in answer["candidates"][0]["content"]["parts"]).split()
    assert words == [f"w{i}" for i in range(fake.behaviour.n_gen)]
    (rec,) = _records(h, s.session_id, 1)
    assert rec.error is None and len(rec.generation_token_ids) == fake.behaviour.n_gen
    fake.behaviour.delay_s = 0.4  # a shorter wait: a newline or two before the answer
    g = genai.Client(api_key=s.api_key, http_options=gtypes.HttpOptions(base_url=h.base_url, api_version="v1beta"))
    assert g.models.generate_content(model="g", contents="hi").text.split() == words  # the SDK reads such a body


def test_a_slow_google_stream_keeps_its_body_alive_until_the_first_event(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=0.9)
    h = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = h.session()
    path = "/v1beta/models/g:streamGenerateContent?alt=sse"
    body = _read_body(h.port, s.api_key, path, headers_deadline_s=0.8, idle_deadline_s=0.45)
    assert body.startswith(b"\n\n\n")
    events = _gemini_events(body)
    text = "".join(p.get("text", "") for e in events for p in e["candidates"][0]["content"].get("parts", []))
    assert text.split() == [f"w{i}" for i in range(fake.behaviour.n_gen)]
    assert events[-1]["candidates"][0]["finishReason"] == "STOP"
    fake.behaviour.delay_s = 0.4
    g = genai.Client(api_key=s.api_key, http_options=gtypes.HttpOptions(base_url=h.base_url, api_version="v1beta"))
    chunks = list(g.models.generate_content_stream(model="g", contents="hi"))
    assert "".join(c.text or "" for c in chunks).split() == text.split()


def test_other_dialects_get_no_keepalive_bytes(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=0.8)
    h = make_proxy([fake.base_url], stream_headers_after_s=0.1)
    s = h.session()
    conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=0.6)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    conn.request(
        "POST", "/v1/chat/completions", body=json.dumps(body), headers={"Authorization": f"Bearer {s.api_key}"}
    )
    resp = conn.getresponse()  # early headers (a slow stream)
    assert resp.status == 200
    assert conn.sock is not None
    conn.sock.settimeout(0.4)
    with pytest.raises(socket.timeout):  # nothing before the first event
        resp.read(1)
    conn.close()
    fake.behaviour.delay_s = 0.0
    oa = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    assert list(oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
