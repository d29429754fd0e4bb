# SPDX-License-Identifier: Apache-2.0
"""Build-time validation of a `pybugs` task on a real runtime: the gold patch resolves it (every FAIL_TO_PASS and
PASS_TO_PASS test passes), the empty patch does not (every FAIL_TO_PASS test fails), each on a fresh runtime and
through the same protocol the evaluator grades agents with (`swe_tests.run_protocol`).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_polar.evaluators.swe_tests import PASSING, SweTestsOptions, run_protocol
from nemo_polar.rollout.runtime import create_runtime
from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.tasks.pybugs import PyBug, gold_patch, task_specs

__all__ = ["Validation", "validate"]


@dataclass
class Validation:
    name: str
    runtime: str
    gold_resolved: bool
    empty_resolved: bool
    f2p_failing_before: int
    f2p_failing_after: int
    p2p_passing_after: int
    n_f2p: int
    n_p2p: int
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.gold_resolved
            and not self.empty_resolved
            and self.f2p_failing_before == self.n_f2p
            and self.f2p_failing_after == 0
            and self.p2p_passing_after == self.n_p2p
        )


async def _grade(spec: TaskSpec, diff: str, root: Path, name: str) -> tuple[dict[str, str], dict[str, str], Any]:
    opts = SweTestsOptions.model_validate(spec.evaluator.options)
    rt = await create_runtime(f"validate.{name}", spec.runtime, root / name, owner="polar-validate")
    try:
        ev = await run_protocol(rt, diff, opts, run_empty=True)
    finally:
        await rt.destroy()
    return dict(ev.details.get("FAIL_TO_PASS", {})), dict(ev.details.get("PASS_TO_PASS", {})), ev


async def validate(bug: PyBug, runtime: str = "local") -> Validation:
    """Validate one task on `runtime` (`local`, `docker`, `podman`; the task image must be built)."""
    (spec,) = task_specs([bug], runtime=runtime)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polar-validate-") as tmp:
        before_f2p, _, ev_before = await _grade(spec, "", Path(tmp), "empty")
        after_f2p, after_p2p, ev_after = await _grade(spec, gold_patch(bug), Path(tmp), "gold")
    return Validation(
        name=bug.name,
        runtime=runtime,
        gold_resolved=ev_after.resolved,
        empty_resolved=ev_before.resolved,
        f2p_failing_before=sum(v not in PASSING for v in before_f2p.values()),
        f2p_failing_after=sum(v not in PASSING for v in after_f2p.values()),
        p2p_passing_after=sum(v in PASSING for v in after_p2p.values()),
        n_f2p=len(bug.fail_to_pass),
        n_p2p=len(bug.pass_to_pass),
        seconds=time.monotonic() - t0,
        details={"gold": ev_after.failure_kind, "empty": ev_before.failure_kind},
    )
