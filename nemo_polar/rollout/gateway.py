# SPDX-License-Identifier: Apache-2.0
"""A gateway node: staged pools INIT → READY → RUNNING → POSTRUN with independent knobs (docs/architecture.md).

- INIT: `init_workers` workers create the runtime and run the prepare actions; a finished session waits for a
  READY slot (the READY buffer holds `ready_buffer` sessions: its own knob, not tied to the init workers).
- RUNNING: `run_slots` workers take READY sessions and run the agent (the GPU-bound stage).
- POSTRUN: `postrun_workers` fetch records, build the trajectory, evaluate, run hooks, tear down, and hand the
  `SessionResult` to the rollout server (retried until acknowledged) or to a local `on_result` callback.
- Admission: a session is admitted while fewer than `init_workers + ready_buffer` sessions wait for a run slot;
  otherwise `POST /sessions` answers 429 with Retry-After. Admission is idempotent by session id.
- Cancellation (`DELETE /sessions/{id}`) cancels the session wherever it is; `Runtime.exec` kills the process tree.
- `staged=False` is the sequential baseline for `benchmarks/staging.py`: a run slot does INIT, RUN and POSTRUN of
  its session itself, as a naive runner would.

HTTP: `POST /sessions`, `DELETE /sessions/{id}`, `GET /sessions/{id}`, `GET /health`, `GET /metrics`
(Prometheus text), each behind the rollout service's shared secret when one is set (`auth.py`). With `server_url` the
node registers with the rollout server and heartbeats the sessions it holds (admitted and not yet acknowledged), which
is how a restarted server tells running sessions from lost ones. Finished results are journalled in
`<work_dir>/outbox/` until the server acknowledges them, so a gateway restarted on the same work dir and node id
re-sends them instead of losing them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from pydantic import ValidationError

from nemo_polar.rollout.auth import auth_headers, check_bind, resolve_secret, service_app
from nemo_polar.rollout.busy import BusyMeter
from nemo_polar.rollout.proxylink import ProxyLink
from nemo_polar.rollout.retry import Backoff, retry
from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.rollout.stages import Job, SessionWork
from nemo_polar.rundir import RunDir
from nemo_polar.types import SessionResult

__all__ = ["Gateway", "GatewayConfig"]

log = logging.getLogger(__name__)

STAGES = ("init_queue", "init", "ready", "running", "postrun_queue", "postrun")


@dataclass
class GatewayConfig:
    node_id: str = "node-0"
    work_dir: str = "polar-run"
    init_workers: int = 2
    ready_buffer: int = 2
    run_slots: int = 2
    postrun_workers: int = 2
    server_url: str | None = None
    public_url: str | None = None  # how the rollout server reaches this node (set by `start()` when served)
    heartbeat_s: float = 1.0
    retry_after_s: float = 1.0
    model: str = "polar"
    builder_options: dict[str, Any] = field(default_factory=dict)
    keep_runtimes: bool = False
    staged: bool = True
    # the shared secret of the rollout service (auth.py): required of callers, sent to the rollout server
    secret: str | None = field(default_factory=resolve_secret, repr=False)

    def check(self) -> None:
        for name in ("init_workers", "ready_buffer", "run_slots", "postrun_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


def _reap_containers(work_dir: str) -> None:
    from nemo_polar.runtime.container import gateway_owner, reap

    n = reap(gateway_owner(work_dir))
    if n:
        log.warning("removed %d container(s) left by an earlier gateway on %s", n, work_dir)


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        *,
        proxy: ProxyLink | None = None,
        on_result: Callable[[SessionResult], Awaitable[None]] | None = None,
    ):
        config.check()
        self.config = config
        self.work = SessionWork(
            node_id=config.node_id,
            work_dir=Path(config.work_dir),
            proxy=proxy,
            model=config.model,
            builder_options=config.builder_options,
            keep_runtimes=config.keep_runtimes,
        )
        self.on_result = on_result
        self.jobs: dict[str, Job] = {}  # held: admitted and not yet acknowledged
        self._init_q: asyncio.Queue[Job] = asyncio.Queue()
        self._ready_q: asyncio.Queue[Job] = asyncio.Queue(maxsize=config.ready_buffer)
        self._post_q: asyncio.Queue[Job] = asyncio.Queue()
        self.meter = BusyMeter()
        self.finished: dict[str, int] = {}
        self.rejected = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._http: aiohttp.ClientSession | None = None
        self._admitting = False
        self._runner: web.AppRunner | None = None
        self._idle = asyncio.Event()  # set while no session is held
        self._unacked: set[str] = set()  # outboxed results from before a restart, being re-sent
        self._idle.set()

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def start(self) -> None:
        """Start the pools (and the server link when `server_url` is set)."""
        self._http = aiohttp.ClientSession(json_serialize=lambda o: orjson.dumps(o).decode())
        await asyncio.to_thread(Path(self.config.work_dir).mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(_reap_containers, self.config.work_dir)  # what a killed gateway here left running
        self.meter = BusyMeter()
        c = self.config
        if c.staged:
            for _ in range(c.init_workers):
                self._spawn(self._init_worker())
            for _ in range(c.postrun_workers):
                self._spawn(self._post_worker())
        for _ in range(c.run_slots):
            self._spawn(self._run_worker())
        if c.server_url:
            for result in await asyncio.to_thread(self._outbox_load):  # finished before a restart, not yet acked
                self._unacked.add(result.session_id)
                self._spawn(self._resend(result))
            self._spawn(self._server_link())
        self._admitting = True

    async def stop(self, drain_s: float = 0.0) -> None:
        """Stop admitting → drain (up to `drain_s`) → cancel → tear down runtimes → close."""
        self._admitting = False
        if drain_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout=drain_s)
        for job in list(self.jobs.values()):
            if job.current is not None:
                job.current.cancel()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for job in list(self.jobs.values()):
            await self.work.teardown(job)
        if self._http is not None:
            await self._http.close()

    async def _lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    def make_app(self) -> web.Application:
        routes = [
            ("POST", "/sessions", self._post_session),
            ("GET", "/sessions/{session_id}", self._get_session),
            ("DELETE", "/sessions/{session_id}", self._delete_session),
            ("GET", "/health", self._health),
            ("GET", "/metrics", self._metrics),
        ]
        return service_app(self.config.secret, self._lifecycle, routes)

    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve the HTTP API in this event loop; returns the node's URL. A non-loopback `host` needs a secret."""
        check_bind(host, self.config.secret, f"gateway {self.config.node_id}")
        self._runner = web.AppRunner(self.make_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        url = f"http://{host}:{self._runner.addresses[0][1]}"
        self.config.public_url = self.config.public_url or url
        return url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- admission -------------------------------------------------------------------------------------------------

    def waiting(self) -> int:
        """Sessions admitted that have not reached a run slot yet."""
        return sum(1 for j in self.jobs.values() if j.stage in ("init_queue", "init", "ready"))

    def admission_limit(self) -> int:
        c = self.config
        return c.init_workers + c.ready_buffer if c.staged else c.ready_buffer

    def full(self) -> bool:
        return self.waiting() >= self.admission_limit()

    def submit(self, session_id: str, task: TaskSpec, sample_index: int, attempt: int = 0) -> str:
        """Admit a session: "admitted", "duplicate" (already held), or "full"."""
        if session_id in self.jobs:
            return "duplicate"
        if not self._admitting or self.full():
            self.rejected += 1
            return "full"
        job = Job(
            session_id=session_id,
            task=task,
            sample_index=sample_index,
            attempt=attempt,
            session_dir=RunDir(self.config.work_dir).session(session_id).root,
        )
        job.t["admitted"] = time.time()
        self.jobs[session_id] = job
        self._idle.clear()
        if self.config.staged:
            self._init_q.put_nowait(job)
        else:
            job.stage = "ready"
            self._ready_q.put_nowait(job)
        return "admitted"

    def cancel(self, session_id: str) -> bool:
        job = self.jobs.get(session_id)
        if job is None:
            return False
        job.cancelled = True
        if job.current is not None:
            job.current.cancel()
        elif job.stage in ("init_queue", "ready", "postrun_queue"):
            self._spawn(self._discard(job))  # its worker skips it; the runtime goes now
        return True

    async def _discard(self, job: Job) -> None:
        await self.work.teardown(job)
        self._release(job)
        self.finished["CANCELLED"] = self.finished.get("CANCELLED", 0) + 1

    # -- pools -----------------------------------------------------------------------------------------------------

    async def _in_child(self, job: Job, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run one stage of one job as its own task, so cancelling the job does not kill the worker."""
        t = asyncio.create_task(coro)
        job.current = t
        try:
            return await t
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if not t.cancelled() or (me is not None and me.cancelling()):
                raise
            return None
        finally:
            job.current = None

    async def _init_worker(self) -> None:
        while True:
            job = await self._init_q.get()
            if job.cancelled:
                continue
            job.stage = "init"
            await self._in_child(job, self.work.init(job))
            if job.cancelled:
                await self._discard(job)
            elif job.failure is not None:
                job.stage = "postrun_queue"
                self._post_q.put_nowait(job)
            else:
                job.stage = "ready"
                await self._ready_q.put(job)  # blocks while the READY buffer is full

    async def _run_worker(self) -> None:
        while True:
            job = await self._ready_q.get()
            if job.cancelled:
                continue
            if not self.config.staged:  # sequential baseline: this slot prepares the session itself
                job.stage = "init"
                await self._in_child(job, self.work.init(job))
            if job.failure is None and not job.cancelled:
                job.stage = "running"
                self.meter.run_started(id(job))
                try:
                    await self._in_child(job, self.work.run(job))
                finally:
                    self.meter.run_ended(id(job))
            if job.cancelled:
                await self._discard(job)
            elif self.config.staged:
                job.stage = "postrun_queue"
                self._post_q.put_nowait(job)
            else:
                await self._postrun(job)

    async def _post_worker(self) -> None:
        while True:
            job = await self._post_q.get()
            if job.cancelled:
                continue
            await self._postrun(job)

    async def _postrun(self, job: Job) -> None:
        job.stage = "postrun"
        result = await self._in_child(job, self.work.postrun(job))
        if job.cancelled or result is None:
            await self._discard(job)
            return
        job.stage = "done"
        self.finished[result.status] = self.finished.get(result.status, 0) + 1
        if self.config.server_url:  # journalled until the server acknowledges it: survives a gateway restart
            await asyncio.to_thread(self._outbox_put, result)
        self._spawn(self._deliver(job, result))

    async def _deliver(self, job: Job, result: SessionResult) -> None:
        try:
            if self.on_result is not None:
                await self.on_result(result)
            if self.config.server_url:
                await self._post_result(result)
                await asyncio.to_thread(self._outbox_drop, result.session_id)
        except Exception:
            log.exception("delivering the result of %s failed", job.session_id)
        finally:
            self._release(job)

    # -- the outbox: finished results not yet acknowledged by the rollout server -----------------------------------

    @property
    def _outbox(self) -> Path:
        return RunDir(self.config.work_dir).outbox

    def _outbox_put(self, result: SessionResult) -> None:
        self._outbox.mkdir(parents=True, exist_ok=True)
        tmp = self._outbox / f".{result.session_id}.tmp"
        tmp.write_bytes(result.to_json(compact=True))
        os.replace(tmp, self._outbox / f"{result.session_id}.json")

    def _outbox_drop(self, session_id: str) -> None:
        (self._outbox / f"{session_id}.json").unlink(missing_ok=True)

    def _outbox_load(self) -> list[SessionResult]:
        if not self._outbox.is_dir():
            return []
        out = []
        for path in sorted(self._outbox.glob("*.json")):
            try:
                out.append(SessionResult.from_json(path.read_bytes()))
            except (ValueError, TypeError) as exc:
                log.error("unreadable outbox entry %s: %s", path, exc)
        return out

    async def _resend(self, result: SessionResult) -> None:
        try:
            await self._post_result(result)
            await asyncio.to_thread(self._outbox_drop, result.session_id)
        finally:
            self._unacked.discard(result.session_id)

    def _release(self, job: Job) -> None:
        if self.jobs.get(job.session_id) is job:
            del self.jobs[job.session_id]
        if not self.jobs:
            self._idle.set()

    # -- the rollout server link -----------------------------------------------------------------------------------

    async def _server_call(self, path: str, body: bytes) -> tuple[int, Any]:
        assert self._http is not None and self.config.server_url
        async with self._http.post(
            self.config.server_url.rstrip("/") + path,
            data=body,
            headers={"Content-Type": "application/json", **auth_headers(self.config.secret)},
            timeout=aiohttp.ClientTimeout(total=15),
        ) as resp:
            raw = await resp.read()
            try:
                return resp.status, orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                return resp.status, None

    async def _post_result(self, result: SessionResult) -> None:
        body = result.to_json(compact=True)

        async def once() -> None:
            status, _ = await self._server_call(f"/nodes/{self.config.node_id}/results", body)
            if status >= 500:
                raise aiohttp.ClientResponseError(None, (), status=status)  # type: ignore[arg-type]

        # until acknowledged: the server may be restarting. 4xx is an answer too (e.g. the session was cancelled).
        await retry(
            once,
            backoff=Backoff(attempts=None, base_s=0.2, cap_s=3.0),
            retry_on=(aiohttp.ClientError, TimeoutError),
            what=f"result of {result.session_id}",
        )

    def _active(self) -> list[str]:
        """Sessions this node answers for: held jobs and outboxed results not yet acknowledged."""
        return sorted(set(self.jobs) | self._unacked)

    def _hello(self) -> bytes:
        c = self.config
        capacity = c.init_workers + c.ready_buffer + c.run_slots + (c.postrun_workers if c.staged else 0)
        return orjson.dumps(
            {
                "node_id": c.node_id,
                "url": c.public_url,
                "capacity": capacity,
                "active": self._active(),
                "sent_at": time.time(),
            }
        )

    async def _server_link(self) -> None:
        registered = False
        while True:
            try:
                if not registered:
                    status, _ = await self._server_call("/nodes/register", self._hello())
                    registered = status == 200
                else:
                    body = orjson.dumps(
                        {
                            "active": self._active(),
                            "sent_at": time.time(),
                            "full": self.full(),
                            "retry_after_s": self.config.retry_after_s,
                            "stats": self.stats(),
                        }
                    )
                    status, _ = await self._server_call(f"/nodes/{self.config.node_id}/heartbeat", body)
                    registered = status == 200
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.debug("rollout server unreachable: %s", exc)
                registered = False
            await asyncio.sleep(self.config.heartbeat_s)

    # -- HTTP ------------------------------------------------------------------------------------------------------

    async def _post_session(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            session_id, sample_index = body["session_id"], int(body.get("sample_index", 0))
            attempt = int(body.get("attempt", 0))
            task = TaskSpec.model_validate(body["task"])
            if not isinstance(session_id, str) or not session_id:
                raise ValueError("session_id must be a non-empty string")
            if not 0 <= sample_index < task.num_samples:
                raise ValueError(f"sample_index {sample_index} outside num_samples={task.num_samples}")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, ValidationError) as exc:
            return web.json_response({"error": {"message": f"bad session request: {exc}"}}, status=400)
        outcome = self.submit(session_id, task, sample_index, attempt)
        if outcome == "full":
            return web.json_response(
                {"error": {"message": "gateway full: the READY buffer and init pool are occupied"}},
                status=429,
                headers={"Retry-After": f"{self.config.retry_after_s:g}"},
            )
        return web.json_response(
            {"session_id": session_id, "admitted": True, "duplicate": outcome == "duplicate"},
            status=202 if outcome == "admitted" else 200,
        )

    async def _get_session(self, request: web.Request) -> web.Response:
        job = self.jobs.get(request.match_info["session_id"])
        if job is None:
            return web.json_response({"error": {"message": "unknown session"}}, status=404)
        return web.json_response(
            {"session_id": job.session_id, "stage": job.stage, "status": job.status, "failure": job.failure}
        )

    async def _delete_session(self, request: web.Request) -> web.Response:
        if not self.cancel(request.match_info["session_id"]):
            return web.json_response({"error": {"message": "unknown session"}}, status=404)
        return web.json_response({"cancelled": True})

    def stage_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STAGES, 0)
        for j in self.jobs.values():
            if j.stage in counts:
                counts[j.stage] += 1
        return counts

    def stats(self) -> dict[str, Any]:
        elapsed = max(1e-9, time.monotonic() - self.meter.t0)
        return {
            "stages": self.stage_counts(),
            "run_slots_busy": self.meter.busy,
            "run_slot_busy_fraction": self.meter.area_now() / (self.config.run_slots * elapsed),
            "finished": dict(self.finished),
            "records_total": self.work.records_total,
        }

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "ok": True,
                "node_id": self.config.node_id,
                "admitting": self._admitting,
                "full": self.full(),
                **self.stats(),
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        c, s = self.config, self.stats()
        elapsed = max(1e-9, time.monotonic() - self.meter.t0)
        node = f'node="{c.node_id}"'
        lines = [
            "# HELP polar_gateway_sessions Sessions held by the gateway, by stage.",
            "# TYPE polar_gateway_sessions gauge",
            *(f'polar_gateway_sessions{{{node},stage="{k}"}} {v}' for k, v in s["stages"].items()),
            "# HELP polar_gateway_stage_capacity Configured workers / slots per stage.",
            "# TYPE polar_gateway_stage_capacity gauge",
            f'polar_gateway_stage_capacity{{{node},stage="init"}} {c.init_workers}',
            f'polar_gateway_stage_capacity{{{node},stage="ready"}} {c.ready_buffer}',
            f'polar_gateway_stage_capacity{{{node},stage="running"}} {c.run_slots}',
            f'polar_gateway_stage_capacity{{{node},stage="postrun"}} {c.postrun_workers}',
            "# HELP polar_gateway_queue_depth Sessions waiting for a worker of the stage.",
            "# TYPE polar_gateway_queue_depth gauge",
            f'polar_gateway_queue_depth{{{node},queue="init"}} {self._init_q.qsize()}',
            f'polar_gateway_queue_depth{{{node},queue="ready"}} {self._ready_q.qsize()}',
            f'polar_gateway_queue_depth{{{node},queue="postrun"}} {self._post_q.qsize()}',
            "# HELP polar_gateway_run_slots_busy Run slots running an agent now.",
            "# TYPE polar_gateway_run_slots_busy gauge",
            f"polar_gateway_run_slots_busy{{{node}}} {self.meter.busy}",
            "# HELP polar_gateway_run_slot_busy_fraction Busy run-slot time / (run slots x uptime).",
            "# TYPE polar_gateway_run_slot_busy_fraction gauge",
            f"polar_gateway_run_slot_busy_fraction{{{node}}} {s['run_slot_busy_fraction']:.6f}",
            "# HELP polar_gateway_sessions_finished_total Sessions finished, by status.",
            "# TYPE polar_gateway_sessions_finished_total counter",
            *(f'polar_gateway_sessions_finished_total{{{node},status="{k}"}} {v}' for k, v in self.finished.items()),
            "# HELP polar_gateway_admission_rejected_total Sessions refused with 429.",
            "# TYPE polar_gateway_admission_rejected_total counter",
            f"polar_gateway_admission_rejected_total{{{node}}} {self.rejected}",
            "# HELP polar_gateway_records_total Proxy records collected in POSTRUN.",
            "# TYPE polar_gateway_records_total counter",
            f"polar_gateway_records_total{{{node}}} {self.work.records_total}",
            "# HELP polar_gateway_records_per_second Records collected per second of uptime.",
            "# TYPE polar_gateway_records_per_second gauge",
            f"polar_gateway_records_per_second{{{node}}} {self.work.records_total / elapsed:.6f}",
        ]
        return web.Response(
            text="\n".join(lines) + "\n",
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait until no session is held (tests and benchmarks)."""
        await asyncio.wait_for(self._idle.wait(), timeout=timeout_s)
