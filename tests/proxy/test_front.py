# SPDX-License-Identifier: Apache-2.0
"""The proxy's own HTTP/1.1 front (proxy/front.py): harness calls are served by it, everything else by aiohttp.

Every other proxy test already goes through the front (`conftest.make_proxy` serves with `Proxy.site`); these tests
hold what is particular to it, on raw sockets so the bytes on the wire are the test's: the split between the front
and aiohttp (counted in the admin status), keep-alive and pipelined requests on one connection, a connection handed
to aiohttp mid-life, the unusual requests aiohttp answers (each compared with a proxy on aiohttp's server alone:
same status), `Connection: close`, an unexpected handler error, idle connections closed, and requests that arrive in
several reads.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from nemo_polar.proxy import front
from tests.procs import wait_until_serving
from tests.proxy.conftest import http_json

MSG = [{"role": "user", "content": "hi"}]


def _chat(key: str, *, stream: bool = False, extra: str = "") -> bytes:
    body = json.dumps({"model": "m", "messages": MSG, "stream": stream}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def _read_response(f: Any) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response off a socket file: status, headers (lower-case names), body (chunks joined)."""
    status_line = f.readline()
    assert status_line.startswith(b"HTTP/1."), status_line
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if status == 100:
        return status, headers, b""
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int(f.readline().strip(), 16):
            body += f.read(size)
            f.readline()
        f.readline()
        return status, headers, body
    return status, headers, f.read(int(headers.get("content-length", "0")))


def _connect(port: int) -> tuple[socket.socket, Any]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return sock, sock.makefile("rb")


def _served(fake_upstream: Any, make_proxy: Any) -> tuple[Any, Any, socket.socket, Any]:
    """A proxy on the front in front of a FAKE upstream, a session, and a raw connection to it."""
    h = make_proxy([fake_upstream().base_url])
    s = h.session()
    return (h, s, *_connect(h.port))


def _status(h: Any) -> dict[str, Any]:
    code, body = h.admin("GET", "/admin/status")
    assert code == 200
    return body


def test_harness_calls_are_the_fronts_and_the_rest_aiohttps(fake_upstream, make_proxy):
    fake = fake_upstream()
    lean = make_proxy([fake.base_url])
    plain = make_proxy([fake.base_url], http_server="aiohttp")
    answers = []
    for h in (lean, plain):
        s = h.session()
        code, body = http_json(
            "POST", h.base_url + "/v1/chat/completions", {"model": "m", "messages": MSG}, {"x-api-key": s.api_key}
        )
        assert code == 200, body
        answers.append(body["choices"][0]["message"]["content"])
        assert [r.error for r in h.records(s.session_id)] == [None]
    assert answers[0] == answers[1]
    st = _status(lean)
    assert st["http_server"] == "lean" and st["front_calls"] == 1 and st["front_handed_over"] >= 1
    st = _status(plain)
    assert st["http_server"] == "aiohttp" and st["front_calls"] == 0 and st["front_handed_over"] == 0


def test_keep_alive_pipelining_and_a_hand_over_on_one_connection(fake_upstream, make_proxy):
    h, s, sock, f = _served(fake_upstream, make_proxy)
    with sock:
        sock.sendall(_chat(s.api_key) + _chat(s.api_key, stream=True))  # two calls in one write
        first, second = _read_response(f), _read_response(f)
        assert first[0] == 200 and json.loads(first[2])["choices"][0]["message"]["content"]
        assert second[0] == 200 and second[1]["content-type"] == "text/event-stream"
        assert second[2].rstrip().endswith(b"data: [DONE]")
        sock.sendall(_chat(s.api_key))  # the connection stays open between calls
        assert _read_response(f)[0] == 200
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nx-api-key: " + s.api_key.encode() + b"\r\n\r\n")
        code, _, body = _read_response(f)  # aiohttp's from here on, on the same connection
        assert code == 200 and json.loads(body)["data"]
        sock.sendall(_chat(s.api_key))
        assert _read_response(f)[0] == 200
    assert len(h.records(s.session_id)) == 4
    front_ = h.proxy.fronts[0]
    assert front_.served == 3 and front_.handed_over >= 1


