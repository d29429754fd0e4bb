# SPDX-License-Identifier: Apache-2.0
"""Bad client input through real HTTP, per dialect: always a 4xx in the caller's provider error shape, never a 500.

Each table row is sent to the running proxy (FAKE upstream behind it: none of these may reach a model). The
parsers' own tables live with the dialects (tests/proxy/dialects); these check the server path around them: body
reading, JSON decoding, size limits, auth, routing, closed sessions.
"""

from __future__ import annotations

import json

import pytest

from tests.proxy.conftest import http_json

BIG = 2 * 1024 * 1024

DIALECTS = {
    "anthropic_messages": (
        "/v1/messages",
        {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        [
            ("messages not a list", {"messages": "hi"}),
            ("missing messages", {"messages": None}),
            ("bad role", {"messages": [{"role": "wizard", "content": "hi"}]}),
            ("content wrong type", {"messages": [{"role": "user", "content": 5}]}),
            ("negative max_tokens", {"max_tokens": -1}),
            ("max_tokens string", {"max_tokens": "many"}),
            ("temperature string", {"temperature": "hot"}),
            ("tools not a list", {"tools": {"name": "x"}}),
            ("tool without name", {"tools": [{"input_schema": {"type": "object"}}]}),
            ("bad block type", {"messages": [{"role": "user", "content": [{"type": "nonsense"}]}]}),
            ("system wrong type", {"system": 7}),
            ("model not a string", {"model": 3}),
        ],
        lambda status, b: b["type"] == "error" and isinstance(b["error"]["type"], str) and b["error"]["message"],
    ),
    "openai_chat": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        [
            ("messages not a list", {"messages": "hi"}),
            ("missing messages", {"messages": None}),
            ("bad role", {"messages": [{"role": "wizard", "content": "hi"}]}),
            ("content wrong type", {"messages": [{"role": "user", "content": 5}]}),
            ("negative max_tokens", {"max_tokens": -1}),
            ("max_tokens string", {"max_tokens": "many"}),
            ("temperature string", {"temperature": "hot"}),
            ("tools not a list", {"tools": {"type": "function"}}),
            ("tool without function", {"tools": [{"type": "function"}]}),
            ("bad part type", {"messages": [{"role": "user", "content": [{"type": "nonsense"}]}]}),
            ("stream not bool", {"stream": "yes"}),
            ("model not a string", {"model": 3}),
        ],
        lambda status, b: isinstance(b["error"]["message"], str) and "type" in b["error"],
    ),
    "openai_responses": (
        "/v1/responses",
        {"model": "m", "input": "hi"},
        [
            ("input wrong type", {"input": 5}),
            ("bad item type", {"input": [{"type": "nonsense"}]}),
            ("bad role", {"input": [{"type": "message", "role": "wizard", "content": "hi"}]}),
            ("negative max_output_tokens", {"max_output_tokens": -1}),
            ("max_output_tokens string", {"max_output_tokens": "many"}),
            ("temperature string", {"temperature": "hot"}),
            ("tools not a list", {"tools": {"type": "function"}}),
            ("function tool without name", {"tools": [{"type": "function", "parameters": {}}]}),
            ("instructions wrong type", {"instructions": 5}),
            ("stream not bool", {"stream": "yes"}),
            ("model not a string", {"model": 3}),
            ("function_call_output without call_id", {"input": [{"type": "function_call_output", "output": "x"}]}),
        ],
        lambda status, b: isinstance(b["error"]["message"], str) and "type" in b["error"],
    ),
    "google_genai": (
        "/v1beta/models/gemini-x:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        [
            ("contents wrong type", {"contents": 5}),
            ("parts wrong type", {"contents": [{"role": "user", "parts": "hi"}]}),
            ("bad role", {"contents": [{"role": "wizard", "parts": [{"text": "hi"}]}]}),
            ("toolConfig wrong type", {"toolConfig": 5}),
            ("negative maxOutputTokens", {"generationConfig": {"maxOutputTokens": -1}}),
            ("maxOutputTokens string", {"generationConfig": {"maxOutputTokens": "many"}}),
            ("temperature string", {"generationConfig": {"temperature": "hot"}}),
            ("tools not a list", {"tools": {"functionDeclarations": []}}),
            ("function without name", {"tools": [{"functionDeclarations": [{"description": "x"}]}]}),
            ("generationConfig wrong type", {"generationConfig": 5}),
            ("systemInstruction wrong type", {"systemInstruction": 5}),
            ("text not a string", {"contents": [{"role": "user", "parts": [{"text": 5}]}]}),
        ],
        lambda status, b: (
            b["error"]["code"] == status and isinstance(b["error"]["status"], str) and b["error"]["message"]
        ),
    ),
}


