# SPDX-License-Identifier: Apache-2.0
"""The rollout service over HTTP, in one process: server + gateway + PolarClient + a callback receiver.

Agents here are SIMULATED (`harness: simulation`: a timed process that applies the plan's steps itself, no
model); the evaluation is real (`swe_tests`: the example repo's pytest on a fresh runtime).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import aiohttp

from nemo_polar.rollout import PolarClient, TaskSpec
from nemo_polar.types import SessionResult

from .helpers import CallbackReceiver, example_task, serve, start_gateway, start_server


def test_fix_and_noop_plans_score_through_every_stage_and_callbacks_apply_once(tmp_path: Path) -> None:
    receiver = CallbackReceiver(drop_first_ack=True)

    async def main() -> tuple[list[SessionResult], dict[str, object], str]:
        cb_runner, cb_url = await serve(receiver.app())
        runner, url, _ = await start_server(tmp_path)
        gw = await start_gateway(tmp_path, url)
        try:
            task = example_task("median", plans=("fix_plan", "noop_plan"), callback_url=f"{cb_url}/cb")
            async with PolarClient(url, poll_wait_s=2) as client:
                first = await client.submit(task)
                again = await client.submit(task)  # idempotent by task id
                assert first["created"] is True and again["created"] is False
                results = await asyncio.wait_for(client.collect(task.task_id), timeout=120)
                for _ in range(200):  # callbacks are retried after the dropped first ack
                    status = await client.status(task.task_id)
                    if status["callbacks"].get("delivered") == 2:
                        break
                    await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as http, http.get(gw.config.public_url + "/metrics") as resp:
                metrics = await resp.text()
            return results, status, metrics
        finally:
            await gw.close()
            await runner.cleanup()
            await cb_runner.cleanup()

    results, status, metrics = asyncio.run(main())
    by_sample = {r.sample_index: r for r in results}
    assert sorted(by_sample) == [0, 1]
    assert by_sample[0].reward == 1.0 and by_sample[0].eval is not None and by_sample[0].eval.resolved
    assert by_sample[1].reward == 0.0 and by_sample[1].eval is not None
    assert by_sample[1].eval.details == {"empty_patch": True}
    for r in results:
        assert r.status == "COMPLETED"
        assert r.metadata["group_id"] == "median" and r.metadata["policy_version"] == 1
        assert {"init_s", "run_s", "postrun_s", "total_s"} <= set(r.timing)
    assert status["state"] == "done" and status["results"] == 2
    # the receiver dropped each first ack: two deliveries per key, one key per session, applied once
    assert sorted(receiver.deliveries.values()) == [2, 2]
    assert set(receiver.applied) == {r.session_id for r in results}
    assert 'polar_gateway_sessions_finished_total{node="node-0",status="COMPLETED"} 2' in metrics
    assert "polar_gateway_run_slot_busy_fraction" in metrics


def _sim(task_id: str, n: int, run_s: object) -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "task_id": task_id,
            "instruction": "simulated",
            "num_samples": n,
            "runtime": {"isolation": "none"},
            "agent": {"harness": "simulation", "options": {"run_s": run_s}},
            "builder": "per_request",
            "evaluator": "session_completed",
        }
    )


def test_events_incremental_results_and_least_loaded_placement(tmp_path: Path) -> None:
    async def main() -> tuple[list[str], list[list[int]], list[SessionResult]]:
        runner, url, _ = await start_server(tmp_path)
        gws = [
            await start_gateway(tmp_path / f"g{i}", url, node_id=f"n{i}", run_slots=2, init_workers=2)
            for i in range(2)
        ]
        events: list[str] = []
        pages: list[list[int]] = []
        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(300):  # both nodes registered
                    async with http.get(url + "/nodes") as r:
                        if len(await r.json()) == 2:
                            break
                    await asyncio.sleep(0.05)
                sse = await http.get(url + "/events?task_id=spread")

                async def read_events() -> None:
                    async for raw in sse.content:
                        line = raw.decode().strip()
                        if line.startswith("event: "):
                            events.append(line[7:])
                            if line == "event: task_done":
                                return

                reader = asyncio.create_task(read_events())
                task = _sim("spread", 4, 1.5)
                async with PolarClient(url) as client:
                    await client.submit(task)
                    results = await asyncio.wait_for(client.collect(task.task_id), timeout=120)
                    for after in (0, 2, 4):  # incremental: only what comes after the index
                        async with http.get(f"{url}/tasks/spread/results?after={after}") as r:
                            body = await r.json()
                            pages.append([item["index"] for item in body["results"]])
                            assert body["done"] is True
                await asyncio.wait_for(reader, timeout=30)
                sse.close()
            return events, pages, results
        finally:
            for g in gws:
                await g.close()
            await runner.cleanup()

    events, pages, results = asyncio.run(main())
    assert events[0] == "task_submitted" and events[-1] == "task_done"
    assert events.count("session_dispatched") == 4 and events.count("result") == 4
    assert pages == [[1, 2, 3, 4], [3, 4], []]
    per_node = Counter(r.metadata["node_id"] for r in results)
    assert per_node == Counter({"n0": 2, "n1": 2}), per_node  # least-loaded: two each
