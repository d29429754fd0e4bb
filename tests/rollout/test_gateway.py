# SPDX-License-Identifier: Apache-2.0
"""Gateway stages in isolation (no rollout server): ordered prepare actions with retries, INIT failures as masked
results, post-run hooks, the sequential baseline mode, and `polar serve` as a subprocess.

Agents are SIMULATED (`harness: simulation`: timed processes, no model).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from nemo_polar.backend.server import free_port
from nemo_polar.rollout import PolarClient, TaskSpec
from nemo_polar.types import SessionResult

from .helpers import start_gateway

ROOT = Path(__file__).resolve().parents[2]
HOOK_CALLS: list[tuple[str, str]] = []


def record_hook(session_dir: Path, result: dict[str, Any]) -> None:
    HOOK_CALLS.append((session_dir.name, result["status"]))


def _task(task_id: str, **over: Any) -> TaskSpec:
    data: dict[str, Any] = {
        "task_id": task_id,
        "instruction": "simulated",
        "runtime": {"isolation": "none"},
        "agent": {"harness": "simulation", "options": {"run_s": 0.0}},
        "builder": "per_request",
        "evaluator": {"name": "command", "options": {"command": "test -f made_by_agent && test -f data/b.txt"}},
    }
    data.update(over)
    return TaskSpec.model_validate(data)


async def _run(tmp: Path, tasks: list[TaskSpec], **gw: Any) -> list[SessionResult]:
    out: list[SessionResult] = []

    async def keep(res: SessionResult) -> None:
        out.append(res)

    g = await start_gateway(tmp, None, **gw)
    g.on_result = keep
    try:
        for i, t in enumerate(tasks):
            assert g.submit(f"{t.task_id}-{i}", t, 0) == "admitted"
        await g.wait_idle(120)
    finally:
        await g.close()
    return sorted(out, key=lambda r: r.session_id)


def test_prepare_actions_in_order_with_retries_and_post_run_hooks(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "data" / "b.txt").write_text("b")
    counter = tmp_path / "attempts"
    plan = {"steps": [{"shell": "test -f a.txt && touch made_by_agent"}]}
    good = _task(
        "prep",
        plans=[plan],
        session={
            "prepare": [
                {"kind": "upload_file", "dest": "a.txt", "content": "a"},
                {"kind": "upload_dir", "src": str(src), "dest": "."},
                # fails on the first attempt, succeeds on the retry
                {"kind": "exec", "command": f"echo x >> {counter}; test $(wc -l < {counter}) -ge 2", "retries": 2},
            ],
            "post_run": [
                {"kind": "exec", "command": "test -f made_by_agent"},
                {"kind": "python", "target": f"{__name__}.record_hook"},
                {"kind": "exec", "command": "exit 3"},
            ],
        },
    )
    bad = _task("prepfail", session={"prepare": [{"kind": "exec", "command": "exit 7", "retries": 1}]})
    HOOK_CALLS.clear()
    ok, failed = asyncio.run(_run(tmp_path, [good, bad]))
    assert ok.status == "COMPLETED" and ok.reward == 1.0, ok.eval
    assert counter.read_text().count("x") == 2
    assert HOOK_CALLS == [(ok.session_id, "COMPLETED")]
    assert ok.metadata["hook_errors"] == ["post_run[2]: RuntimeError: exit 3"]
    assert failed.status == "ERROR" and failed.eval is not None
    assert (failed.eval.failure_kind, failed.eval.mask_sample) == ("init_failed", True)
    assert "exit 7" in str(failed.eval.failure_reason)


def test_sequential_baseline_mode_runs_the_same_sessions(tmp_path: Path) -> None:
    tasks = [
        _task(f"seq{i}", plans=[{"steps": [{"shell": "touch made_by_agent; mkdir -p data; touch data/b.txt"}]}])
        for i in range(3)
    ]
    results = asyncio.run(_run(tmp_path, tasks, staged=False, run_slots=2, ready_buffer=3))
    assert [r.reward for r in results] == [1.0, 1.0, 1.0]
    assert all({"init_s", "run_s", "postrun_s"} <= set(r.timing) for r in results)


def test_polar_serve_runs_a_task(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nemo_polar.cli", "serve", "--port", str(port), "--work-dir", str(tmp_path / "run")],
        cwd=ROOT,
        stdout=(tmp_path / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    task = _task("served", plans=[{"steps": [{"shell": "touch made_by_agent; mkdir -p data; touch data/b.txt"}]}])

    async def main() -> list[SessionResult]:
        async with PolarClient(f"http://127.0.0.1:{port}", poll_wait_s=1) as client:
            for _ in range(300):
                try:
                    await client.submit(task)
                    break
                except Exception:
                    await asyncio.sleep(0.2)
            return await asyncio.wait_for(client.collect(task.task_id), timeout=120)

    try:
        (res,) = asyncio.run(main())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert res.reward == 1.0
    session_dir = tmp_path / "run" / "sessions" / res.session_id
    assert json.loads((session_dir / "result.json").read_text())["session_id"] == res.session_id
    assert (session_dir / "diff.patch").read_text().startswith("diff --git")
    assert proc.returncode == 0
    assert (tmp_path / "run" / "rollout.sqlite").exists()


def test_session_budget_counts_from_init(tmp_path: Path) -> None:
    """INIT that outlasts the session budget: TIMEOUT, masked, no agent run."""
    slow_init = _task("slowinit", timeout_s=1.5, session={"prepare": [{"kind": "exec", "command": "sleep 30"}]})
    (res,) = asyncio.run(_run(tmp_path, [slow_init]))
    assert res.status == "TIMEOUT" and res.metadata["failure"]["kind"] == "init_timeout"
    assert res.eval is not None and res.eval.mask_sample and "run_s" not in res.timing
