# SPDX-License-Identifier: Apache-2.0
"""The upstream client's wire side: one pooled connection (`_Conn`), a response's body framing (`UpstreamResponse`:
`Content-Length`, chunked, read-to-close; gzip/deflate), and the client's errors.

`nemo_polar.proxy.upstream_http.HTTPClient` opens connections and sends requests; once a response's head is read,
this module reads its body as it arrives and hands the connection back to the pool (or drops it) at the end. It
knows nothing of engines, dialects or records.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncGenerator
from typing import Protocol, cast

from nemo_polar.errors import PolarError

__all__ = [
    "UpstreamConnectError",
    "UpstreamDisconnected",
    "UpstreamHTTPError",
    "UpstreamResponse",
    "UpstreamTimeout",
]

_MAX_HEAD = 64 * 1024
_PAUSE_AT = 4 * 1024 * 1024  # buffered, unread body bytes before the socket stops being read
_SIZE, _DATA, _CRLF, _TRAILER = range(4)  # where a chunked body's parser is


class UpstreamHTTPError(PolarError):
    """Base of this client's errors."""


class UpstreamConnectError(UpstreamHTTPError):
    """No connection could be made (refused, unreachable, name not resolved, connect timeout); nothing was sent."""


class UpstreamTimeout(UpstreamHTTPError):
    """The upstream stayed silent longer than the read timeout, or the total deadline passed."""


class UpstreamDisconnected(UpstreamHTTPError):
    """The connection broke, or the reply was not valid HTTP/1.x, after the request was sent."""


class _Pool(Protocol):
    """What a response needs from the client that made it."""

    async def wait(self, conn: _Conn, read_timeout: float | None, deadline: float | None) -> None: ...

    def release(self, conn: _Conn) -> None: ...

    def discard(self, conn: _Conn) -> None: ...


