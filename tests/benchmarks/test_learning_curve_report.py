# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/learning_curve.py`'s report check: a step whose records, rewards or served weights disagree with
the policy that ran it is reported (the benchmark then exits non-zero)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import learning_curve


def _step(**over: object) -> dict[str, object]:
    step: dict[str, object] = {
        "step": 2,
        "policy_version": 2,
        "record_policy_versions": [2],
        "reward_matches_choice": True,
        "masked": 0,
        "rewards": [1.0, 0.0],
        "choices": ["beta.py", "alpha.py"],
        "served_vs_trainer_logprob_diff": 9.5e-7,
    }
    step.update(over)
    return step


def test_problems_flags_stale_served_weights_and_other_bad_steps() -> None:
    report = {"policies": {"broadcast/0": {"steps": [_step()]}}}
    assert learning_curve.problems(report) == []
    report["policies"]["broadcast/0"]["steps"] = [
        _step(served_vs_trainer_logprob_diff=5.49),  # the in-place reload that did not reach the linear layers
        _step(record_policy_versions=[1]),
        _step(reward_matches_choice=False),
        _step(masked=2),
    ]
    found = learning_curve.problems(report)
    assert len(found) == 4
    assert "other weights than the trainer's" in found[0] and "records at [1]" in found[1]
    assert "disagree" in found[2] and "every sample masked" in found[3]
