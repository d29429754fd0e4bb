# SPDX-License-Identifier: Apache-2.0
"""The rollout server: tasks in, sessions scheduled onto gateway nodes, results streamed out (docs/architecture.md).

HTTP API (JSON; bad input → 4xx with `{"error": {"message", ...}}`, never a 500):
  POST   /tasks                      a TaskSpec; idempotent by task_id (same spec → 200, different spec → 409)
  GET    /tasks/{id}                 state, per-state session counts, results / usable counts, callback counts
  GET    /tasks/{id}/results?after=N&wait_s=S&limit=L   results with index > N (long-poll up to S seconds)
  DELETE /tasks/{id}                 cancel: queued sessions dropped, dispatched ones cancelled on their node
  GET    /events[?task_id=]          server-sent events (task_submitted, session_dispatched, result, task_done, …)
  POST   /nodes/register, /nodes/{id}/heartbeat, /nodes/{id}/results    the gateway side
  GET    /nodes, /health          (every route: `Authorization: Bearer <secret>` when a secret is set, auth.py)

Scheduling: queued sessions (priority, then submission order) go to the least-loaded live node (in-flight /
capacity); a node's 429 backs it off for its Retry-After. Every decision is journalled (`journal.py`) before it
is acted on, so after a SIGKILL + restart finished results are still served and each unfinished session is either
still running on its node (the node's heartbeats list it), or found lost and explicitly re-dispatched as a new
attempt (up to `max_attempts`) or failed with `failure_kind="node_lost"` — a sample never gets two results.
Early stop: after `early_stop_after` usable results the rest of the task is cancelled. Callbacks: each result is
POSTed to the task's `callback_url` with an `Idempotency-Key` header (the session id) until a 2xx arrives —
at-least-once, journalled, with capped exponential backoff and jitter (`callbacks.py`).

This module runs no agents (the gateway does) and keeps no state that is not in the journal except caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from pydantic import ValidationError

from nemo_polar.proxy.tuning import serving_loop
from nemo_polar.rollout.auth import auth_headers, check_bind, resolve_secret, service_app
from nemo_polar.rollout.callbacks import callback_loop
from nemo_polar.rollout.journal import Journal, SessionRow
from nemo_polar.rollout.retry import Backoff
from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.rollout.task_options import option_errors
from nemo_polar.types import EvalResult, SessionResult, TrajectoryStatus
from nemo_polar.types import ValidationError as RecordValidationError

__all__ = ["RolloutServer", "ServerConfig"]

log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    journal_path: str
    # generous: a gateway whose event loop stalls (a long template render in the hosted proxy on a loaded CPU) must
    # not be declared lost while it still runs its sessions; a restarted server learns faster from heartbeats
    node_timeout_s: float = 60.0
    dispatch_grace_s: float = 5.0
    max_attempts: int = 2
    tick_s: float = 0.25
    request_timeout_s: float = 15.0
    callback_backoff: Backoff = field(default_factory=lambda: Backoff(attempts=12, base_s=0.5, cap_s=30.0))
    secret: str | None = field(default_factory=resolve_secret, repr=False)  # auth.py; sent to gateways only


@dataclass
class _Node:
    node_id: str
    url: str
    capacity: int
    last_seen: float
    backoff_until: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": {"message": message, **extra}}, status=status, dumps=_dumps)


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def _usable(res: SessionResult) -> bool:
    return res.status != TrajectoryStatus.ERROR.value and res.eval is not None and not res.eval.mask_sample


class RolloutServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.journal: Journal | None = None
        self.tasks: dict[str, TaskSpec] = {}
        self.nodes: dict[str, _Node] = {}
        self.started_at = time.time()
        self._http: aiohttp.ClientSession | None = None
        self._wake = asyncio.Event()
        self._callbacks_wake = asyncio.Event()
        self._changed: dict[str, asyncio.Event] = {}
        self._subscribers: set[asyncio.Queue[bytes]] = set()
        self._event_seq = 0
        self._background: set[asyncio.Task[Any]] = set()

    # -- lifecycle -------------------------------------------------------------------------------------------------

    @property
    def j(self) -> Journal:
        assert self.journal is not None, "server not started"
        return self.journal

    async def _lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        self.journal = Journal(self.config.journal_path)
        self.started_at = time.time()
        for task_id, spec in self.j.running_tasks():
            self.tasks[task_id] = TaskSpec.model_validate_json(spec)
        for node_id, url, capacity in self.j.nodes():  # alive until proven otherwise (grace = node_timeout_s)
            self.nodes[node_id] = _Node(node_id, url, capacity, last_seen=time.time())
        if self.tasks:
            log.info("resumed %d running task(s) from %s", len(self.tasks), self.config.journal_path)
        self._http = aiohttp.ClientSession(json_serialize=_dumps)
        callbacks = callback_loop(
            self.j,
            self._http,
            self._callbacks_wake,
            tick_s=self.config.tick_s,
            timeout_s=self.config.request_timeout_s,
            backoff=self.config.callback_backoff,
        )
        loops = [asyncio.create_task(self._dispatch_loop()), asyncio.create_task(callbacks)]
        try:
            yield
        finally:
            for t in loops + list(self._background):
                t.cancel()
            await asyncio.gather(*loops, *self._background, return_exceptions=True)
            for q in list(self._subscribers):
                q.put_nowait(b"")
            await self._http.close()
            self.j.close()

    def make_app(self) -> web.Application:
        routes = [
            ("POST", "/tasks", self._post_task),
            ("GET", "/tasks/{task_id}", self._get_task),
            ("GET", "/tasks/{task_id}/results", self._get_results),
            ("DELETE", "/tasks/{task_id}", self._delete_task),
            ("GET", "/events", self._events),
            ("POST", "/nodes/register", self._register),
            ("POST", "/nodes/{node_id}/heartbeat", self._heartbeat),
            ("POST", "/nodes/{node_id}/results", self._node_result),
            ("GET", "/nodes", self._get_nodes),
            ("GET", "/health", self._health),
        ]
        return service_app(self.config.secret, self._lifecycle, routes)

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    # -- events ----------------------------------------------------------------------------------------------------

    def _publish(self, kind: str, **data: Any) -> None:
        self._event_seq += 1
        frame = f"id: {self._event_seq}\nevent: {kind}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"
        for q in list(self._subscribers):
            try:
                q.put_nowait(frame)
            except asyncio.QueueFull:  # a subscriber that does not read is dropped, not buffered forever
                self._subscribers.discard(q)
        if "task_id" in data:
            ev = self._changed.pop(data["task_id"], None)
            if ev is not None:
                ev.set()

    async def _events(self, request: web.Request) -> web.StreamResponse:
        want = request.query.get("task_id")
        q: asyncio.Queue[bytes] = asyncio.Queue(maxsize=10_000)
        self._subscribers.add(q)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            await resp.write(b": polar rollout events\n\n")
            while True:
                try:
                    frame = await asyncio.wait_for(q.get(), timeout=15.0)
                except TimeoutError:
                    await resp.write(b": keep-alive\n\n")
                    continue
                if not frame:
                    break
                if want and f'"task_id":{_dumps(want)}'.encode() not in frame:
                    continue
                await resp.write(frame)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._subscribers.discard(q)
        return resp

    # -- tasks -----------------------------------------------------------------------------------------------------

    async def _json(self, request: web.Request) -> Any:
        try:
            return orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise web.HTTPBadRequest(
                text=_dumps({"error": {"message": f"invalid JSON: {exc}"}}), content_type="application/json"
            ) from exc

    async def _post_task(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        try:
            task = TaskSpec.model_validate(body)
        except ValidationError as exc:
            errors = [f"{'.'.join(str(p) for p in e['loc']) or '<task>'}: {e['msg']}" for e in exc.errors()]
            return _error(400, "invalid task spec", errors=errors)
        if errors := option_errors(task):  # options that do not fit the named builder / evaluator / harness
            return _error(422, "invalid task options", errors=errors)
        spec = task.to_json()
        existing = self.j.get_task(task.task_id)
        if existing is not None:
            if TaskSpec.model_validate_json(existing[0]) != task:
                return _error(409, f"task {task.task_id!r} exists with a different spec")
            return web.json_response({"task_id": task.task_id, "created": False, "state": existing[1]})
        self.j.add_task(task.task_id, spec, task.priority, task.num_samples)
        self.tasks[task.task_id] = task
        self._publish("task_submitted", task_id=task.task_id, num_samples=task.num_samples)
        self._wake.set()
        return web.json_response({"task_id": task.task_id, "created": True, "state": "running"}, status=201)

    def _task_view(self, task_id: str) -> dict[str, Any] | None:
        row = self.j.get_task(task_id)
        if row is None:
            return None
        spec = TaskSpec.model_validate_json(row[0])
        n, usable = self.j.result_counts(task_id)
        return {
            "task_id": task_id,
            "state": row[1],
            "num_samples": spec.num_samples,
            "sessions": self.j.count_by_state(task_id),
            "results": n,
            "usable": usable,
            "callbacks": self.j.callback_counts(task_id),
            "finished_at": row[2],
        }

    async def _get_task(self, request: web.Request) -> web.Response:
        view = self._task_view(request.match_info["task_id"])
        return _error(404, "unknown task") if view is None else web.json_response(view, dumps=_dumps)

    async def _get_results(self, request: web.Request) -> web.Response:
        task_id = request.match_info["task_id"]
        try:
            after = int(request.query.get("after", "0"))
            wait_s = min(max(float(request.query.get("wait_s", "0")), 0.0), 60.0)
            limit = min(max(int(request.query.get("limit", "100")), 1), 1000)
        except ValueError:
            return _error(400, "after and limit must be integers, wait_s a number")
        if self.j.get_task(task_id) is None:
            return _error(404, "unknown task")
        deadline = time.monotonic() + wait_s
        while True:
            ev = self._changed.setdefault(task_id, asyncio.Event())
            rows = self.j.results(task_id, after, limit)
            state = self.j.get_task(task_id)
            done = state is not None and state[1] != "running"
            remaining = deadline - time.monotonic()
            if rows or done or remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), timeout=remaining)
        # results are stored compact; splice them without re-parsing
        items = [
            b'{"index":%d,"session_id":%s,"sample_index":%d,"result":%s}' % (i, orjson.dumps(sid), si, data)
            for i, sid, si, data in rows
        ]
        nxt = rows[-1][0] if rows else after
        more = len(rows) == limit
        body = (
            b'{"results":['
            + b",".join(items)
            + b'],"next":%d,"done":%s}' % (nxt, b"true" if done and not more else b"false")
        )
        return web.Response(body=body, content_type="application/json")

    async def _delete_task(self, request: web.Request) -> web.Response:
        task_id = request.match_info["task_id"]
        if self.j.get_task(task_id) is None:
            return _error(404, "unknown task")
        n = self._cancel_rest(task_id, reason="cancelled by client")
        self._finish_task(task_id, "cancelled")
        return web.json_response({"task_id": task_id, "cancelled_sessions": n})

    def _cancel_rest(self, task_id: str, *, reason: str) -> int:
        n = 0
        for row in self.j.sessions(task_id=task_id):
            if row.state == "queued":
                self.j.set_session(row.session_id, "cancelled", note=reason)
                n += 1
            elif row.state == "dispatched":
                self.j.set_session(row.session_id, "cancelled", note=reason)
                node = self.nodes.get(row.node_id or "")
                if node is not None:
                    self._spawn(self._cancel_on_node(node, row.session_id))
                n += 1
        return n

    async def _cancel_on_node(self, node: _Node, session_id: str) -> None:
        assert self._http is not None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s)
            headers = auth_headers(self.config.secret)
            async with self._http.delete(f"{node.url}/sessions/{session_id}", headers=headers, timeout=timeout):
                pass

    def _finish_task(self, task_id: str, state: str) -> None:
        row = self.j.get_task(task_id)
        if row is None or row[1] != "running":
            return
        self.j.set_task_state(task_id, state)
        self.tasks.pop(task_id, None)
        n, usable = self.j.result_counts(task_id)
        self._publish("task_done", task_id=task_id, state=state, results=n, usable=usable)

    def _maybe_done(self, task_id: str) -> None:
        counts = self.j.count_by_state(task_id)
        if not counts.get("queued") and not counts.get("dispatched"):
            self._finish_task(task_id, "done")

    # -- results ---------------------------------------------------------------------------------------------------

    def _store_result(self, row: SessionRow, res: SessionResult) -> bool:
        task = self.tasks.get(row.task_id)
        usable = _usable(res)
        data = res.to_json(compact=True)
        callback = None
        if task is not None and task.callback_url:
            body = (
                orjson.dumps({"task_id": row.task_id, "session_id": row.session_id})[:-1] + b',"result":' + data + b"}"
            )
            callback = (task.callback_url, body)
        state = "done" if res.status != TrajectoryStatus.ERROR.value else "failed"
        idx = self.j.add_result(row, data, usable, session_state=state, callback=callback)
        if idx is None:
            self.j.set_session(row.session_id, "failed", note="duplicate result for the sample dropped")
            return False
        self._publish(
            "result",
            task_id=row.task_id,
            index=idx,
            session_id=row.session_id,
            status=res.status,
            reward=res.reward,
            usable=usable,
        )
        if callback is not None:
            self._callbacks_wake.set()
        if task is not None and task.early_stop_after is not None:
            if self.j.result_counts(row.task_id)[1] >= task.early_stop_after:
                n = self._cancel_rest(row.task_id, reason=f"early stop after {task.early_stop_after} usable samples")
                if n:
                    self._publish("early_stop", task_id=row.task_id, cancelled_sessions=n)
        self._maybe_done(row.task_id)
        return True

    async def _node_result(self, request: web.Request) -> web.Response:
        node_id = request.match_info["node_id"]
        body = await self._json(request)
        try:
            res = SessionResult.from_dict(body).validate()
        except (RecordValidationError, TypeError, ValueError, KeyError) as exc:
            return _error(400, f"invalid SessionResult: {exc}")
        row = self.j.session(res.session_id)
        if row is None:
            return _error(404, f"unknown session {res.session_id!r}")
        if row.state != "dispatched" or row.node_id != node_id:
            # already finished, cancelled, or re-dispatched elsewhere: acknowledged, not applied
            return web.json_response({"accepted": False, "state": row.state})
        accepted = self._store_result(row, res)
        self._wake.set()
        return web.json_response({"accepted": accepted})

    def _fail_sample(self, row: SessionRow, kind: str, reason: str) -> None:
        task = self.tasks.get(row.task_id)
        res = SessionResult(
            session_id=row.session_id,
            task_id=row.task_id,
            sample_index=row.sample_index,
            status=TrajectoryStatus.ERROR.value,
            eval=EvalResult(reward=0.0, resolved=False, mask_sample=True, failure_kind=kind, failure_reason=reason),
            metadata={**(task.metadata.model_dump(exclude_none=True) if task else {}), "attempt": row.attempt},
        )
        self._store_result(row, res)

    def _lost(self, row: SessionRow, why: str) -> None:
        if row.attempt + 1 < self.config.max_attempts:
            new_id = self.j.requeue(row, why)
            log.warning("session %s lost (%s): re-dispatching as %s", row.session_id, why, new_id)
            self._publish(
                "session_redispatched",
                task_id=row.task_id,
                session_id=row.session_id,
                new_session_id=new_id,
                reason=why,
            )
        else:
            log.warning("session %s lost (%s): failing it", row.session_id, why)
            self._fail_sample(row, "node_lost", why)
        self._wake.set()

    # -- nodes -----------------------------------------------------------------------------------------------------

    async def _register(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        node_id, url, capacity = body.get("node_id"), body.get("url"), body.get("capacity")
        if not isinstance(node_id, str) or not node_id or not isinstance(url, str) or not url.startswith("http"):
            return _error(400, "register needs node_id (string) and url (http URL)")
        if not isinstance(capacity, int) or capacity < 1:
            return _error(400, "capacity must be a positive integer")
        self.j.put_node(node_id, url.rstrip("/"), capacity)
        self.nodes[node_id] = _Node(node_id, url.rstrip("/"), capacity, last_seen=time.time())
        self._publish("node_registered", node_id=node_id, url=url, capacity=capacity)
        self._reconcile(node_id, body.get("active"), body.get("sent_at"))
        self._wake.set()
        return web.json_response({"ok": True, "node_timeout_s": self.config.node_timeout_s})

    async def _heartbeat(self, request: web.Request) -> web.Response:
        node_id = request.match_info["node_id"]
        node = self.nodes.get(node_id)
        if node is None:
            return _error(404, "unknown node: register first")
        body = await self._json(request)
        node.last_seen = time.time()
        node.stats = body.get("stats") or {}
        if body.get("full"):
            node.backoff_until = max(node.backoff_until, time.time() + float(body.get("retry_after_s", 1.0)))
        else:
            node.backoff_until = 0.0
        self._reconcile(node_id, body.get("active"), body.get("sent_at"))
        self._wake.set()
        return web.json_response({"ok": True})

    def _reconcile(self, node_id: str, active: Any, sent_at: Any) -> None:
        """Sessions journalled on `node_id` that its report does not list are lost — only those dispatched well
        before the report was composed (`sent_at`, the node's clock): a report that was late on the wire must not
        condemn a session the node admitted after writing it."""
        if not isinstance(active, list):
            return
        have = set(active)
        now = time.time()
        composed = float(sent_at) if isinstance(sent_at, (int, float)) and not isinstance(sent_at, bool) else now
        cutoff = min(now, composed) - self.config.dispatch_grace_s
        for row in self.j.sessions(state="dispatched", node_id=node_id):
            if row.session_id not in have and row.updated_at < cutoff:
                self._lost(row, f"node {node_id} does not hold it")

    async def _get_nodes(self, request: web.Request) -> web.Response:
        inflight = self.j.inflight_by_node()
        now = time.time()
        return web.json_response(
            [
                {
                    "node_id": n.node_id,
                    "url": n.url,
                    "capacity": n.capacity,
                    "inflight": inflight.get(n.node_id, 0),
                    "seen_s_ago": round(now - n.last_seen, 3),
                    "stats": n.stats,
                }
                for n in self.nodes.values()
            ],
            dumps=_dumps,
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "tasks_running": len(self.tasks), "nodes": len(self.nodes)})

    def _check_nodes(self) -> None:
        now = time.time()
        for node in list(self.nodes.values()):
            if now - node.last_seen > self.config.node_timeout_s:
                rows = self.j.sessions(state="dispatched", node_id=node.node_id)
                for row in rows:
                    self._lost(row, f"node {node.node_id} silent for {now - node.last_seen:.1f}s")
                if rows:
                    self._publish("node_lost", node_id=node.node_id)

    # -- dispatch --------------------------------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.config.tick_s)
            self._wake.clear()
            try:
                self._check_nodes()
                await self._dispatch_once()
            except Exception:  # the loop must survive anything; the journal keeps the truth
                log.exception("dispatch round failed")

    def _pick_node(self, inflight: dict[str, int]) -> _Node | None:
        now = time.time()
        best: tuple[float, _Node] | None = None
        for n in self.nodes.values():
            used = inflight.get(n.node_id, 0)
            if now - n.last_seen > self.config.node_timeout_s or n.backoff_until > now or used >= n.capacity:
                continue
            load = used / n.capacity
            if best is None or load < best[0]:
                best = (load, n)
        return None if best is None else best[1]

    async def _dispatch_once(self) -> None:
        inflight = self.j.inflight_by_node()
        for row in self.j.queued(limit=256):
            task = self.tasks.get(row.task_id)
            if task is None:
                self.j.set_session(row.session_id, "cancelled", note="task no longer running")
                continue
            node = self._pick_node(inflight)
            if node is None:
                return
            self.j.set_session(row.session_id, "dispatched", node_id=node.node_id)  # journal first, then act
            inflight[node.node_id] = inflight.get(node.node_id, 0) + 1
            outcome = await self._send(node, row, task)
            if outcome == "admitted":
                self._publish(
                    "session_dispatched", task_id=row.task_id, session_id=row.session_id, node_id=node.node_id
                )
            elif outcome == "refused":
                self.j.set_session(row.session_id, "queued")
                inflight[node.node_id] -= 1
            elif outcome.startswith("rejected"):
                self._fail_sample(row, "gateway_rejected", outcome)
            # "unknown": left dispatched; the node's next heartbeat settles it

    async def _send(self, node: _Node, row: SessionRow, task: TaskSpec) -> str:
        assert self._http is not None
        body = b'{"session_id":%s,"sample_index":%d,"attempt":%d,"task":%s}' % (
            orjson.dumps(row.session_id),
            row.sample_index,
            row.attempt,
            task.to_json(),
        )
        try:
            async with self._http.post(
                f"{node.url}/sessions",
                data=body,
                headers={"Content-Type": "application/json", **auth_headers(self.config.secret)},
                timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s),
            ) as resp:
                if resp.status in (200, 201, 202):
                    return "admitted"
                if resp.status in (429, 503):
                    retry_after = float(resp.headers.get("Retry-After", "1") or 1)
                    node.backoff_until = time.time() + retry_after
                    return "refused"
                return f"rejected: {resp.status} {(await resp.text())[:500]}"
        except aiohttp.ClientConnectorError:
            node.backoff_until = time.time() + 1.0
            return "refused"  # never connected: certainly not admitted
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("dispatch of %s to %s: %s; the next heartbeat decides", row.session_id, node.node_id, exc)
            return "unknown"


def run(config: ServerConfig, *, host: str = "127.0.0.1", port: int = 8700) -> None:
    """Serve until interrupted (`polar serve-rollout`); a non-loopback `host` needs `config.secret`."""
    check_bind(host, config.secret, "the rollout server")
    Path(config.journal_path).parent.mkdir(parents=True, exist_ok=True)
    loop = serving_loop()  # uvloop's where installed (proxy/tuning.py)
    web.run_app(RolloutServer(config).make_app(), host=host, port=port, print=None, loop=loop)
