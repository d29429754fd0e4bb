# SPDX-License-Identifier: Apache-2.0
"""The streamed reply: server-sent events in the caller's dialect, with the record committed before the last one.

Order (docs/contracts.md, durability): a pending placeholder (the record so far without its normalised request, which
repeats the prompt: `RecordStore.put_pending`) is on disk before the first byte leaves; each batch of
events that arrived together is rendered and written in one socket write (adjacent pieces of the same text merged
into one delta; the headers leave with the first batch); the record is committed, and only then is the terminal
event written, with the end of the body. A failure before the first
byte is a normal HTTP error in the caller's shape; a failure after it is a failure record and a dropped connection
(the client must not see a clean end of an answer that was cut); a client that leaves is a failure record too.

Early headers: a long prompt on a busy engine can take minutes to its first token, and some harnesses give up on a
response whose headers have not come (Gemini CLI's fetch: 60 s, then it retries the call). When the first event has not
come `headers_after_s` after the call began, the status line and headers leave alone (no SSE comment: Google's stream
parser accepts none; Google's calls get newlines, below). A failure after that is a dropped connection; while no event
has been sent, the plan step is given back (`give_back`), so the client's retry gets the same step. A call that arrives
while admission is paused (a weight update) waits for it inside the reply (`admit`), under the same timer: a long pause
sends the early headers too, and a wait past the proxy's `pause_wait_s` is then a dropped connection, not a 503.

A client that hangs up: the proxy's server cancels the handler (`front._Conn.connection_lost`, and aiohttp's with
`app.SERVER_OPTIONS`); before the first event the upstream call is closed and `client_left` gives the plan step back
and writes a `client_disconnected` failure record; after it, the same failure record as a write that fails.

Google's plain `generateContent` (`reply_plain`): Gemini CLI's fetch has the same 60 s headers deadline for its
non-streamed calls (the routing classifier, the next-speaker and loop checks), which queue behind other sessions'
prefills on a busy engine; so a dialect module with `EARLY_PLAIN_HEADERS` gets the same early headers for a plain call
(`Content-Type: application/json`, chunked): the JSON body then leaves in one write once the record is committed. The
other dialects' plain calls keep their headers until the answer, so an upstream failure stays a retryable 5xx in the
caller's shape (the Anthropic and OpenAI SDKs retry a failed request, but not a body that breaks after a 200).
The same fetch gives up on a body that stays idle for 300 s, so after Google's early headers a newline
(`EARLY_KEEPALIVE`) leaves every `headers_after_s` until the first event or the answer: JSON allows whitespace before
a value, and Gemini's SSE parser (`^\\s*data: `) skips it before an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from types import ModuleType
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from nemo_polar.proxy import recording
from nemo_polar.proxy.engines.base import EngineCall, Generation
from nemo_polar.proxy.front import lean_prepare
from nemo_polar.proxy.normalized import ChatRequest, ProviderError, StreamEvent
from nemo_polar.proxy.store import RecordStore, StoreClosed, StoreWriteError
from nemo_polar.types import CompletionRecord

__all__ = ["client_left", "coalesce", "reply_plain", "reply_stream"]

log = logging.getLogger(__name__)

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}


async def reply_stream(
    request: web.Request,
    mod: ModuleType,
    req: ChatRequest,
    rec: CompletionRecord,
    call: EngineCall,
    events: AsyncGenerator[list[StreamEvent], None],
    gen: Generation,
    store: RecordStore,
    fail_early: Callable[[ProviderError], Awaitable[web.Response]],
    *,
    headers_after_s: float | None = None,
    give_back: Callable[[], None] | None = None,
    admit: Callable[[], Awaitable[None]] | None = None,
) -> web.StreamResponse:
    """Stream `events` (which fill `gen`) to the client; `fail_early` answers an error raised before any byte.

    `headers_after_s`: send the headers alone if the first event takes longer (module docstring); `give_back` returns
    the call's plan step when the stream fails after those headers and before any event; `admit`: awaited before the
    first event (a paused admission's wait, under the early headers' timer)."""
    pending = store.put_pending(rec)
    headers = _SSE_HEADERS
    if req.extra.get("stream_format") == "json_array":  # Google's streamGenerateContent without alt=sse
        headers = {**_SSE_HEADERS, "Content-Type": "application/json"}
    early: _EarlyHeaders | None = None
    timer: asyncio.TimerHandle | None = None
    if headers_after_s is not None:
        early = _EarlyHeaders(request, pending, headers, _keepalive(mod, headers_after_s))
        timer = asyncio.get_running_loop().call_later(headers_after_s, early.start)

    first: list[StreamEvent] | None = None
    try:  # until the response exists: a cancellation here means nothing of the answer reached the client
        try:
            if admit is not None:
                await admit()
            first = await events.__anext__()
        except StopAsyncIteration:
            pass
        except ProviderError as err:
            if early is None or early.task is None:  # nothing sent yet: a proper HTTP error in the caller's shape
                await _quiet(pending)
                return await fail_early(err)
            return await early.failed(store, rec, call, recording.error_dict(err), give_back)
        finally:
            if timer is not None:
                timer.cancel()
        if early is not None and early.task is not None:
            try:
                resp = await early.response()
            except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
                await events.aclose()
                error = {"type": "client_disconnected", "message": f"the client went away before the answer ({exc})"}
                return await early.failed(store, rec, call, error, give_back)
        else:
            await pending  # the placeholder is on disk before the first byte leaves
            resp = _SSEResponse(headers=headers)
    except asyncio.CancelledError:  # the client hung up (module docstring)
        if early is not None:
            early.cancel()
        await events.aclose()  # the upstream call is closed: the engine stops working on the answer
        await client_left(request, store, rec, call, give_back)
        raise
    renderer = mod.StreamRenderer(req, "resp_" + rec.id)
    sent = False
    try:
        if not resp.prepared:
            await resp.prepare(request)
        if first is not None:
            await _write(resp, _render(renderer, first))
            sent = True
            async for batch in events:
                await _write(resp, _render(renderer, batch))
    except ProviderError as err:  # upstream broke mid-stream: the client cannot get a clean ending
        await commit_failure(store, rec, call, recording.error_dict(err))
        _drop_connection(request)
        return resp
    except (ConnectionResetError, aiohttp.ClientConnectionResetError, asyncio.CancelledError) as exc:
        await events.aclose()
        if not sent and give_back is not None:
            give_back()  # nothing of the answer reached the client: its retry gets the same plan step
        error = {"type": "client_disconnected", "message": f"the client went away mid-stream ({type(exc).__name__})"}
        await asyncio.shield(commit_failure(store, rec, call, error))
        if isinstance(exc, asyncio.CancelledError):
            raise
        return resp
    assert gen.result is not None
    try:
        await store.commit(recording.completed(rec, call, gen))  # durability: committed before the terminal event
    except StoreWriteError as exc:  # not kept: no clean ending either, so the client retries the call
        log.warning("stream %s not recorded (%s): connection dropped before the terminal event", rec.id, exc)
        _drop_connection(request)
        return resp
    try:
        await resp.write_eof(b"".join(renderer.finish(gen.result)))  # the terminal event and the body's end: one write
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("client of %s left before the terminal event", rec.id)
    return resp


async def reply_plain(
    request: web.Request,
    mod: ModuleType,
    req: ChatRequest,
    rec: CompletionRecord,
    call: EngineCall,
    answer: Callable[[], Awaitable[Generation]],
    store: RecordStore,
    fail_early: Callable[[ProviderError], Awaitable[web.Response]],
    *,
    headers_after_s: float | None,
    give_back: Callable[[], None],
    admit: Callable[[], Awaitable[None]] | None = None,
) -> web.StreamResponse:
    """A plain call's answer (`answer()`: the generation), committed before it leaves; `fail_early` answers an error
    raised before any byte. With `headers_after_s` the headers leave alone if the answer takes longer (module
    docstring: Google's plain calls); without, they leave with the answer. `admit`: awaited before `answer()` (a
    paused admission's wait, under the early headers' timer)."""
    run = answer if admit is None else functools.partial(_admitted, admit, answer)
    task = None if headers_after_s is None else asyncio.ensure_future(run())
    early: _EarlyHeaders | None = None
    resp: web.StreamResponse | None = None
    committing = False
    try:
        try:
            if task is None:
                gen = await run()  # a cancellation reaches the upstream call through this await
            else:
                done, _ = await asyncio.wait((task,), timeout=headers_after_s)
                if not done:
                    pending = store.put_pending(rec)
                    early = _EarlyHeaders(
                        request, pending, {"Content-Type": "application/json"}, _keepalive(mod, headers_after_s)
                    )
                    early.start()
                gen = await task
        except ProviderError as err:
            if early is None:
                return await fail_early(err)
            return await early.failed(store, rec, call, recording.error_dict(err), give_back)
        if early is not None:
            try:
                resp = await early.response()
            except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
                error = {"type": "client_disconnected", "message": f"the client went away before the answer ({exc})"}
                return await early.failed(store, rec, call, error, give_back)
        assert gen.result is not None
        committing = True  # from here the record is the answer's, whether or not the client reads it
        await store.commit(recording.completed(rec, call, gen))
    except asyncio.CancelledError:  # the client hung up: the upstream call is closed, nothing reached the client
        if early is not None:
            early.cancel()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task  # its upstream call closed before the record says so
        if not committing:
            await client_left(request, store, rec, call, give_back)
        raise
    body = orjson.dumps(mod.render_response(gen.result, req))
    if resp is None:
        return web.Response(body=body, content_type="application/json")
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await resp.write_eof(body)
    return resp


async def _admitted(admit: Callable[[], Awaitable[None]], answer: Callable[[], Awaitable[Generation]]) -> Generation:
    await admit()
    return await answer()


class _SSEResponse(web.StreamResponse):
    """A stream whose status line and headers leave with its first bytes (aiohttp's `Response` does the same): one
    socket write fewer per stream. On the proxy's own HTTP front it is prepared in one call (`front.lean_prepare`)."""

    _send_headers_immediately = False
    lean_prepare = True  # its `prepare` is `front.lean_prepare`'s

    async def prepare(self, request: Any) -> AbstractStreamWriter | None:
        writer = lean_prepare(self, request)
        return writer if writer is not None else await super().prepare(request)


class _EarlyHeaders:
    """The status line and headers of a stream whose first event is slow, sent alone once the placeholder is on disk;
    with `keepalive` (bytes, seconds), those bytes every so many seconds until the answer's first write."""

    def __init__(
        self,
        request: web.Request,
        pending: asyncio.Future[None],
        headers: dict[str, str],
        keepalive: tuple[bytes, float] | None = None,
    ) -> None:
        self.request, self.pending, self.headers, self.keepalive = request, pending, headers, keepalive
        self.task: asyncio.Task[web.StreamResponse] | None = None
        self.beat: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._send())

    async def _send(self) -> web.StreamResponse:
        await self.pending
        resp = web.StreamResponse(headers=self.headers)  # aiohttp's default: the headers leave at prepare()
        await resp.prepare(self.request)
        if self.keepalive is not None:
            self.beat = asyncio.ensure_future(self._keep_alive(resp, *self.keepalive))
        return resp

    async def _keep_alive(self, resp: web.StreamResponse, data: bytes, every_s: float) -> None:
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            while True:
                await asyncio.sleep(every_s)
                await resp.write(data)  # one transport write (a chunk): never split by the answer's first write

    def _stop_beat(self) -> None:
        if self.beat is not None:
            self.beat.cancel()

    async def response(self) -> web.StreamResponse:
        """The prepared response, its keep-alive stopped: the caller writes the answer next."""
        assert self.task is not None
        try:
            return await self.task
        finally:
            self._stop_beat()

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self._stop_beat()

    async def failed(
        self,
        store: RecordStore,
        rec: CompletionRecord,
        call: EngineCall,
        error: dict[str, Any],
        give_back: Callable[[], None] | None,
    ) -> web.StreamResponse:
        """The call failed after the headers left and before any event: a failure record, the plan step given back
        (the client saw nothing of the answer and will retry), and a dropped connection."""
        assert self.task is not None
        with contextlib.suppress(Exception):
            await self.task
        self._stop_beat()
        if give_back is not None:
            give_back()
        await commit_failure(store, rec, call, error)
        _drop_connection(self.request)
        if not self.task.cancelled() and self.task.exception() is None:  # done: awaited above
            return self.task.result()
        return web.StreamResponse()  # the client left before its headers: nothing more is written


