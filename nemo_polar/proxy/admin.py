# SPDX-License-Identifier: Apache-2.0
"""The proxy's admin API and the admission gate it controls (pause / resume around a weight update).

Routes (control token: `Authorization: Bearer <token>` or `x-polar-control-token`; errors are plain
`{"error": {"message": ...}}` JSON): `POST /sessions`, `GET /sessions/{id}`, `GET /sessions/{id}/records`,
`POST /sessions/{id}/close`, `POST /admin/pause`, `POST /admin/resume`, `GET|POST /admin/policy_version`,
`GET /admin/status`. Harness calls and their provider shapes are `nemo_polar.proxy.app`'s.

`GET /sessions/{id}/records?after_seq=N&limit=M[&encoding=plain|compact]` pages a session's records in `seq` order
(`{"records": [...], "next_after_seq": N | null}`): token ids and logprobs as plain JSON arrays by default
(`encoding=plain`; a non-finite logprob is spelled as a string, `"-inf"`), or as the store keeps them with
`encoding=compact` (`"b64:i32:…"` little-endian int32 ids, `"b64:f64:…"` float64 logprobs; cheaper for large pages;
`nemo_polar.types.decode_array` reads both forms).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from nemo_polar.proxy.normalized import ProviderError
from nemo_polar.proxy.sessions import Session, SessionError
from nemo_polar.proxy.tuning import huge_pages_status, loop_name
from nemo_polar.types import CompletionRecord

if TYPE_CHECKING:
    from nemo_polar.proxy.app import Proxy

__all__ = ["AdminAPI", "Admission"]

_SESSION_FIELDS = {"session_id", "task_id", "sampling", "plan", "models", "metadata"}


class Admission:
    """Counts generations in flight and holds new ones while paused (they wait up to `pause_wait_s`, then 503)."""

    def __init__(self, pause_wait_s: float):
        self.pause_wait_s = pause_wait_s
        self.admitting = asyncio.Event()
        self.idle = asyncio.Event()
        self.in_flight = 0

    def open(self) -> None:
        self.admitting.set()
        self.idle.set()

    async def admit(self) -> None:
        if self.admitting.is_set():
            return
        try:
            await asyncio.wait_for(self.admitting.wait(), timeout=self.pause_wait_s)
        except TimeoutError as exc:
            raise ProviderError(
                503, "overloaded", "generation is paused for a weight update", retry_after_s=5
            ) from exc

    def enter(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def try_enter(self) -> bool:
        """Enter at once when admitting (no await: nothing can pause in between); False while paused."""
        if not self.admitting.is_set():
            return False
        self.enter()
        return True

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()

    async def pause(self, timeout_s: float) -> bool:
        """Stop admitting; True when everything in flight finished within `timeout_s`."""
        self.admitting.clear()
        try:
            await asyncio.wait_for(self.idle.wait(), timeout=timeout_s)
        except TimeoutError:
            return False
        return True


class AdminAPI:
    """The admin routes of one `Proxy`."""

    def __init__(self, proxy: Proxy):
        self.proxy = proxy

    def add_routes(self, r: web.UrlDispatcher) -> None:
        r.add_post("/sessions", self.create_session)
        r.add_get("/sessions/{session_id}", self.get_session)
        r.add_get("/sessions/{session_id}/records", self.get_records)
        r.add_post("/sessions/{session_id}/close", self.close_session)
        r.add_post("/admin/pause", self.pause)
        r.add_post("/admin/resume", self.resume)
        r.add_get("/admin/policy_version", self.get_policy_version)
        r.add_post("/admin/policy_version", self.set_policy_version)
        r.add_get("/admin/status", self.status)

    # -- plumbing -------------------------------------------------------------------------------------------------

    def check_control(self, request: web.Request) -> None:
        tok = request.headers.get("x-polar-control-token")
        if tok is None:
            auth = request.headers.get("Authorization", "")
            tok = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        if tok is None or not secrets.compare_digest(tok, self.proxy.control_token):
            raise web.HTTPUnauthorized(
                text='{"error": {"message": "bad or missing control token"}}', content_type="application/json"
            )

    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        if not raw:
            return {}
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise web.HTTPBadRequest(text=_error(f"malformed JSON: {exc}"), content_type="application/json") from exc
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text=_error("body must be an object"), content_type="application/json")
        return body

    def _public_base(self, request: web.Request) -> str:
        return self.proxy.base_url or f"{request.scheme}://{request.host}"

    def _session_or_404(self, request: web.Request) -> Session:
        self.check_control(request)
        s = self.proxy.sessions.get(request.match_info["session_id"])
        if s is None:
            raise web.HTTPNotFound(text=_error("unknown session"), content_type="application/json")
        return s

    # -- sessions -------------------------------------------------------------------------------------------------

    async def create_session(self, request: web.Request) -> web.Response:
        self.check_control(request)
        body = await self._json_body(request)
        unknown = set(body) - _SESSION_FIELDS
        if unknown:
            return _json({"error": {"message": f"unknown field(s) {sorted(unknown)}"}}, 400)
        try:
            s = await self.proxy.create_session(**body)
        except SessionError as exc:
            return _json({"error": {"message": str(exc)}}, exc.status)
        return _json(s.public(self._public_base(request)), 201)

    async def get_session(self, request: web.Request) -> web.Response:
        s = self._session_or_404(request)
        out = s.public(self._public_base(request))
        out.update(self.proxy.store.session_stats(s.session_id))
        return _json(out)

    async def get_records(self, request: web.Request) -> web.Response:
        s = self._session_or_404(request)
        try:
            after = int(request.query.get("after_seq", "-1"))
            limit = max(1, min(int(request.query.get("limit", "100")), 1000))
        except ValueError:
            return _json({"error": {"message": "after_seq and limit must be integers"}}, 400)
        encoding = request.query.get("encoding", "plain")
        if encoding not in ("plain", "compact"):
            return _json({"error": {"message": f"encoding must be plain or compact, not {encoding!r}"}}, 400)
        rows = self.proxy.store.list_records_raw(s.session_id, after_seq=after, limit=limit)
        nxt = orjson.loads(rows[-1])["seq"] if len(rows) == limit else None
        if encoding == "plain":  # the stored form is compact; plain JSON arrays are what clients expect
            rows = [CompletionRecord.from_json(row).to_json(compact=False) for row in rows]
        body = b'{"records":[' + b",".join(rows) + b'],"next_after_seq":' + orjson.dumps(nxt) + b"}"
        return web.Response(body=body, content_type="application/json")

    async def close_session(self, request: web.Request) -> web.Response:
        s = self._session_or_404(request)
        await self.proxy.sessions.close(s.session_id)
        return _json(s.public(self._public_base(request)))

    # -- generation control ---------------------------------------------------------------------------------------

    async def pause(self, request: web.Request) -> web.Response:
        self.check_control(request)
        body = await self._json_body(request)
        gate = self.proxy.admission
        drained = await gate.pause(float(body.get("timeout_s", 60.0)))
        return _json({"paused": True, "drained": drained, "in_flight": gate.in_flight})

    async def resume(self, request: web.Request) -> web.Response:
        self.check_control(request)
        self.proxy.admission.admitting.set()
        return _json({"paused": False, "policy_version": self.proxy.policy_version})

    async def get_policy_version(self, request: web.Request) -> web.Response:
        self.check_control(request)
        return _json({"policy_version": self.proxy.policy_version})

    async def set_policy_version(self, request: web.Request) -> web.Response:
        self.check_control(request)
        body = await self._json_body(request)
        v = body.get("policy_version")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, str))):
            return _json({"error": {"message": "policy_version must be an integer or a string"}}, 400)
        self.proxy.policy_version = v
        return _json({"policy_version": v})

    async def status(self, request: web.Request) -> web.Response:
        self.check_control(request)
        p = self.proxy
        return _json(
            {
                "paused": not p.admission.admitting.is_set(),
                "in_flight": p.admission.in_flight,
                "policy_version": p.policy_version,
                "sessions": len(p.sessions.all()),
                "upstreams": p.upstreams.urls,
                "engine": p.engine.name,
                "served_models": p.served_models,
                "store": str(p.store.path),
                "store_batches": p.store.batches,
                "store_writes": p.store.writes,
                "event_loop": loop_name(),
                "huge_pages": huge_pages_status(),
                "http_server": p.config.http_server,
                "front_calls": sum(f.served for f in p.fronts),  # harness calls the HTTP front served
                "front_handed_over": sum(f.handed_over for f in p.fronts),  # connections it gave to aiohttp
            }
        )


def _error(message: str) -> str:
    return orjson.dumps({"error": {"message": message}}).decode()


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")
