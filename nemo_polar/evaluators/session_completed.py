# SPDX-License-Identifier: Apache-2.0
"""`session_completed`: reward 1.0 when the session completed and the agent exited 0, else 0.0.

A smoke-test evaluator: it checks the plumbing, not the work. It never runs anything.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from nemo_polar.evaluators.base import EvalContext, register_evaluator
from nemo_polar.types import EvalResult, TrajectoryStatus


class NoOptions(BaseModel):
    """`session_completed` takes no options: any key is refused when a task is submitted."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@register_evaluator("session_completed", options=NoOptions)
async def session_completed(ctx: EvalContext) -> EvalResult:
    ok = ctx.status == TrajectoryStatus.COMPLETED.value and ctx.agent_exit_code in (0, None)
    return EvalResult(
        reward=1.0 if ok else 0.0,
        resolved=ok,
        details={"status": ctx.status, "agent_exit_code": ctx.agent_exit_code},
    )