async def commit_failure(
    store: RecordStore, rec: CompletionRecord, call: EngineCall | None, error: dict[str, Any]
) -> None:
    """The failure record of a call whose client can no longer be told (a cut stream, a client that hung up)."""
    log.info("call %s failed: %s", rec.id, error)
    try:
        await store.commit(recording.failed(rec, error, call))
    except (StoreWriteError, StoreClosed) as exc:  # the answer is already lost to the client; the disk (or a
        log.warning("call %s: failure record not kept (%s)", rec.id, exc)  # shutdown) is the second failure


async def client_left(
    request: web.Request,
    store: RecordStore,
    rec: CompletionRecord,
    call: EngineCall | None,
    give_back: Callable[[], None] | None,
) -> None:
    """A call whose handler was cancelled before any of its answer reached the client: the plan step given back and
    a failure record, `client_disconnected` (its client hung up) or `cancelled` (the connection still open: the
    server is stopping); the record is written even if the handler is cancelled again."""
    if give_back is not None:
        give_back()
    if request.transport is None or request.transport.is_closing():
        error = {"type": "client_disconnected", "message": "the client went away before the answer"}
    else:
        error = {"type": "cancelled", "message": "the call was cancelled before the answer (the server is stopping)"}
    await asyncio.shield(commit_failure(store, rec, call, error))