class _Conn(asyncio.Protocol):
    """One TCP (or TLS) connection; bytes received are appended to `buf` and wake the reader."""

    __slots__ = ("buf", "closed", "eof", "error", "idle_since", "key", "paused", "transport", "waiter")

    def __init__(self, key: tuple[str, str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[None] | None = None
        self.eof = False
        self.closed = False
        self.error: BaseException | None = None
        self.idle_since = 0.0
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > _PAUSE_AT and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = self.eof = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def consumed(self) -> None:
        """The reader took bytes out of `buf`: read the socket again if it was paused."""
        if self.paused and len(self.buf) < _PAUSE_AT // 2 and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


def _head(buf: bytearray, n: int) -> bytes:
    """The first `n` bytes of `buf` as bytes, copied once (`bytes(buf[:n])` copies them twice: into a new bytearray,
    then into the bytes). The view is released before the caller deletes them from `buf`."""
    if n == len(buf):
        return bytes(buf)
    with memoryview(buf) as view:
        return view[:n].tobytes()


class UpstreamResponse:
    """An HTTP response whose head has been read; read the body with `read()` or `chunks()`, then `close()`."""

    __slots__ = (
        "_chunk_left",
        "_client",
        "_conn",
        "_cstate",
        "_deadline",
        "_decoder",
        "_done",
        "_left",
        "_mode",
        "_read_timeout",
        "headers",
        "keep_alive",
        "status",
    )

    def __init__(
        self,
        client: _Pool,
        conn: _Conn,
        status: int,
        headers: dict[str, str],
        keep_alive: bool,
        mode: str,
        length: int,
        read_timeout: float | None,
        deadline: float | None,
    ) -> None:
        self._client = client
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers
        self.keep_alive = keep_alive
        self._mode = mode  # "length" | "chunked" | "close"
        self._left = length
        self._chunk_left = 0  # chunked: data bytes left in the current chunk
        self._cstate = _SIZE
        self._done = mode == "length" and length == 0
        self._read_timeout = read_timeout
        self._deadline = deadline
        enc = headers.get("content-encoding", "identity").strip().lower()
        if enc in ("gzip", "x-gzip"):
            self._decoder: zlib._Decompress | None = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif enc == "deflate":
            self._decoder = zlib.decompressobj()
        elif enc in ("identity", ""):
            self._decoder = None
        else:
            raise UpstreamDisconnected(f"unsupported content-encoding {enc!r}")
        if self._done:
            self._finish()

    async def read(self) -> bytes:
        """The whole body (then the connection goes back to the pool)."""
        parts = [piece async for piece in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """Body bytes as they arrive: each item is everything decodable that was available at one wake-up."""
        try:
            while not self._done:
                conn = self._conn
                if conn is None:
                    raise UpstreamDisconnected("response already closed")
                piece = self._take(conn)
                if piece:
                    yield self._decode(piece)
                    continue
                if self._done:
                    break
                if conn.eof:
                    if self._mode == "close":
                        self._done = True
                        break
                    why = f": {conn.error}" if conn.error else ""
                    raise UpstreamDisconnected(f"upstream closed the connection mid-body{why}")
                await self._client.wait(conn, self._read_timeout, self._deadline)
            if self._decoder is not None:
                tail = self._decoder.flush()
                self._decoder = None
                if tail:
                    yield tail
        except BaseException:
            self.close()
            raise
        self._finish()

    def _decode(self, piece: bytes) -> bytes:
        if self._decoder is None:
            return piece
        try:
            return self._decoder.decompress(piece)
        except zlib.error as exc:
            raise UpstreamDisconnected(f"upstream sent an undecodable body: {exc}") from exc

    def _take(self, conn: _Conn) -> bytes:
        """Remove and return the body bytes available in the buffer (de-chunked); sets `_done` at the end."""
        buf = conn.buf
        if self._mode == "length":
            n = min(self._left, len(buf))
            if not n:
                return b""
            piece = _head(buf, n)
            del buf[:n]
            self._left -= n
            self._done = self._left == 0
            conn.consumed()
            return piece
        if self._mode == "close":
            if not buf:
                return b""
            piece = bytes(buf)
            buf.clear()
            conn.consumed()
            return piece
        out = []
        state = self._cstate
        while True:
            if state == _SIZE:
                i = buf.find(b"\r\n")
                if i < 0:
                    if len(buf) > _MAX_HEAD:
                        raise UpstreamDisconnected("upstream sent an oversized chunk header")
                    break
                try:
                    size = int(bytes(buf[:i]).split(b";", 1)[0].strip(), 16)
                except ValueError as exc:
                    raise UpstreamDisconnected("upstream sent a malformed chunk size") from exc
                del buf[: i + 2]
                if size:
                    self._chunk_left, state = size, _DATA
                else:
                    state = _TRAILER
            elif state == _DATA:
                n = min(self._chunk_left, len(buf))
                if not n:
                    break
                out.append(_head(buf, n))
                del buf[:n]
                self._chunk_left -= n
                if not self._chunk_left:
                    state = _CRLF
            elif state == _CRLF:
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise UpstreamDisconnected("upstream sent a chunk without its CRLF")
                del buf[:2]
                state = _SIZE
            else:  # _TRAILER: header lines until an empty one
                i = buf.find(b"\r\n")
                if i < 0:
                    if len(buf) > _MAX_HEAD:
                        raise UpstreamDisconnected("upstream sent oversized trailers")
                    break
                del buf[: i + 2]
                if i == 0:
                    self._done = True
                    break
        self._cstate = state
        conn.consumed()
        return out[0] if len(out) == 1 else b"".join(out)

    def _finish(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self.keep_alive and not conn.buf and not conn.closed:
            self._client.release(conn)
        else:
            self._client.discard(conn)

    def close(self) -> None:
        """Done with this response: a fully read one returns its connection to the pool, any other closes it."""
        conn = self._conn
        if conn is None:
            return
        if not self._done:
            try:
                self._take(conn)  # the rest may already be buffered (a stream's last chunk after `[DONE]`)
            except UpstreamDisconnected:
                pass
        if not self._done:
            conn.abort()
        self._finish()  # a connection not fully read is discarded, not pooled

    async def drain(self, grace_s: float = 0.05) -> None:
        """Discard the rest of the body for at most `grace_s`, then `close()`.

        For a stream whose payload is complete (`[DONE]` seen) but whose framing is not (the terminating chunk
        follows in another segment): waiting a moment for it lets the connection be reused instead of closed.
        """
        conn = self._conn
        try:
            if conn is not None and not self._done:
                deadline = asyncio.get_running_loop().time() + grace_s
                while not self._done and not conn.eof:
                    self._take(conn)
                    if not self._done:
                        await self._client.wait(conn, None, deadline)
                if not self._done:
                    self._take(conn)
        except UpstreamHTTPError:
            pass
        finally:
            self.close()
