# SPDX-License-Identifier: Apache-2.0
"""`polar demo --tasks pybugs:NAME`: a real-repository task in the demo, beside the example tasks."""

from __future__ import annotations

from nemo_polar.demo import DEMO_AGENT_TIMEOUT_S, DEMO_SAMPLING, demo_specs
from nemo_polar.tasks import pybugs


def test_demo_takes_a_real_repository_task_beside_the_examples() -> None:
    (bug,) = pybugs.select(["webcolors-short-hex"])
    example, real = demo_specs(["median", "pybugs:webcolors-short-hex"])
    assert example.task_id == "median" and real.task_id == bug.instance_id
    assert real.runtime.kind == "local" and real.evaluator.name == "swe_tests"
    assert real.evaluator.options["FAIL_TO_PASS"] == list(bug.fail_to_pass)
    assert real.num_samples == 2 and real.plans is not None
    assert real.plans[0] == pybugs.fix_plan(bug) and real.plans[1] == pybugs.NOOP_PLAN  # reward 1 and 0
    for spec in (example, real):  # the demo's short, bounded live calls for both kinds
        assert spec.agent.timeout_s == DEMO_AGENT_TIMEOUT_S and spec.agent.sampling == DEMO_SAMPLING