def test_requests_cut_anywhere_across_reads(fake_upstream, make_proxy):
    """A request that arrives in several reads is buffered until it is whole: cut inside the head, right after it,
    inside the body, and a whole call with the next one's start in one read."""
    h, s, sock, f = _served(fake_upstream, make_proxy)
    one = _chat(s.api_key)
    head_end = one.index(b"\r\n\r\n") + 4
    cuts = [[10], [head_end], [head_end + 5], [20, head_end, len(one) - 1]]
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for cut in cuts:
            for a, b in zip([0, *cut], [*cut, len(one)], strict=True):
                sock.sendall(one[a:b])
                time.sleep(0.05)  # each piece its own read
            assert _read_response(f)[0] == 200
        two = one + one[: head_end + 3]
        sock.sendall(two)
        time.sleep(0.05)
        sock.sendall(one[head_end + 3 :])
        assert _read_response(f)[0] == 200 and _read_response(f)[0] == 200
    records = h.records(s.session_id)
    assert len(records) == len(cuts) + 2 and all(r.error is None for r in records)
    assert h.proxy.fronts[0].served == len(cuts) + 2


def test_claude_codes_head_then_calls_stay_on_the_front(fake_upstream, make_proxy):
    """Claude Code checks the server with `HEAD /` before its calls, on the same keep-alive connection
    (tests/data/cli_requests/claude_code.json): the front answers it, so the calls after it are the front's too."""
    h, s, sock, f = _served(fake_upstream, make_proxy)
    with sock:
        sock.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        code, headers, _ = _read_response(f)
        assert code == 200 and headers.get("transfer-encoding") is None  # no body, as aiohttp answers it
        sock.sendall(_chat(s.api_key, stream=True))
        assert _read_response(f)[0] == 200
    assert h.proxy.fronts[0].served == 2 and h.proxy.fronts[0].handed_over == 0


def _raw(fields: str, body: bytes, line: str = "POST /v1/chat/completions HTTP/1.1") -> bytes:
    return f"{line}\r\nHost: x\r\n{fields}\r\n".encode() + body


# each: (header lines but Host, given the session key and the JSON body) -> the bytes of one request
UNUSUAL = {
    "chunked body": lambda key, body: _raw(
        f"Authorization: Bearer {key}\r\nTransfer-Encoding: chunked\r\n",
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body),
    ),
    "expect 100-continue": lambda key, body: _raw(
        f"Authorization: Bearer {key}\r\nExpect: 100-continue\r\nContent-Length: {len(body)}\r\n", body
    ),
    "body over the limit": lambda key, body: _raw(
        f"Authorization: Bearer {key}\r\nContent-Length: 4097\r\n", b" " * 4097
    ),
    "header without a colon": lambda key, body: _raw(
        f"broken header\r\nAuthorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n", body
    ),
    "HTTP/1.0": lambda key, body: _raw(
        f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n",
        body,
        "POST /v1/chat/completions HTTP/1.0",
    ),
    "no content length": lambda key, body: _raw(f"Authorization: Bearer {key}\r\n", b""),
    "admin route": lambda key, body: _raw(f"Content-Length: {len(body)}\r\n", body, "POST /admin/pause HTTP/1.1"),
}


@pytest.mark.parametrize("case", list(UNUSUAL))
def test_unusual_requests_are_answered_as_aiohttp_answers_them(fake_upstream, make_proxy, case):
    fake = fake_upstream()
    codes = []
    for server in ("lean", "aiohttp"):
        h = make_proxy([fake.base_url], http_server=server, max_body_bytes=4096)
        s = h.session()
        raw = UNUSUAL[case](s.api_key, json.dumps({"model": "m", "messages": MSG}).encode())
        sock, f = _connect(h.port)
        with sock:
            sock.sendall(raw)
            code, headers, _ = _read_response(f)
            if code == 100:
                code, headers, _ = _read_response(f)
        codes.append((code, headers.get("content-type", "").split(";")[0]))
        if server == "lean":
            assert h.proxy.fronts[0].served == 0 and h.proxy.fronts[0].handed_over == 1
    assert codes[0] == codes[1], codes
    if case == "body over the limit":
        assert codes[0] == (413, "application/json")  # in the caller's provider shape


def test_connection_close_is_honoured(fake_upstream, make_proxy):
    _, s, sock, f = _served(fake_upstream, make_proxy)
    with sock:
        sock.sendall(_chat(s.api_key, extra="Connection: close\r\n"))
        code, headers, _ = _read_response(f)
        assert code == 200 and headers.get("connection") == "close"
        assert f.read() == b""  # closed by the proxy


