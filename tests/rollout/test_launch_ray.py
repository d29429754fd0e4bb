# SPDX-License-Identifier: Apache-2.0
"""`polar launch --ray`: the rollout server and two gateway actors on a fresh local Ray cluster complete a task.

The real CLI runs as a subprocess (its own Ray driver), on loopback only: Ray's node IP is 127.0.0.1 and every
server binds it. The task is an example repo run by the deterministic `simulation` agent (`fix_plan` scores 1.0,
`noop_plan` 0.0 with `swe_tests`), spread over both gateways by least-loaded placement. SIGINT stops the actors
and Ray; afterwards no process of that Ray session (its temp dir is on their command lines) is left.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.backend.server import free_port
from nemo_polar.rollout import PolarClient
from nemo_polar.rollout.client import PolarClientError
from nemo_polar.types import SessionResult

from ..procs import processes_with
from .helpers import example_task

# checked without importing Ray here: only the CLI's own process is a Ray driver
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="Ray is the `ray` extra (make test installs it)"
)

PY = sys.executable
SECRET = "launch-secret"


def _ready_line(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    """The CLI's one JSON line announcing the server and the gateways (Ray may print other lines first)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if not sel.select(left):
            continue
        line = proc.stdout.readline()
        if not line:
            break
        with_server: Any = None
        try:
            with_server = json.loads(line)
        except ValueError:
            continue
        if isinstance(with_server, dict) and "server" in with_server:
            return with_server
    raise AssertionError(f"polar launch did not get ready (exit {proc.poll()})")


@pytest.mark.slow
def test_launch_ray_completes_a_task_with_two_gateway_actors(tmp_path: Path) -> None:
    port = free_port()
    ray_tmp = tempfile.mkdtemp(prefix="polar-ray-")  # short: Ray's unix socket paths must fit in 107 bytes
    env = dict(os.environ)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # single-node Ray on loopback, as tests/gym/ runs it
    env["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage report leaves the machine
    argv = [PY, "-m", "nemo_polar.cli", "launch", "--ray", "--gateways", "2", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--work-dir", str(tmp_path / "run"), "--ray-address", "local"]
    argv += ["--ray-num-cpus", "2", "--ray-node-ip", "127.0.0.1", "--ray-temp-dir", ray_tmp]
    # with the rollout service's shared secret: the actors get it from the driver, gateways authenticate with it
    (tmp_path / "secret").write_text(SECRET + "\n")
    argv += ["--secret-file", str(tmp_path / "secret")]
    env.pop("POLAR_ROLLOUT_SECRET", None)
    env.pop("POLAR_ROLLOUT_SECRET_FILE", None)
    log = (tmp_path / "launch.log").open("w")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True)
    try:
        ready = _ready_line(proc, timeout_s=300)
        assert ready["server"] == f"http://127.0.0.1:{port}"
        assert len(ready["gateways"]) == 2 and all(u.startswith("http://127.0.0.1:") for u in ready["gateways"])

        task = example_task("median", plans=("fix_plan", "noop_plan"))

        async def run() -> tuple[list[SessionResult], dict[str, Any]]:
            async with PolarClient(ready["server"], secret="") as anonymous:
                with pytest.raises(PolarClientError) as refused:
                    await anonymous.submit(task)
                assert refused.value.status == 401
            async with PolarClient(ready["server"], poll_wait_s=2, secret=SECRET) as client:
                await client.submit(task)
                results = await asyncio.wait_for(client.collect(task.task_id), timeout=240)
                return results, await client.status(task.task_id)

        results, status = asyncio.run(run())
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
        leftovers = list(processes_with(ray_tmp).values())
        shutil.rmtree(ray_tmp, ignore_errors=True)
    launch_log = (tmp_path / "launch.log").read_text()[-3000:]
    assert proc.returncode == 0, launch_log
    assert leftovers == [], leftovers  # no raylet, gcs_server or worker of that Ray session survives

    by_sample = {r.sample_index: r for r in results}
    assert sorted(by_sample) == [0, 1] and status["state"] == "done"
    assert by_sample[0].reward == 1.0 and by_sample[1].reward == 0.0
    assert all(r.status == "COMPLETED" for r in results)
    # least-loaded placement put one session on each gateway actor
    assert {r.metadata["node_id"] for r in results} == {"node-0", "node-1"}
