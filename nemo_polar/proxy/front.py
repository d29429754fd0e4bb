# SPDX-License-Identifier: Apache-2.0
"""The proxy's own HTTP/1.1 front: harness calls read and answered without aiohttp's per-request server machinery.

Why: at 64 calls in flight the proxy's CPU per call is what limits a node, and aiohttp's server side of a call (its
request handler task, parser callbacks, `StreamReader`, `BaseRequest`, the chunked `StreamWriter`) costs ≈ 0.03 ms
of it, where reading a request head and writing the chunks directly costs ≈ 0.01 ms (docs/performance.md, "The
HTTP front"). `upstream_http` made the same cut on the client side.

What it serves, and what it leaves to aiohttp: a connection starts here. A request this front is sure of (`POST`,
`HTTP/1.1`, a well-formed head under `MAX_HEAD` bytes, a body framed by one `Content-Length` within the proxy's
`max_body_bytes`, no `Transfer-Encoding`, `Expect` or `Upgrade`, and a path the dialect registry serves, not an admin
or session route; or `GET` / `HEAD /` without a body, a CLI's check that the server is up, which Claude Code sends
before its calls on the same connection) is read here and handed to the proxy's own handler chain
(`Proxy._error_middleware` around `Proxy._dialect_route`, or `Proxy._head`), with a `FrontRequest` in place of
aiohttp's request; the handler's aiohttp response objects
(`web.Response`, `web.StreamResponse`) write through `_Writer`, so the reply's status line, headers and chunking are
aiohttp's own. Anything else (the admin API, `GET /v1/models`, a chunked upload, `Expect: 100-continue`, a malformed
or oversized request) hands the connection over to aiohttp's server, bytes already read included, for the rest of
its life: aiohttp answers it exactly as it answers without this front. Behaviour kept from aiohttp's server as the
proxy runs it (`app.SERVER_OPTIONS`): a client that hangs up cancels its handler; keep-alive (HTTP/1.1's default,
`Connection: close` honoured), idle connections closed after `KEEPALIVE_S`; a handler's unexpected exception is a
500 before the first byte and a dropped connection after it; on shutdown, in-flight calls get the runner's shutdown
timeout to finish, then are cancelled (their failure records say so: `streaming.client_left`).

`FrontSite` is the `web.TCPSite` that serves a runner through this front; `Proxy.site` picks it or aiohttp's own
(`ProxyConfig.http_server`, `polar proxy --http-server lean|aiohttp`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy
from yarl import URL

from nemo_polar.proxy import dialects

__all__ = ["KEEPALIVE_S", "MAX_HEAD", "FrontRequest", "FrontSite", "lean_prepare"]

log = logging.getLogger(__name__)

MAX_HEAD = 32 * 1024  # a longer head goes to aiohttp (whose limits then answer it)
KEEPALIVE_S = 75.0  # aiohttp's keepalive_timeout
_PAUSE_AT = 1024 * 1024  # bytes buffered behind a call in flight before reading pauses (a pipelining client)
_TARGET = re.compile(rb"/[\x21-\x7e]*")
_FIELDS = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*\r\n)*")  # RFC 9110 tokens
_NO_QUERY: MultiDictProxy[str] = MultiDictProxy(MultiDict())
_HANDED_OVER = (b"transfer-encoding", b"expect", b"upgrade")
_METHODS = (b"POST", b"GET", b"HEAD")

Handler = Callable[[Any], Awaitable[web.StreamResponse]]


def parse_head(head: bytes) -> tuple[str, str, list[tuple[str, str]], int, bool] | None:
    """(method, target, header pairs, content length, `Connection: close`) of a request this front serves; None:
    aiohttp's (module docstring). `head` is the bytes before the blank line."""
    line, _, fields = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] not in _METHODS or parts[2] != b"HTTP/1.1" or not _TARGET.fullmatch(parts[1]):
        return None
    if fields and not _FIELDS.fullmatch(fields + b"\r\n"):  # every line `token: value`, no control bytes
        return None
    length = -1
    close = False
    pairs = []
    for field in fields.split(b"\r\n") if fields else ():
        name, _, value = field.partition(b":")
        value = value.strip(b" \t")
        low = name.lower()
        if low == b"content-length":
            if length >= 0 or not value.isdigit():
                return None
            length = int(value)
        elif low in _HANDED_OVER:
            return None
        elif low == b"connection":
            tokens = [t.strip() for t in value.lower().split(b",")]
            if b"upgrade" in tokens:
                return None
            close = close or b"close" in tokens
        pairs.append((name.decode("ascii"), value.decode("utf-8", "surrogateescape")))
    if parts[0] != b"POST":  # GET or HEAD: no body
        return (parts[0].decode(), parts[1].decode("ascii"), pairs, 0, close) if length <= 0 else None
    if length < 0:
        return None
    return "POST", parts[1].decode("ascii"), pairs, length, close


