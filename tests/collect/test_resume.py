# SPDX-License-Identifier: Apache-2.0
"""`polar collect` interrupted (SIGINT, as Ctrl-C) and re-run: the run completes, every sample has exactly one
result, and no session that had finished before the interruption runs again.

The agent is the rollout service's `simulation` agent (a timed process, no model: named so in
`nemo_polar.rollout.simulation`) — what is under test is the collector, the rollout server's journal and the
gateway, not a model. Sample 0 of each task is quick, sample 1 slow, so the interruption always finds sessions
both finished and in flight.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemo_polar.rollout.spec import TaskSpec, dump_jsonl

REPO = Path(__file__).resolve().parents[2]


def _tasks(path: Path) -> None:
    tasks = [
        TaskSpec.model_validate(
            {
                "task_id": f"sim{k}",
                "instruction": "sleep",
                "num_samples": 2,
                "runtime": {"isolation": "none"},
                "agent": {"harness": "simulation", "options": {"run_s": [0.2, 12.0]}},
                "builder": "per_request",
                "evaluator": "session_completed",
                "timeout_s": 300,
                "metadata": {"repo": f"org/repo{k}"},
            }
        )
        for k in range(2)
    ]
    dump_jsonl(tasks, path)


def _collect(tasks: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nemo_polar.cli", "collect", str(tasks), "--out", str(out), "--no-live"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _lines(path: Path) -> list[bytes]:
    return [x for x in path.read_bytes().splitlines() if x.strip()] if path.exists() else []


def test_interrupt_then_rerun_completes_without_redoing_finished_sessions(tmp_path: Path) -> None:
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "run"
    _tasks(tasks)
    traj = out / "trajectories.jsonl"

    proc = _collect(tasks, out)
    try:
        deadline = time.monotonic() + 240
        while len(_lines(traj)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, f"collect ended before it was interrupted:\n{proc.communicate()[0]}"
        assert len(_lines(traj)) >= 2, "no session finished in time"
        proc.send_signal(signal.SIGINT)
        log1, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, log1
    assert "re-run the same command to resume" in log1

    before = _lines(traj)
    finished = {json.loads(x)["session_id"]: json.loads(x) for x in before}
    assert 2 <= len(finished) < 4, log1
    mtimes = {sid: os.stat(out / "sessions" / sid / "result.json").st_mtime_ns for sid in finished}
    done_samples = {(r["task_id"], r["sample_index"]) for r in finished.values()}

    proc = _collect(tasks, out)
    log2, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log2
    assert f"resuming: {len(finished)}/4 sessions already finished" in log2

    after = _lines(traj)
    assert after[: len(before)] == before, "lines written before the interruption are kept as they were"
    results = [json.loads(x) for x in after]
    samples = [(r["task_id"], r["sample_index"]) for r in results]
    assert sorted(samples) == [("sim0", 0), ("sim0", 1), ("sim1", 0), ("sim1", 1)]  # each sample exactly once
    for sid, mtime in mtimes.items():  # finished sessions did not run again
        assert os.stat(out / "sessions" / sid / "result.json").st_mtime_ns == mtime
    for task_id, i in done_samples:
        dirs = sorted(p.name for p in (out / "sessions").iterdir() if p.name.startswith(f"{task_id}.s{i}."))
        assert dirs == [f"{task_id}.s{i}.a0"], dirs
    for r in results[len(before) :]:  # the cut sessions were redone as a new attempt
        assert r["status"] == "COMPLETED" and r["eval"]["reward"] == 1.0, r
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total"]["attempts"] == 4 and summary["total"]["accepted"] == 4
    assert set(summary["by_repo"]) == {"org/repo0", "org/repo1"}

    proc = _collect(tasks, out)  # a third run has nothing left to do
    log3, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "collected 0 new session(s) (4 from before)" in log3, log3
    assert _lines(traj) == after


def test_a_different_task_set_in_the_same_run_directory_is_refused(tmp_path: Path) -> None:
    from nemo_polar.collect import CollectError, CollectOptions, collect

    tasks = tmp_path / "tasks.jsonl"
    _tasks(tasks)
    from nemo_polar.rollout.spec import load_jsonl

    specs = load_jsonl(tasks)
    out = tmp_path / "run"
    out.mkdir()
    dump_jsonl(specs, out / "tasks.jsonl")
    changed = [specs[0].model_copy(update={"instruction": "something else"}), specs[1]]
    with pytest.raises(CollectError, match="different tasks"):
        collect(changed, CollectOptions(out=out))


def test_collect_stops_resumably_when_the_model_server_goes_away(tmp_path: Path) -> None:
    """No model server answers at --upstream (a closed loopback port): the run stops with a clear message
    instead of turning every remaining session into failed calls."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "run"
    _tasks(tasks)
    argv = ["collect", str(tasks), "--out", str(out), "--no-live", "--upstream", f"http://127.0.0.1:{port}"]
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_polar.cli", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "stopped answering" in proc.stderr and "re-run the same command to resume" in proc.stderr
