# SPDX-License-Identifier: Apache-2.0
"""Submit-time checks of a `TaskSpec`'s option blocks against what they name.

`builder.options`, `evaluator.options` and `agent.options` are free-form in the spec (`dict[str, Any]`) because
each depends on the named builder, evaluator or harness. `option_errors(task)` resolves those names and validates
each block against the options model its owner declares: `BuildOptions` for every builder, the evaluator's
registered model (`register_evaluator(name, options=...)`, or an `options_model` attribute on a dotted-path
evaluator), the harness adapter's `options_model` (`AgentOptions` by default) and `SimulationOptions` for the
`simulation` agent. The rollout server answers a task with errors 422 at `POST /tasks`, so a misspelt key is
refused before any session runs instead of failing every sample at POSTRUN. This module runs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from nemo_polar.errors import PolarError

if TYPE_CHECKING:
    from nemo_polar.rollout.spec import TaskSpec

__all__ = ["SIMULATION", "SimulationOptions", "TaskOptionsError", "check_task_options", "option_errors"]

SIMULATION = "simulation"


class SimulationOptions(BaseModel):
    """`agent.options` of the `simulation` agent (a timed process standing in for an agent; no model is called)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_s: float | list[float] = Field(default=0.0, description="seconds to run; a list is indexed by sample")
    exit_code: int = 0


class TaskOptionsError(PolarError, ValueError):
    """A task's option blocks do not fit the builder / evaluator / harness they name; `errors` lists each problem
    as `<block>.<key>: <message>` (e.g. `evaluator.options.FAIL_TO_PAS: Extra inputs are not permitted`)."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("invalid task options: " + "; ".join(errors))


def _check(block: str, model: type[BaseModel], options: Mapping[str, Any], *, whole: bool = True) -> list[str]:
    """Errors of `options` against `model`, each prefixed by `block`. With `whole=False` only per-key errors count
    (the gateway adds its own defaults before the builder's cross-field checks run)."""
    try:
        model.model_validate(dict(options))
    except PydanticValidationError as exc:
        out = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"])
            if loc or whole:
                out.append(f"{block}{'.' + loc if loc else ''}: {e['msg']}")
        return out
    return []


def _builder_errors(task: TaskSpec) -> list[str]:
    from nemo_polar.trajectory.options import BuildOptions
    from nemo_polar.trajectory.registry import get_builder

    try:
        get_builder(task.builder.name)
    except KeyError as exc:
        return [f"builder.name: {exc}"]
    return _check("builder.options", BuildOptions, task.builder.options, whole=False)


def _evaluator_errors(task: TaskSpec) -> list[str]:
    from nemo_polar.evaluators import evaluator_options_model

    try:
        model = evaluator_options_model(task.evaluator.name)
    except KeyError as exc:
        return [f"evaluator.name: {exc}"]
    return [] if model is None else _check("evaluator.options", model, task.evaluator.options)


def _agent_errors(task: TaskSpec) -> list[str]:
    if task.agent.harness == SIMULATION:
        return _check("agent.options", SimulationOptions, task.agent.options)
    from nemo_polar.harness_adapters import get_adapter

    try:
        adapter = get_adapter(task.agent.harness)
    except (KeyError, TypeError) as exc:
        return [f"agent.harness: {exc}"]
    return _check("agent.options", adapter.options_model, task.agent.options)


def option_errors(task: TaskSpec) -> list[str]:
    """Every problem with the task's builder, evaluator and agent names and options (empty: the task is fine)."""
    return [*_builder_errors(task), *_evaluator_errors(task), *_agent_errors(task)]


def check_task_options(task: TaskSpec) -> None:
    """Raise `TaskOptionsError` listing every problem `option_errors` finds."""
    errors = option_errors(task)
    if errors:
        raise TaskOptionsError(errors)
