# SPDX-License-Identifier: Apache-2.0
"""Evaluator contract, registry and the containment wrapper the gateway calls.

An evaluator is `async def evaluate(ctx: EvalContext) -> EvalResult`. The gateway never calls one directly:
`run_evaluator` resolves it (registry name or dotted path `pkg.mod:fn` / `pkg.mod.fn`), applies a timeout and
turns every failure into an `EvalResult` with reward 0, a `failure_kind` and — for infrastructure failures
(the evaluator crashed, timed out, was not found, returned garbage) — `mask_sample=True`, so a broken verifier
never crashes a gateway nor trains the policy on a wrong 0.

Each evaluator may declare the pydantic model of its `options` (`register_evaluator(name, options=Model)`, or an
`options_model` attribute on a dotted-path evaluator); the rollout server checks a task's `evaluator.options`
against it at submit (`nemo_polar.rollout.task_options`). This module runs no tests itself; see `swe_tests`,
`command`, `session_completed`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from nemo_polar.loading import lookup
from nemo_polar.types import EvalResult, Trajectory, ValidationError

if TYPE_CHECKING:
    from nemo_polar.rollout.runtime import Runtime

__all__ = [
    "EvalContext",
    "Evaluator",
    "apply_trace_rewards",
    "evaluator_options_model",
    "failure",
    "get_evaluator",
    "read_options",
    "register_evaluator",
    "run_evaluator",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EvalContext:
    """What an evaluator may look at. `runtime` is the session's own (still alive in POSTRUN);
    `fresh_runtime()` makes a clean copy of the task's runtime (prepare actions applied) — the gateway
    destroys every runtime it hands out once evaluation is over."""

    task_id: str
    sample_index: int
    instruction: str
    options: Mapping[str, Any]
    status: str
    diff: str
    session_dir: Path
    agent_exit_code: int | None = None
    trajectory: Trajectory | None = None
    runtime: Runtime | None = None
    fresh_runtime: Callable[[], Awaitable[Runtime]] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


Evaluator = Callable[[EvalContext], Awaitable[EvalResult]]

_REGISTRY: dict[str, Evaluator] = {}
OPTIONS_ATTR = "options_model"
"""An evaluator function may carry a pydantic model of its `options` under this attribute."""


def register_evaluator(name: str, *, options: type[BaseModel] | None = None) -> Callable[[Evaluator], Evaluator]:
    """Register an evaluator under `name`; `options` is the pydantic model its `EvaluatorSpec.options` must fit
    (checked when a task is submitted). A dotted-path evaluator declares one as its `options_model` attribute."""

    def deco(fn: Evaluator) -> Evaluator:
        if options is not None:
            setattr(fn, OPTIONS_ATTR, options)
        _REGISTRY[name] = fn
        return fn

    return deco


def evaluator_options_model(name: str) -> type[BaseModel] | None:
    """The options model the named evaluator declares (None: it declares none, its options are not checked).
    Raises `LoadError` when the evaluator cannot be found."""
    model = getattr(get_evaluator(name), OPTIONS_ATTR, None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def get_evaluator(name: str) -> Evaluator:
    """A registered evaluator, or one importable by dotted path; `LoadError` (a `KeyError`) when neither."""
    return lookup(_REGISTRY, name, what="evaluator")  # type: ignore[no-any-return]


def failure(kind: str, reason: str, *, mask_sample: bool, **details: Any) -> EvalResult:
    """Reward 0 with a failure kind (`mask_sample` for infrastructure failures)."""
    return EvalResult(
        reward=0.0,
        resolved=False,
        mask_sample=mask_sample,
        failure_kind=kind,
        failure_reason=reason[-2000:],
        details=dict(details),
    )


_M = TypeVar("_M", bound=BaseModel)


def read_options(model: type[_M], ctx: EvalContext, what: str) -> _M | EvalResult:
    """`ctx.options` validated by the evaluator's options `model`, or a masked `evaluator_config` failure naming
    `what` when they do not fit (the rollout server checks them at submit: only a task that bypassed it gets here)."""
    try:
        return model.model_validate(dict(ctx.options))
    except PydanticValidationError as exc:
        return failure("evaluator_config", f"{what}: {exc}", mask_sample=True)


async def run_evaluator(name: str, ctx: EvalContext, *, timeout_s: float) -> EvalResult:
    """Resolve and run an evaluator; never raises (except cancellation of the caller)."""
    try:
        fn = get_evaluator(name)
    except KeyError as exc:
        return failure("evaluator_not_found", str(exc), mask_sample=True)
    try:
        result = await asyncio.wait_for(fn(ctx), timeout=timeout_s)
    except TimeoutError:
        return failure("evaluator_timeout", f"evaluator {name!r} exceeded {timeout_s}s", mask_sample=True)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("evaluator %s crashed on %s/%s", name, ctx.task_id, ctx.sample_index, exc_info=True)
        return failure("evaluator_error", f"{type(exc).__name__}: {exc}", mask_sample=True)
    if not isinstance(result, EvalResult):
        return failure("evaluator_bad_result", f"evaluator returned {type(result).__name__}", mask_sample=True)
    try:
        return result.validate()
    except ValidationError as exc:
        return failure("evaluator_bad_result", str(exc), mask_sample=True)


def apply_trace_rewards(trajectory: Trajectory, trace_rewards: Mapping[str, float]) -> tuple[Trajectory, list[str]]:
    """The trajectory with `EvalResult.trace_rewards` applied: a trace whose first record id is named gets that
    reward (and `metadata["reward_source"] = "trace"`); the others keep the session reward the builder gave them.
    Returns the new trajectory and the keys that named no trace (reported, never fatal). Pure: inputs untouched."""
    if not trace_rewards:
        return trajectory, []
    traces, used = [], set()
    for trace in trajectory.traces:
        key = trace.call_spans[0][0] if trace.call_spans else None
        if key is not None and key in trace_rewards:
            used.add(key)
            trace = replace(
                trace, reward=float(trace_rewards[key]), metadata={**trace.metadata, "reward_source": "trace"}
            )
        traces.append(trace)
    return replace(trajectory, traces=traces), sorted(set(trace_rewards) - used)
