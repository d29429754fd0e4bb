# SPDX-License-Identifier: Apache-2.0
"""A lean HTTP/1.1 client for the proxy's one job: POST JSON to an inference server and read its answer.

Why not aiohttp's client: on the proxy's hot path (one upstream call per harness call) aiohttp's `ClientSession`
costs ≈ 0.2 ms CPU per request (request/response objects, trace hooks, timer contexts, multidicts), more than all of
the proxy's own work; this client does the same exchange in a fraction of that (`benchmarks/proxy_overhead.py`).
It implements only what an inference upstream needs:

- keep-alive connection pool per (scheme, host, port), LIFO reuse, idle connections dropped after `idle_s` (kept
  shorter than uvicorn's 5 s keep-alive, vLLM's server, so a reused connection is almost never one the server is
  closing) and as soon as the server closes them;
- bodies framed by `Content-Length`, `Transfer-Encoding: chunked` or connection close; `gzip`/`deflate` decoded;
- a cap on open connections (`limit`; later requests wait for a free slot);
- timeouts: connect (then the caller may try another endpoint: nothing was sent), read (the longest silence while
  waiting for bytes) and an optional total deadline;
- streaming: `UpstreamResponse.chunks()` yields body bytes as they arrive; closing a response before its end closes
  the connection (which aborts the generation upstream).

Errors: `UpstreamConnectError` (no connection: safe to try elsewhere), `UpstreamTimeout`, `UpstreamDisconnected`
(the connection broke or the reply was not HTTP after the request was sent: it may have been processed, so never
retried here). The wire side (a connection, a response's body framing, the errors) is `http_response`. This module
knows nothing of engines, dialects or records.
"""

from __future__ import annotations

import asyncio
import collections
import ssl as _ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from nemo_polar.proxy.http_response import (
    _MAX_HEAD,
    UpstreamConnectError,
    UpstreamDisconnected,
    UpstreamHTTPError,
    UpstreamResponse,
    UpstreamTimeout,
    _Conn,
)

