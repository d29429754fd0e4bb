# SPDX-License-Identifier: Apache-2.0
"""Fault tests of the rollout service: server SIGKILL + restart, a killed gateway, a full READY buffer (429),
agent timeouts (TIMEOUT, still through POSTRUN), cancellation killing the process tree, early stop.

Agents are SIMULATED (`harness: simulation`: timed processes, no model); evaluators are real.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from nemo_polar.backend.server import free_port
from nemo_polar.rollout import PolarClient, TaskSpec
from nemo_polar.types import SessionResult

from .helpers import example_task, start_gateway, start_server

ROOT = Path(__file__).resolve().parents[2]


def _sim_task(task_id: str, n: int, run_s: Any, **over: Any) -> TaskSpec:
    data: dict[str, Any] = {
        "task_id": task_id,
        "instruction": "simulated",
        "num_samples": n,
        "runtime": {"isolation": "none"},
        "agent": {"harness": "simulation", "options": {"run_s": run_s}},
        "builder": "per_request",
        "evaluator": "session_completed",
        "timeout_s": 120,
    }
    data.update(over)
    return TaskSpec.model_validate(data)


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "nemo_polar.cli", *args],
        cwd=ROOT,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


async def _wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not come up")
            await asyncio.sleep(0.1)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_server_sigkill_mid_task_restart_completes_without_duplicates(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    journal = tmp_path / "rollout.sqlite"
    args = ["serve-rollout", "--port", str(port), "--journal", str(journal), "--node-timeout-s", "30"]
    executed: list[SessionResult] = []

    async def record(res: SessionResult) -> None:
        executed.append(res)

    async def main() -> tuple[list[SessionResult], SessionResult, dict[str, Any]]:
        server = _spawn(args, tmp_path / "server.log")
        gw = None
        try:
            await _wait_http(url + "/health")
            gw = await start_gateway(tmp_path, url, init_workers=2, ready_buffer=1, run_slots=2)
            gw.on_result = record
            task = _sim_task("restart", 6, [0.3, 0.3, 2.5, 2.5, 2.5, 2.5])
            async with PolarClient(url, poll_wait_s=1) as client:
                await client.submit(task)
                first = None
                async for r in client.results(task.task_id):
                    first = r
                    break
                assert first is not None
                _kill(server)  # SIGKILL mid-task: sessions are running on the gateway right now
                await asyncio.sleep(1.0)
                server = _spawn(args, tmp_path / "server.log")
                await _wait_http(url + "/health")
                results = await asyncio.wait_for(client.collect(task.task_id), timeout=120)
                status = await client.status(task.task_id)
            return results, first, status
        finally:
            if gw is not None:
                await gw.close()
            _kill(server)

    results, first, status = asyncio.run(main())
    assert sorted(r.sample_index for r in results) == list(range(6))  # every sample, once
    assert first.session_id in {r.session_id for r in results}  # the result seen before the kill is still served
    assert status["state"] == "done" and status["results"] == 6
    ran = Counter(r.sample_index for r in executed)
    assert ran == Counter(range(6)), ran  # no sample ran twice on the gateway
    assert all(r.status == "COMPLETED" and r.reward == 1.0 for r in results)


def test_killed_gateway_sessions_are_redispatched_explicitly(tmp_path: Path) -> None:
    async def main() -> tuple[list[SessionResult], list[str]]:
        runner, url, server = await start_server(tmp_path, node_timeout_s=1.5, max_attempts=2)
        doomed = _spawn(
            [
                "serve-gateway",
                "--node-id",
                "doomed",
                "--server",
                url,
                "--work-dir",
                str(tmp_path / "d"),
                "--run-slots",
                "2",
                "--init-workers",
                "2",
            ],
            tmp_path / "doomed.log",
        )
        events: list[str] = []
        survivor = None
        try:
            task = _sim_task("gwkill", 2, 20.0)
            async with PolarClient(url, poll_wait_s=1) as client, aiohttp.ClientSession() as http:
                for _ in range(600):
                    async with http.get(url + "/nodes") as r:
                        if await r.json():
                            break
                    await asyncio.sleep(0.1)
                await client.submit(task)
                for _ in range(600):
                    st = await client.status(task.task_id)
                    if st["sessions"].get("dispatched") == 2:
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)
                _kill(doomed)
                survivor = await start_gateway(tmp_path, url, node_id="survivor")
                # the re-run is fast: the survivor's simulated agent takes the options of the same task
                server.tasks[task.task_id] = _sim_task("gwkill", 2, 0.2)
                results = await asyncio.wait_for(client.collect(task.task_id), timeout=120)
                for row in server.j.sessions(task_id=task.task_id):
                    events.append(f"{row.session_id}:{row.state}:{row.note}")
            return results, events
        finally:
            _kill(doomed)
            if survivor is not None:
                await survivor.close()
            await runner.cleanup()

    results, rows = asyncio.run(main())
    assert sorted(r.sample_index for r in results) == [0, 1]
    assert all(r.session_id.endswith(".a1") and r.metadata["node_id"] == "survivor" for r in results)
    assert sum(":failed:" in row and "doomed" in row for row in rows) == 2, rows  # the lost attempts, explicit


def test_full_ready_buffer_answers_429_with_retry_after(tmp_path: Path) -> None:
    task = _sim_task("full", 8, 30.0)

    async def main() -> tuple[list[int], str | None, dict[str, Any], int]:
        gw = await start_gateway(tmp_path, None, init_workers=1, ready_buffer=1, run_slots=1, retry_after_s=2)
        statuses: list[int] = []
        retry_after = None
        try:
            async with aiohttp.ClientSession() as http:
                for i in range(8):
                    body = {"session_id": f"s{i}", "sample_index": i, "task": task.model_dump(mode="json")}
                    async with http.post(gw.config.public_url + "/sessions", json=body) as r:
                        statuses.append(r.status)
                        if r.status == 429:
                            retry_after = r.headers.get("Retry-After")
                            error = await r.json()
                            break
                    await asyncio.sleep(0.5)  # let INIT move sessions along
                async with http.post(gw.config.public_url + "/sessions", data=b"{nope") as r:
                    bad = r.status
                for sid in list(gw.jobs):
                    async with http.delete(f"{gw.config.public_url}/sessions/{sid}") as r:
                        assert r.status == 200
            await gw.wait_idle(30)
            return statuses, retry_after, error, bad
        finally:
            await gw.close()

    statuses, retry_after, error, bad = asyncio.run(main())
    assert statuses[-1] == 429 and retry_after == "2"
    # admitted before the 429: one running + (init_workers + ready_buffer) waiting for the run slot
    assert statuses[:-1] == [202, 202, 202]
    assert "READY" in error["error"]["message"]
    assert bad == 400


def test_agent_timeout_is_data_and_cancel_kills_the_process_tree(tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    slow = {"version": 1, "steps": [{"shell": f"sleep 300 & echo $! > {pidfile}; wait"}]}
    timeout_task = _sim_task("slow", 1, 0.0, plans=[slow], agent={"harness": "simulation", "timeout_s": 5.0})
    cancel_task = _sim_task("cancelme", 1, 0.0, plans=[slow])
    got: list[SessionResult] = []

    async def keep(res: SessionResult) -> None:
        got.append(res)

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # a zombie is dead too
        return (
            "zombie" not in Path(f"/proc/{pid}/status").read_text().lower() if Path(f"/proc/{pid}").exists() else False
        )

    async def wait_pid() -> int:
        for _ in range(300):
            if pidfile.exists() and pidfile.read_text().strip():
                return int(pidfile.read_text())
            await asyncio.sleep(0.05)
        raise AssertionError("the agent never started its background process")

    async def main() -> tuple[int, int, bool]:
        gw = await start_gateway(tmp_path, None)
        gw.on_result = keep
        try:
            assert gw.submit("t0", timeout_task, 0) == "admitted"
            pid1 = await wait_pid()
            await gw.wait_idle(60)
            pidfile.unlink()
            assert gw.submit("c0", cancel_task, 0) == "admitted"
            pid2 = await wait_pid()
            assert gw.cancel("c0")
            await gw.wait_idle(30)
            return pid1, pid2, "c0" in {r.session_id for r in got}
        finally:
            await gw.close()

    pid1, pid2, cancelled_reported = asyncio.run(main())
    (res,) = got
    assert res.status == "TIMEOUT" and res.metadata["failure"]["kind"] == "agent_timeout"
    assert res.eval is not None and res.eval.reward == 0.0  # POSTRUN still ran: evaluated, timed
    assert "postrun_s" in res.timing
    assert not alive(pid1) and not alive(pid2)  # grandchildren killed with the tree
    assert not cancelled_reported


@pytest.mark.parametrize("k", [2])
def test_early_stop_after_k_usable_samples(tmp_path: Path, k: int) -> None:
    task = _sim_task("early", 4, [0.1, 0.1, 30.0, 30.0], early_stop_after=k)

    async def main() -> tuple[list[SessionResult], dict[str, Any]]:
        runner, url, _ = await start_server(tmp_path)
        gw = await start_gateway(tmp_path, url, run_slots=4, init_workers=4)
        try:
            async with PolarClient(url, poll_wait_s=1) as client:
                await client.submit(task)
                results = await asyncio.wait_for(client.collect(task.task_id), timeout=60)
                status = await client.status(task.task_id)
            await gw.wait_idle(30)  # the two slow sessions were cancelled on the gateway
            return results, status
        finally:
            await gw.close()
            await runner.cleanup()

    results, status = asyncio.run(main())
    assert sorted(r.sample_index for r in results) == [0, 1]
    assert status["state"] == "done" and status["sessions"] == {"done": 2, "cancelled": 2}


def test_bad_requests_are_4xx(tmp_path: Path) -> None:
    async def main() -> list[int]:
        runner, url, _ = await start_server(tmp_path)
        out = []
        try:
            async with aiohttp.ClientSession() as http:
                for method, path, body in [
                    ("POST", "/tasks", b"{"),
                    ("POST", "/tasks", orjson.dumps({"task_id": "x"})),
                    ("GET", "/tasks/nope", None),
                    ("GET", "/tasks/nope/results?after=x", None),
                    ("DELETE", "/tasks/nope", None),
                    ("POST", "/nodes/register", orjson.dumps({"node_id": 3})),
                    ("POST", "/nodes/ghost/heartbeat", b"{}"),
                    ("POST", "/nodes/ghost/results", b"[]"),
                ]:
                    async with http.request(method, url + path, data=body) as r:
                        out.append(r.status)
            t = example_task("slugify").model_dump(mode="json")
            async with aiohttp.ClientSession() as http:
                async with http.post(url + "/tasks", json=t) as r:
                    out.append(r.status)
                t["num_samples"] = 1
                t["instruction"] = "different"
                async with http.post(url + "/tasks", json=t) as r:
                    out.append(r.status)
        finally:
            await runner.cleanup()
        return out

    assert asyncio.run(main()) == [400, 400, 404, 400, 404, 400, 404, 400, 201, 409]


def test_gateway_restart_resends_finished_results_from_its_outbox(tmp_path: Path) -> None:
    """The server is down when a session finishes; the gateway is then stopped (its delivery abandoned) and
    restarted on the same work dir and node id: the journalled result is re-sent, not re-run."""
    executed: list[str] = []

    async def count(res: SessionResult) -> None:
        executed.append(res.session_id)

    async def main() -> tuple[list[SessionResult], list[str]]:
        server = RolloutServerHandle(tmp_path, free_port())  # a fixed port for both server lives
        url = await server.start()
        gw = await start_gateway(tmp_path, url, node_id="n0")
        gw.on_result = count
        task = _sim_task("outbox", 1, 1.0)
        async with PolarClient(url, poll_wait_s=1) as client:
            await client.submit(task)
            for _ in range(600):
                if any(j.stage == "running" for j in gw.jobs.values()):
                    break
                await asyncio.sleep(0.02)
            await server.stop()  # down while the session finishes
            for _ in range(600):
                if executed:
                    break
                await asyncio.sleep(0.05)
            assert list((tmp_path / "gw" / "outbox").glob("*.json")), "the finished result was journalled"
            await gw.close()  # the gateway goes away with the result unacknowledged
            await server.start()
            gw2 = await start_gateway(tmp_path, url, node_id="n0")
            gw2.on_result = count
            try:
                results = await asyncio.wait_for(client.collect(task.task_id), timeout=60)
                for _ in range(100):
                    if not list((tmp_path / "gw" / "outbox").glob("*.json")):
                        break
                    await asyncio.sleep(0.05)
            finally:
                await gw2.close()
                await server.stop()
        return results, executed

    results, executed = asyncio.run(main())
    assert [r.sample_index for r in results] == [0] and results[0].session_id.endswith(".a0")
    assert executed == [results[0].session_id]  # ran once; delivered after the restart
    assert not list((tmp_path / "gw" / "outbox").glob("*.json"))


class RolloutServerHandle:
    """An in-loop rollout server on a fixed port that can be stopped and started again on the same journal."""

    def __init__(self, tmp: Path, port: int):
        self.tmp, self.port = tmp, port
        self.runner: Any = None

    async def start(self) -> str:
        from nemo_polar.rollout.server import RolloutServer, ServerConfig

        from .helpers import serve

        server = RolloutServer(ServerConfig(journal_path=str(self.tmp / "rollout.sqlite"), node_timeout_s=60))
        self.runner, url = await serve(server.make_app(), self.port)
        return url

    async def stop(self) -> None:
        await self.runner.cleanup()


def test_a_late_heartbeat_does_not_condemn_a_session_admitted_after_it(tmp_path: Path) -> None:
    """Reconciliation uses the heartbeat's composition time: a report written before the dispatch does not make the
    session lost; a report written after it (past the grace) without the session does. The node is a FAKE gateway
    (a loopback app that admits everything) so the test controls every heartbeat."""
    from aiohttp import web

    from .helpers import serve

    async def admit(request: web.Request) -> web.Response:
        return web.json_response({"admitted": True}, status=202)

    async def main() -> tuple[str, list[str]]:
        node_app = web.Application()
        node_app.router.add_post("/sessions", admit)
        node_runner, node_url = await serve(node_app)
        runner, url, server = await start_server(tmp_path, dispatch_grace_s=0.5)
        try:
            async with aiohttp.ClientSession() as http:
                hello = {"node_id": "fake", "url": node_url, "capacity": 4, "active": [], "sent_at": time.time()}
                async with http.post(url + "/nodes/register", json=hello) as r:
                    assert r.status == 200
                written_before = time.time()
                async with PolarClient(url) as client:
                    await client.submit(_sim_task("late", 1, 0.0))
                for _ in range(200):
                    if server.j.sessions(task_id="late", state="dispatched"):
                        break
                    await asyncio.sleep(0.02)
                await asyncio.sleep(1.0)  # past the grace: only the composition time can save the session
                late = {"active": [], "sent_at": written_before}
                async with http.post(url + "/nodes/fake/heartbeat", json=late) as r:
                    assert r.status == 200
                after_late = [f"{row.session_id}:{row.state}" for row in server.j.sessions(task_id="late")]
                fresh = {"active": [], "sent_at": time.time()}
                async with http.post(url + "/nodes/fake/heartbeat", json=fresh) as r:
                    assert r.status == 200
                after_fresh = [f"{row.session_id}:{row.state}" for row in server.j.sessions(task_id="late")]
            return ",".join(after_late), after_fresh
        finally:
            await runner.cleanup()
            await node_runner.cleanup()

    after_late, after_fresh = asyncio.run(main())
    assert after_late == "late.s0.a0:dispatched"
    assert "late.s0.a0:failed" in after_fresh and any(s.startswith("late.s0.a1:") for s in after_fresh)
