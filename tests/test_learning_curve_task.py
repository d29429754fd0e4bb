# SPDX-License-Identifier: Apache-2.0
"""The learning curve's task family (polar_lab/learning_curve.py, benchmarks/learning_curve.py): each of the
decisive call's four options, applied to the `port` workspace, gets the reward `expected_reward` claims from the
real `swe_tests` evaluator (the fix 1; distractor edits 0; the test-file hack 0 because tests are restored); the
plan resolves through the shell adapter into steps the proxy accepts; the summary helpers on known numbers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness_adapters.base import HarnessContext, resolve_plan
from harness_adapters.shell import ShellAdapter
from nemo_polar.evaluators import EvalContext, run_evaluator
from nemo_polar.proxy.sessions import Plan
from nemo_polar.rollout.runtime import LocalRuntime
from nemo_polar.rollout.spec import RuntimeSpec
from polar_lab import learning_curve as lc


async def _reward_of(option: dict[str, dict[str, str]], repo: Path, root: Path) -> float:
    spec = RuntimeSpec(isolation="none", source=str(repo))
    agent = await LocalRuntime.create("agent", spec, root / "agent")
    made = []
    try:
        w = option["write"]
        (agent.workdir / w["path"]).write_text(w["content"])
        diff = await agent.diff()

        async def fresh() -> LocalRuntime:
            rt = await LocalRuntime.create(f"fresh{len(made)}", spec, root / f"fresh{len(made)}")
            made.append(rt)
            return rt

        row = lc.task_row(repo)
        ctx = EvalContext(
            task_id=lc.TASK_ID,
            sample_index=0,
            instruction=lc.INSTRUCTION,
            options={"FAIL_TO_PASS": row["FAIL_TO_PASS"], "PASS_TO_PASS": row["PASS_TO_PASS"]},
            status="COMPLETED",
            diff=diff,
            session_dir=root,
            fresh_runtime=fresh,
        )
        return (await run_evaluator("swe_tests", ctx, timeout_s=120)).reward
    finally:
        for rt in [agent, *made]:
            await rt.destroy()


@pytest.mark.parametrize("choice", lc.CHOICES)
def test_each_decisive_option_earns_its_expected_reward(choice: str, tmp_path: Path) -> None:
    repo = lc.write_task_repo(tmp_path / "repo")
    (option,) = [o for o in lc.task_plan()["steps"][3]["choose"] if o["write"]["path"] == choice]
    reward = asyncio.run(_reward_of(option, repo, tmp_path / "run"))
    assert reward == lc.expected_reward(choice)
    assert (reward == 1.0) == (choice == lc.CORRECT)


def test_plan_resolves_to_proxy_steps_with_one_live_choice(tmp_path: Path) -> None:
    ctx = HarnessContext(base_url="http://x", api_key="k", model="m", workdir="/ws", home="/h", command_line="a")
    plan = Plan.parse(resolve_plan(lc.task_plan(), ShellAdapter(), ctx))
    (choose,) = [s for s in plan.steps if "choose" in s]
    assert [Path(o["arguments"]["path"]).name for o in choose["choose"]] == list(lc.CHOICES)
    assert sum("tool" in s for s in plan.steps) == 4 and plan.steps[-1] == {"text": "Done."}


def test_chosen_file_reads_the_decisive_write() -> None:
    call = {"function": {"name": "write", "arguments": json.dumps({"path": "/ws/beta.py", "content": lc.FIX})}}
    assert lc.chosen_file(SimpleNamespace(response={"tool_calls": [call]})) == "beta.py"
    assert lc.chosen_file(SimpleNamespace(response={"content": "hi"})) is None


def test_summary_helpers() -> None:
    assert lc.trajectories_to_threshold([0.0, 0.5, 0.7, 0.9], group=6, threshold=0.6) == 18  # steps 2-3 mean 0.6
    assert lc.trajectories_to_threshold([0.0, 0.2], group=6, threshold=0.6) is None
    m, h = lc.mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and abs(h - 4.303 / 3**0.5) < 1e-9
    assert set(lc.ARMS) >= {"broadcast", "call_credit", "call_credit_per_request"}
    assert {a.estimator for a in lc.ARMS.values()} == {"grpo", "call_credit"}