def test_an_unexpected_handler_error_is_a_500_then_a_closed_connection(fake_upstream, make_proxy):
    async def broken(request: Any) -> Any:
        raise RuntimeError("a bug")

    h, s, sock, f = _served(fake_upstream, make_proxy)
    h.proxy._dialect_route = broken  # type: ignore[method-assign]
    with sock:
        sock.sendall(_chat(s.api_key))
        code, _, body = _read_response(f)
        assert code == 500 and b"Internal Server Error" in body
        assert f.read() == b""


def test_an_idle_connection_is_closed(fake_upstream, make_proxy, monkeypatch):
    monkeypatch.setattr(front, "KEEPALIVE_S", 0.2)
    _, s, sock, f = _served(fake_upstream, make_proxy)
    with sock:
        sock.sendall(_chat(s.api_key))
        assert _read_response(f)[0] == 200
        sock.settimeout(5)
        assert f.read() == b""  # closed after KEEPALIVE_S without a request


def test_no_route_of_the_proxy_app_is_a_dialect_path(tmp_path):
    """What keeps the admin API and `/v1/models` aiohttp's: none of the app's own routes (every route but the
    dialects' catch-all, its placeholders filled) is a path the dialect registry serves."""
    import re

    from nemo_polar.proxy import dialects
    from nemo_polar.proxy.app import Proxy, ProxyConfig

    app = Proxy(ProxyConfig(upstreams=["http://127.0.0.1:9"], store_dir=str(tmp_path))).make_app()
    paths = {re.sub(r"\{[^}]*\}", "x", r.resource.canonical) for r in app.router.routes() if r.method != "*"}
    assert {"/sessions", "/admin/pause", "/v1/models"} <= paths
    for path in paths:
        assert dialects.resolve("POST", dialects.split_key_prefix(path)[1]) is None, path


def test_parse_head_takes_only_what_it_is_sure_of():
    ok = b"POST /s/k/v1/messages?beta=true HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nConnection: keep-alive"
    assert front.parse_head(ok) == (
        "POST",
        "/s/k/v1/messages?beta=true",
        [("Host", "x"), ("Content-Length", "7"), ("Connection", "keep-alive")],
        7,
        False,
    )
    for bad in (
        b"PUT / HTTP/1.1\r\nHost: x",
        b"GET / HTTP/1.1\r\nContent-Length: 3",  # a GET with a body: aiohttp's
        b"POST /v1/messages HTTP/1.1\r\nHost: x",  # no Content-Length
        b"POST /v1/messages HTTP/1.1\r\nContent-Length: 7\r\nContent-Length: 7",
        b"POST /v1/messages HTTP/1.1\r\nContent-Length: -7",
        b"POST /v1/messages HTTP/1.1\r\nContent-Length: 7\r\nConnection: upgrade",
        b"POST /v1/messages HTTP/1.1\r\nContent-Length: 7\r\n folded: line",
        b"POST /v1/messages HTTP/1.1\r\nContent-Length: 7\r\nX: a\x00b",
        b"POST /v1/messages HTTP/1.1\r\nContent-Length: 7\r\nX: a\nb",
        b"POST v1/messages HTTP/1.1\r\nContent-Length: 7",
        b"POST /v1/messages  HTTP/1.1\r\nContent-Length: 7",
    ):
        assert front.parse_head(bad) is None, bad
    assert front.parse_head(b"POST / HTTP/1.1\r\nContent-Length: 0\r\nConnection: Close")[4] is True
    assert front.parse_head(b"HEAD / HTTP/1.1\r\nHost: x") == ("HEAD", "/", [("Host", "x")], 0, False)
    assert front.served_here("POST", "/v1/chat/completions") and front.served_here("POST", "/s/key/v1/messages?x=1")
    assert not front.served_here("POST", "/admin/pause") and not front.served_here("POST", "/sessions")
    assert not front.served_here("POST", "/v1/nothing") and not front.served_here("GET", "/v1/models")
    assert front.served_here("HEAD", "/") and front.served_here("GET", "/")