def _cases(dialect: str):
    path, valid, mutations, _ = DIALECTS[dialect]
    rows = [
        ("malformed JSON", path, b'{"model": ', "key", 400),
        ("empty body", path, b"", "key", 400),
        ("array body", path, b"[]", "key", 400),
        ("string body", path, b'"hello"', "key", 400),
        ("not UTF-8", path, b'{"model": "\xff\xfe"}', "key", 400),
        ("deeply nested", path, b'{"a":' * 2000 + b"1" + b"}" * 2000, "key", 400),
        ("oversize body", path, json.dumps({**valid, "pad": "x" * BIG}).encode(), "key", 413),
        ("unknown key", path, json.dumps(valid).encode(), "polar-unknown", 401),
        ("no key", path, json.dumps(valid).encode(), None, 401),
        ("unknown route", path + "-nope", json.dumps(valid).encode(), "key", 404),
    ]
    for name, patch in mutations:
        body = {**valid, **patch}
        body = {k: v for k, v in body.items() if v is not None}
        rows.append((name, path, json.dumps(body).encode(), "key", 400))
    return rows


ALL = [(d, *row) for d in DIALECTS for row in _cases(d)]


@pytest.fixture(scope="module")
def served(request):
    """One proxy (1 MiB body limit) + FAKE upstream for the whole table."""
    from tests.proxy.conftest import LoopThread

    lt = LoopThread()
    tmp = request.getfixturevalue("tmp_path_factory").mktemp("badinput")
    from nemo_polar.proxy.app import Proxy, ProxyConfig
    from polar_lab.fake_upstream import FakeUpstream

    fake = FakeUpstream()
    lt.run(fake.start())
    proxy = Proxy(ProxyConfig(upstreams=[fake.base_url], store_dir=str(tmp), max_body_bytes=1024 * 1024))

    async def start():
        runner = proxy.runner()
        await runner.setup()
        await proxy.site(runner, "127.0.0.1", 0).start()  # the HTTP front, as every proxy server runs
        return runner

    runner = lt.run(start())
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    session = lt.run(proxy.create_session())
    yield base, session, fake, proxy, lt
    lt.run(runner.cleanup())
    lt.run(fake.stop())
    lt.stop()


@pytest.mark.parametrize(
    ("dialect", "name", "path", "raw", "key", "status"), ALL, ids=[f"{d}:{r[0]}" for d, *r in ALL]
)
def test_bad_input_is_a_provider_shaped_4xx(served, dialect, name, path, raw, key, status):
    base, session, fake, _, _ = served
    headers = (
        {}
        if key is None
        else {"x-goog-api-key" if dialect == "google_genai" else "x-api-key": session.api_key if key == "key" else key}
    )
    n_before = len(fake.requests)
    got, body = http_json("POST", base + path, raw=raw, headers=headers)
    assert got == status, (name, body)
    assert DIALECTS[dialect][3](got, body), body
    assert len(fake.requests) == n_before  # nothing reached the model


def test_each_dialect_has_at_least_15_cases():
    for d in DIALECTS:
        assert len(_cases(d)) >= 15


def test_authenticated_rejections_are_failure_records_and_closed_sessions_are_refused(served):
    base, session, _, proxy, lt = served
    recs = proxy.store.list_records(session.session_id, limit=10_000)
    assert recs and all(r.error is not None for r in recs)
    assert all(r.error["type"] == "rejected" and 400 <= r.error["status"] < 500 for r in recs)
    s2 = lt.run(proxy.create_session())
    lt.run(proxy.sessions.close(s2.session_id))
    got, body = http_json(
        "POST",
        base + "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={"Authorization": f"Bearer {s2.api_key}"},
    )
    assert got == 403 and body["error"]["message"]


