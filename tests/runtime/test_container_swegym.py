# SPDX-License-Identifier: Apache-2.0
"""`polar data swe-gym` rows run unmodified in the container runtime when their image is present.

The row is SWE-Gym's schema; its image carries SWE-Gym's name (`xingyaoww/sweb.eval.x86_64.<instance>`) and
SWE-bench's layout (the repository at `/testbed`, the task's Python in the `testbed` conda env's `bin`), built
here FROM a pybugs task image by copying files only (no registry, `--network none`). The session runs through
the real gateway with the SIMULATED agent applying the fix plan (no model: named as a simulation), then
`swe_tests` grades it on a fresh container with the row's own `python -m pytest`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from nemo_polar.data.swe_gym import convert_row
from nemo_polar.rollout.gateway import Gateway, GatewayConfig
from nemo_polar.runtime.container import gateway_owner
from nemo_polar.runtime.engines import Engine
from nemo_polar.runtime.images import ensure_task_image
from nemo_polar.tasks.pybugs import build_tree, fix_plan, select


def _swe_gym_image(engine: Engine, base_image: str, name: str) -> tuple[str, Any, str]:
    (bug,) = select(["inflection-ordinal"])
    tree, base_commit = build_tree(bug)
    task_image = ensure_task_image(engine, bug.name, tree, base_image).tag
    with tempfile.TemporaryDirectory() as ctx:
        env_bin = Path(ctx) / "envbin"
        env_bin.mkdir()
        os.symlink("/usr/bin/python3", env_bin / "python")  # SWE-bench's conda env layout, Debian's Python
        (Path(ctx) / "Dockerfile").write_text(f"FROM {task_image}\nCOPY envbin /opt/miniconda3/envs/testbed/bin\n")
        env = {**os.environ, **engine.env, "DOCKER_BUILDKIT": "0"}
        args = ["build", "--network", "none", "-t", name, ctx] + (["--pull=never"] if engine.kind == "podman" else [])
        proc = subprocess.run(engine.argv(*args), env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    return name, bug, base_commit


def test_swe_gym_row_runs_unmodified_in_a_container(container_engine: Engine, base_image: str, tmp_path: Path) -> None:
    instance = "jpvanhal__inflection-13"
    image = f"xingyaoww/sweb.eval.x86_64.{instance.replace('__', '_s_')}"
    _, bug, base_commit = _swe_gym_image(container_engine, base_image, image)
    row = {
        "instance_id": instance,
        "repo": "jpvanhal/inflection",
        "base_commit": base_commit,
        "problem_statement": bug.problem_statement,
        "FAIL_TO_PASS": list(bug.fail_to_pass),
        "PASS_TO_PASS": list(bug.pass_to_pass),
    }
    _, task = convert_row(row, runtime=container_engine.kind)
    assert task.runtime.image == image and task.runtime.kind == container_engine.kind
    task = task.model_copy(
        update={
            "agent": task.agent.model_validate({"harness": "simulation", "options": {"run_s": 0.2}}),
            "plans": [fix_plan(bug)],
            "builder": task.builder.model_validate("per_request"),
        }
    )
    results: list[Any] = []

    async def keep(result: Any) -> None:
        results.append(result)

    async def go() -> None:
        gw = Gateway(GatewayConfig(node_id="swegym", work_dir=str(tmp_path / "gw")), on_result=keep)
        await gw.start()
        try:
            assert gw.submit(f"{task.task_id}-0", task, 0) != "full"
            await gw.wait_idle(600)
        finally:
            await gw.stop()

    asyncio.run(go())
    (result,) = results
    assert result.eval is not None and result.reward == 1.0, (result.eval, result.metadata)
    assert set(result.eval.details["FAIL_TO_PASS"].values()) == {"PASSED"}
    owner = gateway_owner(tmp_path / "gw")
    left = container_engine.run_sync("ps", "-a", "-q", "--filter", f"label=polar.owner={owner}").stdout.split()
    assert left == [], "every container of the session (agent and fresh evaluation runtime) was removed"