def served_here(method: str, target: str) -> bool:
    """Whether `target` (path and query) is a harness call of the dialect registry, or `GET` / `HEAD /` (a CLI's
    check that the server is up: Claude Code's first request). No other route of the proxy's app is a dialect path
    (`tests/proxy/test_front.py` holds it), so the admin API and `/v1/models` stay aiohttp's."""
    path = target.partition("?")[0]
    if method != "POST":
        return path == "/"
    return dialects.resolve("POST", dialects.split_key_prefix(path)[1]) is not None


class FrontRequest:
    """What the proxy's handlers and aiohttp's response objects read of a request (`web.Request`'s names)."""

    version = HttpVersion11

    def __init__(self, conn: _Conn, method: str, target: str, pairs: list[tuple[str, str]], body: bytes, close: bool):
        self._conn, self.method, self.raw_path = conn, method, target
        self._pairs, self._body, self._close = pairs, body, close
        self._url: URL | None = None
        self._headers: CIMultiDictProxy[str] | None = None
        self._payload_writer = _Writer(conn)

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        if self._headers is None:
            self._headers = CIMultiDictProxy(CIMultiDict(self._pairs))
        return self._headers

    @property
    def rel_url(self) -> URL:
        if self._url is None:
            self._url = URL(self.raw_path, encoded=True)
        return self._url

    @property
    def path(self) -> str:
        return self.rel_url.path

    @property
    def query(self) -> MultiDictProxy[str]:
        return self.rel_url.query if "?" in self.raw_path else _NO_QUERY

    @property
    def keep_alive(self) -> bool:
        return not self._close

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._conn.transport

    async def read(self) -> bytes:
        return self._body

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        signal = self._conn.front.app.on_response_prepare
        if signal:
            await signal.send(self, response)  # type: ignore[arg-type]  # what a handler reads of a request