def test_wrong_method_and_admin_without_token(served):
    base, session, _, _, _ = served
    got, body = http_json("GET", base + "/v1/chat/completions", headers={"x-api-key": session.api_key})
    assert 400 <= got < 500 and body["error"]["message"]
    got, _ = http_json("POST", base + "/sessions", {})
    assert got == 401
    got, _ = http_json("POST", base + "/admin/pause", {})
    assert got == 401


# The dialects' other routes and every key form: the same guarantees (a provider-shaped 4xx, an unknown key → 401
# and no session created), checked in the error shape of the dialect that serves the route.
_ANTH = {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
_GOOG = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
_RESP = {"model": "m", "input": "hi"}
_PATHS = {
    "anthropic_messages": ("/v1/messages?beta=true", _ANTH),
    "openai_chat": ("/v1/chat/completions", _CHAT),
    "openai_responses": ("/v1/responses", _RESP),
    "google_genai": ("/v1beta/models/gemini-x:streamGenerateContent?alt=sse", _GOOG),
}
_G = "/v1beta/models/gemini-x:"
_KA, _KG = {"x-api-key": "KEY"}, {"x-goog-api-key": "KEY"}  # "KEY" → the session's key
_UNKNOWN = "polar-unknown"
_AC = "/v1/messages/count_tokens"
_BEARER = {"Authorization": f"Bearer {_UNKNOWN}"}
_KG_UNKNOWN = {"x-goog-api-key": _UNKNOWN}
OTHER_ROUTES = [
    # (dialect, name, path, body (bytes are sent as they are), headers, status)
    ("anthropic_messages", "count_tokens malformed JSON", _AC, b'{"model":', _KA, 400),
    ("anthropic_messages", "count_tokens messages wrong type", _AC, {**_ANTH, "messages": 5}, _KA, 400),
    ("anthropic_messages", "count_tokens unknown key", _AC, _ANTH, {"x-api-key": _UNKNOWN}, 401),
    ("anthropic_messages", "unknown bearer key", "/v1/messages?beta=true", _ANTH, _BEARER, 401),
    ("openai_chat", "unknown bearer key", "/v1/chat/completions", _CHAT, _BEARER, 401),
    ("openai_chat", "empty bearer", "/v1/chat/completions", _CHAT, {"Authorization": "Bearer "}, 401),
    ("openai_responses", "unknown bearer key", "/v1/responses", _RESP, _BEARER, 401),
    ("google_genai", "countTokens malformed JSON", _G + "countTokens", b"{", _KG, 400),
    ("google_genai", "countTokens contents wrong type", _G + "countTokens", {"contents": 5}, _KG, 400),
    ("google_genai", "countTokens unknown key", _G + "countTokens", _GOOG, _KG_UNKNOWN, 401),
    ("google_genai", "stream malformed JSON", _G + "streamGenerateContent?alt=sse", b"{", _KG, 400),
    ("google_genai", "stream unknown key", _G + "streamGenerateContent?alt=sse", _GOOG, _KG_UNKNOWN, 401),
    ("google_genai", "unknown key in ?key=", _G + f"generateContent?key={_UNKNOWN}", _GOOG, {}, 401),
    ("google_genai", "v1 route bad contents", "/v1/models/gemini-x:generateContent", {"contents": "hi"}, _KG, 400),
] + [
    (d, "unknown key in the /s/{key}/ path", f"/s/{_UNKNOWN}" + path, body, {}, 401)
    for d, (path, body) in _PATHS.items()
]  # fmt: skip


@pytest.mark.parametrize(
    ("dialect", "name", "path", "body", "headers", "status"),
    OTHER_ROUTES,
    ids=[f"{r[0]}:{r[1]}" for r in OTHER_ROUTES],
)
def test_other_routes_and_key_forms_are_provider_shaped_4xx(served, dialect, name, path, body, headers, status):
    base, session, fake, proxy, _ = served
    headers = {k: (session.api_key if v == "KEY" else v) for k, v in headers.items()}
    n_before, n_sessions = len(fake.requests), len(proxy.sessions.all())
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, out = http_json("POST", base + path, raw=raw, headers=headers)
    assert got == status, (name, out)
    assert DIALECTS[dialect][3](got, out), out
    assert len(fake.requests) == n_before and len(proxy.sessions.all()) == n_sessions
