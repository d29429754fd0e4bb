# SPDX-License-Identifier: Apache-2.0
"""The proxy's lean upstream HTTP/1.1 client against loopback servers that write exact bytes.

Each server is a raw asyncio TCP server scripted per test (no HTTP library on that side), so framing, keep-alive,
timeouts and broken connections are exercised byte for byte.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable

import pytest

from nemo_polar.proxy.upstream_http import (
    HTTPClient,
    Target,
    UpstreamConnectError,
    UpstreamDisconnected,
    UpstreamTimeout,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


class Server:
    """Counts connections and requests; `script` answers each request read from a connection."""

    def __init__(self, script: Script):
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.disconnects = 0
        self.open_now = 0
        self.max_open = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(head + body)
                await self.script(reader, writer, self)
                if writer.is_closing():
                    break
        finally:
            self.open_now -= 1
            self.disconnects += 1
            writer.close()

    async def __aenter__(self) -> Server:
        self.srv = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.srv.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.srv.close()

    def target(self, path: str = "/v1/chat/completions") -> Target:
        return Target.parse(f"http://127.0.0.1:{self.port}{path}")


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


async def _answer(writer: asyncio.StreamWriter, data: bytes, pieces: int = 1, pause: float = 0.0) -> None:
    step = max(1, -(-len(data) // pieces))
    for i in range(0, len(data), step):
        writer.write(data[i : i + step])
        await writer.drain()
        if pause:
            await asyncio.sleep(pause)


def _chunked(parts: list[bytes], trailers: bytes = b"") -> bytes:
    out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    for p in parts:
        out += b"%x;ext=1\r\n%s\r\n" % (len(p), p)
    return out + b"0\r\n" + trailers + b"\r\n"


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_keep_alive_reuses_one_connection_and_sends_a_well_formed_request() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await _answer(w, _ok(b'{"n": %d}' % len(s.requests)))

    async def main() -> None:
        async with Server(script) as srv:
            http = HTTPClient()
            for i in range(5):
                resp = await http.request("POST", srv.target(), b'{"x": 1}')
                assert resp.status == 200 and resp.headers["content-type"] == "application/json"
                assert await resp.read() == b'{"n": %d}' % (i + 1)
                resp.close()
            await http.close()
            assert srv.connections == 1
            head = srv.requests[0]
            assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert b"\r\nHost: 127.0.0.1:%d\r\n" % srv.port in head
            assert b"\r\nContent-Length: 8\r\n" in head and head.endswith(b'\r\n\r\n{"x": 1}')

    run(main())


@pytest.mark.parametrize("pieces", [1, 3, 97], ids=["whole", "3-pieces", "97-pieces"])
def test_chunked_bodies_in_any_byte_split_with_extensions_and_trailers(pieces: int) -> None:
    parts = [b"data: %d\n\n" % i for i in range(20)] + [b"data: [DONE]\n\n"]
    wire = _chunked(parts, trailers=b"X-Trailer: 1\r\n")

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await _answer(w, wire, pieces=pieces, pause=0.001)

    async def main() -> None:
        async with Server(script) as srv:
            http = HTTPClient()
            resp = await http.request("POST", srv.target(), b"{}")
            got = [c async for c in resp.chunks()]
            assert b"".join(got) == b"".join(parts)
            resp.close()
            resp = await http.request("POST", srv.target(), b"{}")  # the connection was left clean: reused
            assert await resp.read() == b"".join(parts)
            resp.close()
            assert srv.connections == 1
            await http.close()

    run(main())


def test_close_delimited_and_gzip_bodies_and_100_continue() -> None:
    payload = b'{"hello": "world"}' * 50

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        n = len(s.requests)
        if n == 1:  # 100 Continue first, then a gzip body with a length
            z = gzip.compress(payload)
            w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await _answer(w, _ok(z, b"Content-Encoding: gzip\r\n"), pieces=4)
        else:  # no length: the body ends when the server closes
            await _answer(w, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + payload, pieces=3)
            w.close()

    async def main() -> None:
        async with Server(script) as srv:
            http = HTTPClient()
            resp = await http.request("POST", srv.target(), b"{}")
            assert resp.status == 200 and await resp.read() == payload
            resp.close()
            resp = await http.request("POST", srv.target(), b"{}")
            assert not resp.keep_alive and await resp.read() == payload
            resp.close()
            assert http._open == 0  # the close-delimited connection is not pooled
            await http.close()

    run(main())


def test_connection_refused_is_a_connect_error() -> None:
    async def main() -> None:
        async with Server(lambda r, w, s: asyncio.sleep(0)) as srv:
            port = srv.port
        http = HTTPClient()
        with pytest.raises(UpstreamConnectError, match="cannot connect"):
            await http.request("POST", Target.parse(f"http://127.0.0.1:{port}/x"), b"{}")
        assert http._open == 0
        await http.close()

    run(main())


def test_read_timeout_and_total_deadline() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        if len(s.requests) == 1:
            await asyncio.sleep(5)  # silent
        else:  # a trickle: each byte within the read timeout, the whole past the deadline
            data = _ok(b"x" * 40)
            for i in range(len(data)):
                w.write(data[i : i + 1])
                await asyncio.sleep(0.02)

    async def main() -> None:
        async with Server(script) as srv:
            http = HTTPClient()
            with pytest.raises(UpstreamTimeout, match=r"no bytes for 0\.2 s"):
                await http.request("POST", srv.target(), b"{}", read_timeout=0.2)
            resp = None
            with pytest.raises(UpstreamTimeout, match="total deadline"):
                resp = await http.request("POST", srv.target(), b"{}", read_timeout=1.0, total_timeout=0.6)
                await resp.read()
            if resp is not None:
                resp.close()
            assert http._open == 0  # timed-out connections are closed, never reused
            await http.close()

    run(main())


def test_a_connection_cut_mid_body_is_a_disconnect_and_a_bad_status_line_too() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        if len(s.requests) == 1:
            await _answer(w, _ok(b"x" * 100)[:-50])
        else:
            await _answer(w, b"SSH-2.0-OpenSSH\r\n\r\n")
        w.close()

    async def main() -> None:
        async with Server(script) as srv:
            http = HTTPClient()
            resp = await http.request("POST", srv.target(), b"{}")
            with pytest.raises(UpstreamDisconnected, match="mid-body"):
                await resp.read()
            resp.close()
            with pytest.raises(UpstreamDisconnected, match=r"status line|HTTP/1"):
                await http.request("POST", srv.target(), b"{}")
            assert http._open == 0
            await http.close()

    run(main())


def test_idle_connections_closed_by_the_server_or_too_old_are_not_reused() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await _answer(w, _ok(b"{}"))
        if len(s.requests) == 1:
            await asyncio.sleep(0.05)
            w.close()  # the server drops the keep-alive connection while it is idle

    async def main() -> None:
        async with Server(script) as srv:
            http = HTTPClient(idle_s=0.3)
            for _ in range(2):
                resp = await http.request("POST", srv.target(), b"{}")
                await resp.read()
                resp.close()
                await asyncio.sleep(0.15)
            assert srv.connections == 2  # the dropped one was not used again
            await asyncio.sleep(0.4)  # older than idle_s
            resp = await http.request("POST", srv.target(), b"{}")
            await resp.read()
            resp.close()
            assert srv.connections == 3
            await http.close()

    run(main())


def test_the_connection_limit_queues_requests_and_an_early_close_aborts() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        if b"/stream" in s.requests[-1].split(b"\r\n", 1)[0]:
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await w.drain()
            try:
                await asyncio.wait_for(r.read(1), 5)  # wait for the client to go away
            except TimeoutError:
                pass
            w.close()
            return
        await asyncio.sleep(0.05)
        await _answer(w, _ok(b"{}"))

    async def main() -> None:
        async with Server(script) as srv:
            http = HTTPClient(limit=1)

            async def one() -> bytes:
                resp = await http.request("POST", srv.target(), b"{}")
                try:
                    return await resp.read()
                finally:
                    resp.close()

            assert await asyncio.gather(*(one() for _ in range(4))) == [b"{}"] * 4
            assert srv.max_open == 1 and srv.connections == 1
            resp = await http.request("POST", srv.target("/stream"), b"{}")
            body = resp.chunks()
            assert await anext(body) == b"first"
            await body.aclose()
            resp.close()  # before the body's end: the connection is closed (a generation upstream is aborted)
            for _ in range(100):
                if srv.disconnects:
                    break
                await asyncio.sleep(0.02)
            assert srv.disconnects == 1 and http._open == 0
            assert await one() == b"{}"
            await http.close()

    run(main())


def test_target_parsing() -> None:
    t = Target.parse("http://example.org/prefix/v1/chat/completions?x=1")
    assert (t.host, t.port, t.tls, t.request_path, t.host_header) == (
        "example.org",
        80,
        False,
        b"/prefix/v1/chat/completions?x=1",
        b"example.org",
    )
    t = Target.parse("https://[::1]:8443/v1")
    assert (t.host, t.port, t.tls, t.host_header) == ("::1", 8443, True, b"[::1]:8443")
    with pytest.raises(ValueError, match="scheme"):
        Target.parse("ftp://x/y")


def test_polar_proxy_refuses_an_upstream_url_it_cannot_use(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "nemo_polar.proxy.cli", "--upstream", "localhost:8000", "--store", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--upstream localhost:8000" in out.stderr and "http://" in out.stderr


@pytest.mark.parametrize("terminator", ["late", "never"])
def test_drain_waits_briefly_for_a_late_terminating_chunk(terminator: str) -> None:
    """`[DONE]` arrives, the chunked body's terminator later (or never): drain reuses or closes, never hangs."""

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"e\r\ndata: [DONE]\n\n\r\n")
        await w.drain()
        if terminator == "late":
            await asyncio.sleep(0.01)
            w.write(b"0\r\n\r\n")
        else:
            try:
                await asyncio.wait_for(r.read(1), 5)  # hold the connection open until the client goes away
            except TimeoutError:
                pass
            w.close()

    async def main() -> None:
        async with Server(script) as srv:
            http = HTTPClient()
            for _ in range(2):
                resp = await http.request("POST", srv.target(), b"{}")
                body = resp.chunks()
                assert await anext(body) == b"data: [DONE]\n\n"
                t0 = asyncio.get_running_loop().time()
                await resp.drain(grace_s=0.3)
                assert asyncio.get_running_loop().time() - t0 < 2
                await body.aclose()
            if terminator == "late":
                assert srv.connections == 1 and http._open == 1
            else:
                assert srv.connections == 2 and http._open == 0
            await http.close()

    run(main())


def test_upstreams_serve_again_after_close_in_a_new_event_loop() -> None:
    """The proxy's app can stop and start again (another event loop): `Upstreams.close()` leaves a fresh pool."""
    from nemo_polar.backend.server import free_port
    from nemo_polar.proxy.engines.base import Generation, Upstreams

    port = free_port()
    ups = Upstreams([f"http://127.0.0.1:{port}"])

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await _answer(w, _ok(b'{"ok": %d}' % len(s.requests)))

    async def one_app_run() -> None:
        srv = await asyncio.start_server(Server(script)._serve, "127.0.0.1", port)
        try:
            for i in range(2):
                assert await ups.post_json("/v1/x", {}, "s", Generation()) == {"ok": i + 1}
            await ups.close()
        finally:
            srv.close()

    for _ in range(2):  # each run is its own event loop, as two starts of the app are
        asyncio.run(one_app_run())