def lean_prepare(resp: web.StreamResponse, request: Any) -> AbstractStreamWriter | None:
    """`resp.prepare(request)` for a reply on this front, in one call: the status line and headers aiohttp's
    `prepare` sends, in its order (the response's own, then `Content-Length` of a body or `Transfer-Encoding:
    chunked` for a stream, a default `Content-Type`, `Date`, `Server`, and `Connection: close` when the connection
    ends), handed to the request's writer, and the response's state left as aiohttp leaves it, so its `write` and
    `write_eof` are aiohttp's own; its `headers` stay those its handler set (nothing reads them after `prepare`).
    What a status line and set of own headers become is worked out once (`_STARTS`). aiohttp's chain of coroutines
    for the same was ≈ 5 % of the proxy's CPU a call at c=1 (docs/performance.md, "Concurrency 1"). None, with
    nothing done, where aiohttp's `prepare` is needed: another server's request, response-prepare signals, cookies,
    compression, a reply without a body by its status or method, a body that is no bytes, a header aiohttp would
    set already set (but `Connection`), a prepared response, a class with a `prepare` of its own (but those that
    say `lean_prepare = True`)."""
    if type(request) is not FrontRequest or resp._payload_writer is not None or resp._eof_sent:
        return None
    if type(resp).prepare is not web.StreamResponse.prepare and not getattr(resp, "lean_prepare", False):
        return None  # a response with a `prepare` of its own (`web.FileResponse`): it is what knows how
    if resp._cookies or resp._compression or request.method == "HEAD" or request._conn.front.prepare_signals:
        return None
    own = (resp._status, resp._reason, *resp._headers.items())
    start = _STARTS.get(own)
    if start is None:
        start = _start(own, resp._headers)
    if not start:
        return None
    head, typed, connection = start
    writer = request._payload_writer
    if isinstance(resp, web.Response):
        body = resp.body
        if resp._chunked or (body is not None and type(body) is not bytes):
            return None
        n = len(body) if body else 0
        writer.length = n
        parts = [head, b"Content-Length: %d\r\n" % n]
    else:  # a stream: chunked (HTTP/1.1 is all this front serves)
        writer.enable_chunking()
        n = -1
        parts = [head, b"Transfer-Encoding: chunked\r\n"]
    if n != 0 and not typed:
        parts.append(b"Content-Type: application/octet-stream\r\n")
    parts += (b"Date: ", rfc822_formatted_time().encode("ascii"), _SERVER_LINE)
    keep_alive = request.keep_alive if resp._keep_alive is None else resp._keep_alive
    if not keep_alive and not connection:
        parts.append(b"Connection: close\r\n")
    parts.append(b"\r\n")
    resp._req = request  # type: ignore[assignment]  # what the response reads of a request
    resp._payload_writer, resp._keep_alive, resp._must_be_empty_body = writer, keep_alive, False
    writer.head = b"".join(parts)
    if resp._send_headers_immediately:
        writer.send_headers()
    return writer


def _start(own: tuple[Any, ...], headers: CIMultiDict[str]) -> tuple[bytes, bool, bool] | tuple[()]:
    """What `lean_prepare` keeps of a status and own headers: their lines, whether they hold a `Content-Type` and
    a `Connection`; () where it leaves them to aiohttp (a status without a body, a header aiohttp sets itself)."""
    status = own[0]
    if status < 200 or status in (204, 304) or any(name in headers for name in _SET_HERE):
        start: tuple[bytes, bool, bool] | tuple[()] = ()
    else:
        head = _head(f"HTTP/1.1 {status} {own[1]}", headers)[:-2]
        start = (head, hdrs.CONTENT_TYPE in headers, hdrs.CONNECTION in headers)
    if len(_STARTS) >= 256:  # a handler that varies its headers call by call: no more than this is kept
        _STARTS.clear()
    _STARTS[own] = start
    return start


_SET_HERE = (hdrs.CONTENT_LENGTH, hdrs.TRANSFER_ENCODING, hdrs.DATE, hdrs.SERVER)
_SERVER_LINE = f"\r\nServer: {SERVER_SOFTWARE}\r\n".encode()
_STARTS: dict[tuple[Any, ...], tuple[bytes, bool, bool] | tuple[()]] = {}  # (status, reason, own headers) -> `_start`


def _head(status_line: str, headers: CIMultiDict[str]) -> bytes:
    """A response's status line and headers as they go on the wire."""
    lines = [status_line]
    for k, v in headers.items():
        if "\r" in k or "\n" in k or "\r" in v or "\n" in v:
            raise ValueError(f"newline in header {k!r}")
        lines.append(f"{k}: {v}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8")