def test_polar_proxy_on_its_serving_loop_hands_over_and_stops_cleanly_on_sigterm(tmp_path):
    """`polar proxy` serves through the front with its own serving loop (`app.run`, uvloop where installed): a call
    is the front's and an admin request on the same connection aiohttp's (the transport's protocol switched on that
    loop); SIGTERM stops it with exit code 0 and the store closed (its WAL checkpointed away), as `web.run_app` did."""
    import signal
    import subprocess
    import sys

    from nemo_polar.backend.server import free_port

    port = free_port()
    store = tmp_path / "store"
    argv = [
        "-m",
        "nemo_polar.proxy.cli",
        "--port",
        str(port),
        "--store",
        str(store),
        "--upstream",
        "http://127.0.0.1:9",
    ]
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/", proc)
        sock, f = _connect(port)
        with sock:
            sock.sendall(_chat("no-such-key"))
            code, headers, _ = _read_response(f)  # the front: a 401 in the caller's shape
            assert (code, headers["content-type"].split(";")[0]) == (401, "application/json")
            sock.sendall(b"GET /admin/status HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_response(f)[0] == 401  # aiohttp's: the admin API without the control token
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        proc.kill()
    assert (store / "records.sqlite").exists() and not (store / "records.sqlite-wal").exists()


class _Wire:
    """A connection's transport and the front's side of it, for responses prepared without a server."""

    def __init__(self, signals: list[Any] | None = None):
        self.sent: list[bytes] = []
        self.transport = self
        self.paused = False
        app = type("A", (), {"on_response_prepare": signals or []})()
        self.front = type("F", (), {"app": app, "prepare_signals": bool(signals)})()

    def writelines(self, parts: list[Any]) -> None:
        self.sent += [bytes(p) for p in parts]

    def is_closing(self) -> bool:
        return False


def _responses() -> list[Any]:
    from aiohttp import web

    from nemo_polar.proxy import streaming

    return [
        lambda: web.Response(body=b'{"id": 1}', content_type="application/json"),
        lambda: web.Response(status=200),  # `GET /`: no body
        lambda: web.Response(status=429, body=b"{}", content_type="application/json", headers={"Retry-After": "2"}),
        lambda: streaming._SSEResponse(headers=streaming._SSE_HEADERS),
        lambda: web.StreamResponse(headers={"Content-Type": "application/json"}),  # an early-headers stream
    ]


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "close"])
@pytest.mark.parametrize("make", range(5), ids=["json", "empty", "error", "sse", "stream"])
def test_a_reply_prepared_in_one_call_sends_what_aiohttp_sends(make, close, monkeypatch):
    """`lean_prepare` puts on the wire, byte for byte, what aiohttp's own `prepare` does for the same response
    (status line, headers, chunking, body), and leaves the response prepared, with its keep-alive."""
    import asyncio

    import aiohttp.web_response
    from aiohttp import web

    for module in (front, aiohttp.web_response):  # one second for both, whenever the test runs
        monkeypatch.setattr(module, "rfc822_formatted_time", lambda: "Sun, 06 Dec 2026 12:00:00 GMT")

    async def send(lean: bool) -> list[bytes]:
        wire = _Wire()
        req = front.FrontRequest(wire, "POST", "/v1/chat/completions", [("Host", "x")], b"{}", close)  # type: ignore[arg-type]
        resp = _responses()[make]()
        if lean:
            assert front.lean_prepare(resp, req) is not None
        else:
            await web.StreamResponse.prepare(resp, req)
        assert resp.prepared and resp.keep_alive is (not close)
        if isinstance(resp, web.Response):
            await resp.write_eof()
        else:
            await resp.write(b"data: 1\n\n")
            await resp.write_eof(b"data: [DONE]\n\n")
        return wire.sent

    assert b"".join(asyncio.run(send(True))) == b"".join(asyncio.run(send(False)))


def test_replies_it_cannot_prepare_in_one_call_are_left_to_aiohttp():
    from aiohttp import web

    def req(method: str = "POST", signals: list[Any] | None = None) -> Any:
        return front.FrontRequest(_Wire(signals), method, "/", [], b"", False)  # type: ignore[arg-type]

    json = web.Response(body=b"{}", content_type="application/json")
    assert front.lean_prepare(json, req("HEAD")) is None  # no body by its method
    assert front.lean_prepare(web.Response(status=204), req()) is None  # no body by its status
    assert front.lean_prepare(json, req(signals=[object()])) is None  # someone listens to response-prepare
    cookie = web.Response(body=b"{}")
    cookie.set_cookie("a", "b")
    assert front.lean_prepare(cookie, req()) is None
    assert front.lean_prepare(web.Response(text="x" * 10, zlib_executor_size=1), req()) is not None
    compressed = web.Response(body=b"{}")
    compressed.enable_compression()
    assert front.lean_prepare(compressed, req()) is None
    assert front.lean_prepare(json, type("Other", (), {"method": "POST"})()) is None  # not this front's request
    assert front.lean_prepare(web.FileResponse(__file__), req()) is None  # a `prepare` of its own
    assert not json.prepared