__all__ = [
    "HTTPClient",
    "Target",
    "UpstreamConnectError",
    "UpstreamDisconnected",
    "UpstreamHTTPError",
    "UpstreamResponse",
    "UpstreamTimeout",
]


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed URL: what a request needs, computed once per (base, path)."""

    key: tuple[str, str, int]
    host: str
    port: int
    tls: bool
    request_path: bytes
    host_header: bytes

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported upstream URL scheme in {url!r} (http or https)")
        host = parts.hostname
        if not host:
            raise ValueError(f"no host in upstream URL {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        shown = f"[{host}]" if ":" in host else host
        default = (tls and port == 443) or (not tls and port == 80)
        host_header = shown if default else f"{shown}:{port}"
        return cls((parts.scheme, host, port), host, port, tls, path.encode("ascii"), host_header.encode("ascii"))


class HTTPClient:
    """Keep-alive HTTP/1.1 client for a handful of upstream hosts.

    Args:
        limit: most open connections in all (more requests wait for one to be returned or closed).
        idle_s: idle connections older than this are closed instead of reused.
        ssl_context: for `https` upstreams (default: the system's verified context).
    """

    def __init__(self, *, limit: int = 1024, idle_s: float = 2.0, ssl_context: _ssl.SSLContext | None = None):
        self.limit = limit
        self.idle_s = idle_s
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._open = 0
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    # -- connections --------------------------------------------------------------------------------------------------

    async def _acquire(self, target: Target, connect_timeout: float | None) -> tuple[_Conn, bool]:
        """A connection to `target` and whether it was reused."""
        while True:
            conn = self._reuse(target.key)
            if conn is not None:
                return conn, True
            if self._open < self.limit:
                break
            if self._evict_one():  # an idle connection to another host gives up its slot
                continue
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self._wake_slot()  # pass the slot on
                raise
        self._open += 1
        try:
            conn = await self._connect(target, connect_timeout)
        except BaseException:
            self._open -= 1
            self._wake_slot()
            raise
        return conn, False

    def _reuse(self, key: tuple[str, str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest_ok = time.monotonic() - self.idle_s
        while idle:
            conn = idle.pop()
            if not conn.closed and not conn.eof and not conn.buf and conn.idle_since >= oldest_ok:
                return conn
            self.discard(conn)
        return None

    def _evict_one(self) -> bool:
        for conns in self._idle.values():
            if conns:
                self.discard(conns.pop(0))
                return True
        return False

    async def _connect(self, target: Target, limit_s: float | None) -> _Conn:
        loop = asyncio.get_running_loop()
        ssl: _ssl.SSLContext | None = None
        if target.tls:
            ssl = self._ssl or _ssl.create_default_context()
        try:
            coro = loop.create_connection(
                lambda: _Conn(target.key),
                target.host,
                target.port,
                ssl=ssl,
                server_hostname=target.host if ssl else None,
            )
            _, conn = await asyncio.wait_for(coro, limit_s)
        except TimeoutError as exc:
            raise UpstreamConnectError(f"connect to {target.host}:{target.port} timed out after {limit_s} s") from exc
        except OSError as exc:  # refused, unreachable, name not resolved, TLS handshake failure
            raise UpstreamConnectError(f"cannot connect to {target.host}:{target.port}: {exc}") from exc
        return conn

    def release(self, conn: _Conn) -> None:
        """Return a healthy connection after a complete exchange."""
        if self._closed:
            self.discard(conn)
            return
        conn.idle_since = time.monotonic()
        conn.waiter = None
        self._idle.setdefault(conn.key, []).append(conn)
        self._wake_slot()

    def discard(self, conn: _Conn) -> None:
        """Close a connection and free its slot."""
        if conn.transport is not None and not conn.closed:
            conn.transport.close()
        conn.closed = True
        if conn.transport is not None:
            conn.transport = None
            self._open -= 1
            self._wake_slot()

    def _wake_slot(self) -> None:
        while self._slot_waiters:
            fut = self._slot_waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def close(self) -> None:
        """Close every idle connection; connections in use close when their responses do."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                self.discard(conn)
        self._idle.clear()

    # -- exchange -------------------------------------------------------------------------------------------------------

    @staticmethod
    async def wait(conn: _Conn, read_timeout: float | None, deadline: float | None) -> None:
        """Wait until `conn` receives bytes, EOF, or a timeout passes."""
        loop = asyncio.get_running_loop()
        fut = conn.waiter = loop.create_future()
        limit = None if read_timeout is None else loop.time() + read_timeout
        if deadline is not None and (limit is None or deadline < limit):
            limit = deadline
        timer = None if limit is None else loop.call_at(limit, _expire, fut)
        try:
            await fut
        finally:
            conn.waiter = None
            if timer is not None:
                timer.cancel()
        if fut.done() and isinstance(fut.result(), _Expired):
            conn.abort()
            what = "total deadline passed" if limit == deadline else f"no bytes for {read_timeout} s"
            raise UpstreamTimeout(f"upstream timed out ({what})")

    async def request(
        self,
        method: str,
        target: Target,
        body: bytes = b"",
        *,
        content_type: bytes = b"application/json",
        connect_timeout: float | None = 5.0,
        read_timeout: float | None = 600.0,
        total_timeout: float | None = None,
    ) -> UpstreamResponse:
        """Send one request and return once the response head is in; the caller reads and closes the body."""
        if self._closed:
            raise UpstreamConnectError("the HTTP client is closed")
        loop = asyncio.get_running_loop()
        deadline = None if total_timeout is None else loop.time() + total_timeout
        conn, reused = await self._acquire(target, connect_timeout)
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nAccept: */*\r\n\r\n" % (
            method.encode("ascii"),
            target.request_path,
            target.host_header,
            content_type,
            len(body),
        )
        assert conn.transport is not None
        conn.buf.clear()
        if body and len(body) < 65536:
            conn.transport.write(head + body)
        else:
            conn.transport.write(head)
            if body:
                conn.transport.write(body)
        try:
            return await self._read_head(conn, method, read_timeout, deadline, reused)
        except BaseException:
            conn.abort()
            self.discard(conn)
            raise

    async def _read_head(
        self, conn: _Conn, method: str, read_timeout: float | None, deadline: float | None, reused: bool
    ) -> UpstreamResponse:
        while True:
            end = conn.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.buf) > _MAX_HEAD:
                    raise UpstreamDisconnected("upstream sent an oversized response head")
                if conn.eof:
                    why = f": {conn.error}" if conn.error else ""
                    stale = " (a reused keep-alive connection)" if reused and not conn.buf else ""
                    raise UpstreamDisconnected(f"upstream closed the connection before answering{stale}{why}")
                await self.wait(conn, read_timeout, deadline)
                continue
            raw = bytes(conn.buf[:end])
            del conn.buf[: end + 4]
            lines = raw.split(b"\r\n")
            try:
                version, code = lines[0].split(b" ", 2)[:2]
                status = int(code)
            except ValueError as exc:
                raise UpstreamDisconnected(f"upstream sent a malformed status line {lines[0][:100]!r}") from exc
            if not version.startswith(b"HTTP/1."):
                raise UpstreamDisconnected(f"upstream is not speaking HTTP/1.x ({lines[0][:100]!r})")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(b":")
                if not sep:
                    raise UpstreamDisconnected(f"upstream sent a malformed header line {line[:100]!r}")
                k, v = name.strip().lower().decode("latin-1"), value.strip().decode("latin-1")
                headers[k] = f"{headers[k]}, {v}" if k in headers else v
            if 100 <= status < 200:  # 100 Continue and friends: the real answer follows
                continue
            conn_hdr = headers.get("connection", "").lower()
            keep_alive = version == b"HTTP/1.1" and "close" not in conn_hdr
            te = headers.get("transfer-encoding", "").lower()
            if method == "HEAD" or status in (204, 304):
                mode, length = "length", 0
            elif "chunked" in te:
                mode, length = "chunked", 0
            elif "content-length" in headers:
                try:
                    length = int(headers["content-length"])
                except ValueError as exc:
                    raise UpstreamDisconnected("upstream sent a malformed Content-Length") from exc
                mode = "length"
            else:
                mode, length, keep_alive = "close", 0, False
            return UpstreamResponse(self, conn, status, headers, keep_alive, mode, length, read_timeout, deadline)


class _Expired:
    """Marker result of a waiter whose timer fired first."""


_EXPIRED = _Expired()


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(_EXPIRED)  # type: ignore[arg-type]