class _Writer(AbstractStreamWriter):
    """A response's bytes onto the connection: the status line and headers as aiohttp's response hands them over
    (sent with the first body bytes, or at once on `send_headers`), the body chunked when aiohttp says so."""

    def __init__(self, conn: _Conn):
        self.conn = conn
        self.chunked = False
        self.head: bytes | None = None
        self.started = False  # any byte of the response sent
        self.eof = False
        self.buffer_size = 0
        self.output_size = 0
        self.length = 0

    def enable_chunking(self) -> None:
        self.chunked = True

    def enable_compression(self, encoding: str = "deflate", strategy: int | None = None) -> None:
        raise RuntimeError("the proxy's HTTP front does not compress responses")

    async def write_headers(self, status_line: str, headers: CIMultiDict[str]) -> None:
        self.head = _head(status_line, headers)

    def send_headers(self) -> None:
        if self.head is not None:
            self._send([])

    def _send(self, parts: list[Any]) -> None:
        t = self.conn.transport
        if t is None or t.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        if self.head is not None:
            parts.insert(0, self.head)
            self.head = None
        t.writelines(parts)
        self.started = True

    async def write(self, chunk: bytes | bytearray | memoryview) -> None:
        n = len(chunk)
        if not n:
            return
        self.output_size += n
        parts: list[Any] = [b"%x\r\n" % n, chunk, b"\r\n"] if self.chunked else [chunk]
        self._send(parts)
        if self.conn.paused:
            await self.conn.drain()

    async def write_eof(self, chunk: bytes = b"") -> None:
        if self.eof:
            return
        self.output_size += len(chunk)
        if self.chunked:
            self._send([b"%x\r\n" % len(chunk), chunk, b"\r\n0\r\n\r\n"] if chunk else [b"0\r\n\r\n"])
        elif chunk or self.head is not None:
            self._send([chunk] if chunk else [])
        self.eof = True
        if self.conn.paused:
            await self.conn.drain()

    async def drain(self) -> None:
        if self.conn.paused:
            await self.conn.drain()