def _keepalive(mod: ModuleType, every_s: float | None) -> tuple[bytes, float] | None:
    data = vars(mod).get("EARLY_KEEPALIVE")  # Google's (module docstring); a getattr miss costs 10x
    return None if data is None or every_s is None else (data, every_s)


def _render(renderer: Any, batch: list[StreamEvent]) -> list[bytes]:
    """Frames for events that arrived together; adjacent pieces of the same text are sent as one delta."""
    if len(batch) == 1:
        frames: list[bytes] = renderer.feed(batch[0])
        return frames
    frames = []
    for ev in coalesce(batch):
        frames += renderer.feed(ev)
    return frames


def coalesce(batch: list[StreamEvent]) -> list[StreamEvent]:
    """Merge adjacent text / reasoning / tool-argument pieces of one batch (tool-call starts stay separate)."""
    out: list[StreamEvent] = []
    parts: list[str] = []
    for ev in batch:
        if ev.kind != "tool_call" and out and out[-1].kind == ev.kind and out[-1].index == ev.index:
            parts.append(ev.text)
            continue
        if len(parts) > 1:
            out[-1] = StreamEvent(out[-1].kind, text="".join(parts), index=out[-1].index)
        out.append(ev)
        parts = [ev.text]
    if len(parts) > 1:
        out[-1] = StreamEvent(out[-1].kind, text="".join(parts), index=out[-1].index)
    return out


async def _write(resp: web.StreamResponse, frames: list[bytes]) -> None:
    if frames:
        await resp.write(frames[0] if len(frames) == 1 else b"".join(frames))


async def _quiet(fut: asyncio.Future[None]) -> None:
    with contextlib.suppress(Exception):
        await fut


def _drop_connection(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()