class _Conn(asyncio.Protocol):
    """One client connection while this front serves it (module docstring)."""

    def __init__(self, front: Front):
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head: tuple[str, str, list[tuple[str, str]], int, bool, int] | None = None  # the request being read
        self.task: asyncio.Task[None] | None = None
        self.paused = False  # the transport asked us to stop writing
        self.reading = True
        self._drained: asyncio.Future[None] | None = None
        self._idle: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.front.conns.add(self)
        self._arm_idle()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.front.conns.discard(self)
        self.transport = None
        self._disarm_idle()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client hung up: its handler stops (aiohttp's handler_cancellation)
        self._wake(ConnectionResetError("the connection was lost"))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake(None)

    def data_received(self, data: bytes) -> None:
        if self._idle is not None:  # a request is coming: no time limit on reading it, as in aiohttp's server
            self._disarm_idle()
        self.buf += data
        if self.task is None:
            self._next()
        elif len(self.buf) > _PAUSE_AT and self.reading and self.transport is not None:
            self.reading = False
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # the transport closes: a call in flight is cancelled (connection_lost)

    # -- requests ------------------------------------------------------------------------------------------------

    def _next(self) -> None:
        """Start the next complete request in the buffer, hand the connection to aiohttp, or wait for bytes."""
        buf = self.buf
        if self.head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._hand_over()
                return
            parsed = parse_head(bytes(buf[:end]))
            if parsed is None or parsed[3] > self.front.max_body or not served_here(parsed[0], parsed[1]):
                self._hand_over()
                return
            self.head = (*parsed, end + 4)
        method, target, pairs, length, close, start = self.head
        if len(buf) < start + length:
            return
        body = bytes(buf[start : start + length])
        del buf[: start + length]
        self.head = None
        self._disarm_idle()
        req = FrontRequest(self, method, target, pairs, body, close)
        self.front.served += 1
        self.task = asyncio.get_running_loop().create_task(self._serve(req))

    async def _serve(self, req: FrontRequest) -> None:
        resp: web.StreamResponse | None = None
        try:
            try:
                resp = await self.front.handler(req)
            except web.HTTPException as exc:  # what aiohttp would send as the response
                resp = exc
            if lean_prepare(resp, req) is None:
                await resp.prepare(req)  # type: ignore[arg-type]  # FrontRequest is what the response reads of one
                await resp.write_eof()
            elif type(resp) is web.Response:  # its body with its head, then the state `write_eof` leaves
                await req._payload_writer.write_eof(cast(bytes, resp.body or b""))
                resp._eof_sent, resp._req, resp._payload_writer = True, None, None
                resp._body_length = req._payload_writer.output_size
            else:
                await resp.write_eof()
        except asyncio.CancelledError:
            self.close()
            raise
        except ConnectionResetError:
            resp = None
        except Exception:
            log.exception("error handling %s %s", req.method, req.raw_path)
            resp = None
            if not req._payload_writer.started and self.transport is not None:
                with contextlib.suppress(Exception):
                    err = web.Response(status=500, text="500 Internal Server Error\n\nServer got itself in trouble")
                    await err.prepare(req)  # type: ignore[arg-type]
                    await err.write_eof()
        finally:
            self.task = None
        if resp is None or not req.keep_alive or not resp.keep_alive or not req._payload_writer.eof:
            self.close()
            return
        if self.transport is None or self.transport.is_closing():
            return
        self._arm_idle()
        if not self.reading:
            self.reading = True
            self.transport.resume_reading()
        if self.buf:
            self._next()

    def _hand_over(self) -> None:
        """From here on the connection is aiohttp's, with what was read of it."""
        t = self.transport
        if t is None:
            return
        self.front.conns.discard(self)
        self.front.handed_over += 1
        self._disarm_idle()
        self.transport = None
        data, self.buf = bytes(self.buf), bytearray()
        handler = self.front.aiohttp_protocol()
        t.set_protocol(handler)
        handler.connection_made(t)
        if self.paused:
            handler.pause_writing()
        if not self.reading:
            t.resume_reading()
        if data:
            handler.data_received(data)

    # -- flow control, idleness, closing -------------------------------------------------------------------------

    async def drain(self) -> None:
        if self.transport is None:
            raise ConnectionResetError("the connection was lost")
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()
        await self._drained

    def _wake(self, exc: BaseException | None) -> None:
        fut, self._drained = self._drained, None
        if fut is not None and not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)
                fut.exception()  # retrieved: nobody may be waiting any more

    def _arm_idle(self) -> None:
        self._disarm_idle()
        self._idle = asyncio.get_running_loop().call_later(KEEPALIVE_S, self.close)

    def _disarm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Front:
    """The protocol factory of `FrontSite`: one `_Conn` per connection, aiohttp's server for what it hands over."""

    def __init__(self, runner: web.AppRunner, handler: Handler, max_body: int):
        assert runner.server is not None, "runner.setup() first"
        self.aiohttp_protocol = runner.server
        self.app = runner.app
        self.handler = handler
        self.max_body = max_body
        self.conns: set[_Conn] = set()
        self.served = 0  # requests read and answered here
        self.handed_over = 0  # connections handed to aiohttp's server
        self.prepare_signals = bool(self.app.on_response_prepare)  # fixed: the runner's setup froze the app

    def __call__(self) -> _Conn:
        return _Conn(self)

    async def shutdown(self, grace_s: float) -> None:
        """Close idle connections; give calls in flight `grace_s` seconds, then cancel them (aiohttp's order)."""
        for conn in list(self.conns):
            if conn.task is None:
                conn.close()
        tasks = [c.task for c in self.conns if c.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            for t in late:
                t.cancel()
            if late:
                await asyncio.wait(late)
        for conn in list(self.conns):
            conn.close()


class FrontSite(web.TCPSite):
    """A `web.TCPSite` whose connections this module's front serves first (module docstring)."""

    def __init__(self, runner: web.AppRunner, handler: Handler, max_body: int, host: str, port: int):
        super().__init__(runner, host, port)
        self.front = Front(runner, handler, max_body)

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        self._server = await asyncio.get_running_loop().create_server(
            self.front, self._host, self._port, backlog=self._backlog
        )
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port

    async def stop(self) -> None:
        await super().stop()  # the listening socket closed
        await self.front.shutdown(getattr(self._runner, "_shutdown_timeout", 60.0))
