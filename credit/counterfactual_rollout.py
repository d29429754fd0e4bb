# SPDX-License-Identifier: Apache-2.0
"""The real `CounterfactualRunner`: one counterfactual session through the rollout service.

For a recorded session τ and its main-agent call k, `RolloutRunner.run` submits a one-sample copy of the
session's own `TaskSpec` (same runtime, harness, sampling, builder, evaluator) whose plan replays every recorded
main call before k token for token (`{"replay": id}` with the record inline, so any gateway can serve it), puts the
alternative at k (`plan`: the given step, harness-neutral steps resolved by the gateway; `next_best`: the proxy
samples n>1 with seeds and keeps the most likely sample that differs from the recorded action), and then lets the
harness continue live. The task's evaluator scores τ′; `calibrate` turns R(τ) − R(τ′) into Δ_k.

With `records_of` (e.g. the hosted proxy's `records`) the runner also reads τ′'s records: the substituted action
and its token ids for DPO pairs, whether the replayed prompts equal the recorded ones token for token
(`metadata["replay_prompts_equal"]`; a sandboxed runtime shows every session its workdir at one fixed path, so
prompts naming it replay too; with `isolation: none` they name the session's own directory and cannot), and a
`next_best` whose every sample repeated the recorded action (that run is refused: there was no alternative).
Without it the token ids come from τ′'s trajectory spans and the action is unknown.

This module is the only one in `credit/` that talks to the rollout service; it runs no session itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from nemo_polar.errors import PolarError
from nemo_polar.rollout.client import PolarClient
from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.types import CompletionRecord, SessionResult

from .counterfactual import CounterfactualOutcome, CounterfactualRequest, replay_plan

__all__ = ["CounterfactualRunError", "RolloutRunner", "counterfactual_task", "runner_for_run_dir"]

RecordsOf = Callable[[str], Awaitable[Sequence[CompletionRecord]]]


class CounterfactualRunError(PolarError, RuntimeError):
    """A counterfactual session gave no usable Δ (it failed, or `next_best` found no different action)."""

    def __init__(self, message: str, *, session_id: str | None = None):
        super().__init__(message)
        self.session_id = session_id


def counterfactual_task(task: TaskSpec, request: CounterfactualRequest, *, tag: str = "") -> TaskSpec:
    """The one-sample task that runs `request`: the original task with the replay plan and its own id and group
    (a counterfactual never joins the original GRPO group)."""
    alt = request.alternative
    plan = replay_plan(request.records, request.record_id, alt, inline=True)
    key = f"{request.session_id}/{request.record_id}/{alt.kind}/{alt.seed}/{alt.then}/{request.variant}/{tag}"
    if alt.kind == "plan":
        key += "/" + repr(sorted((alt.step or {}).items()))
    task_id = f"{task.task_id[:120]}.cf-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    data = task.model_dump(mode="json", exclude_none=True)
    data.update(
        task_id=task_id,
        num_samples=1,
        plans=[plan],
        early_stop_after=None,
        callback_url=None,
        metadata={
            **data.get("metadata", {}),
            "group_id": task_id,
            "counterfactual": {
                "session_id": request.session_id,
                "record_id": request.record_id,
                "call_index": request.call_index,
                "alternative": alt.kind,
                "seed": alt.seed,
                "variant": request.variant,
            },
        },
    )
    return TaskSpec.model_validate({k: v for k, v in data.items() if v is not None})


class RolloutRunner:
    """`CounterfactualRunner` over a rollout server (`polar serve`, `polar collect`'s in-process service, …).

    Args:
        server_url: the rollout server.
        tasks: the recorded sessions' tasks, by session id (a run directory's `tasks.jsonl` joined with its
            sessions' `task_id`).
        records_of: optional `session_id -> records` of the proxy that served τ′ (see the module docstring).
        tag: mixed into the counterfactual task ids; the server answers a resubmitted task id from its journal,
            so the same tag re-uses a finished run and a new tag runs it again.
    """

    def __init__(
        self,
        server_url: str,
        tasks: Mapping[str, TaskSpec],
        *,
        records_of: RecordsOf | None = None,
        tag: str = "",
        poll_wait_s: float = 5.0,
    ):
        self.server_url = server_url
        self.tasks = dict(tasks)
        self.records_of = records_of
        self.tag = tag
        self.poll_wait_s = poll_wait_s
        self.results: list[SessionResult] = []

    async def run(self, request: CounterfactualRequest) -> CounterfactualOutcome:
        task = self.tasks.get(request.session_id)
        if task is None:
            raise CounterfactualRunError(f"no task for session {request.session_id}", session_id=request.session_id)
        cf = counterfactual_task(task, request, tag=self.tag)
        async with PolarClient(self.server_url, poll_wait_s=self.poll_wait_s) as client:
            await client.submit(cf)
            results = await client.collect(cf.task_id)
        if len(results) != 1:
            raise CounterfactualRunError(f"{cf.task_id}: {len(results)} results for one sample")
        res = results[0]
        self.results.append(res)
        if res.status != "COMPLETED" or res.eval is None:
            raise CounterfactualRunError(
                f"{cf.task_id}: the counterfactual session ended {res.status} ({res.metadata.get('failure')})",
                session_id=res.session_id,
            )
        meta: dict[str, Any] = {"session_id": res.session_id, "task_id": cf.task_id, "status": res.status}
        outcome = CounterfactualOutcome(reward=res.reward, metadata=meta)
        if self.records_of is None:
            outcome.token_ids = _span_tokens(res, request.call_index)
            return outcome
        records = sorted(await self.records_of(res.session_id), key=lambda r: r.seq)
        self._compare(request, records, outcome)
        return outcome

    def _compare(
        self, request: CounterfactualRequest, records: Sequence[CompletionRecord], outcome: CounterfactualOutcome
    ) -> None:
        k = _main_position(request.records, request.record_id)
        recorded = [r for r in sorted(request.records, key=lambda r: r.seq) if r.call_kind == "main"]
        main = [r for r in records if r.call_kind == "main" and r.ok]
        meta = outcome.metadata
        meta["records"] = [r.id for r in records]
        if len(main) <= k:
            meta["replay_prompts_equal"] = False
            raise CounterfactualRunError(
                f"{meta['task_id']}: the harness made {len(main)} main calls, fewer than the {k + 1} replayed",
                session_id=meta["session_id"],
            )
        # the context of call k is the recorded one too: its prompt is compared with the replayed ones
        meta["replay_prompts_equal"] = all(
            a.prompt_token_ids == b.prompt_token_ids for a, b in zip(main[: k + 1], recorded[: k + 1], strict=True)
        )
        meta["replayed_origins"] = [r.origin for r in main[:k]]
        sub = main[k]
        nb = sub.upstream.get("next_best") if isinstance(sub.upstream, dict) else None
        if nb is not None:
            meta["next_best"] = nb
            if nb.get("identical"):
                raise CounterfactualRunError(
                    f"{meta['task_id']}: every next_best sample repeated the recorded action",
                    session_id=meta["session_id"],
                )
        meta["substituted_record"] = sub.id
        outcome.action = {"content": sub.response.get("content") or "", "tool_calls": sub.response.get("tool_calls")}
        outcome.token_ids = list(sub.generation_token_ids)


def _main_position(records: Sequence[CompletionRecord], record_id: str) -> int:
    main = sorted((r for r in records if r.call_kind == "main"), key=lambda r: r.seq)
    return next(i for i, r in enumerate(main) if r.id == record_id)


def _span_tokens(res: SessionResult, call_index: int) -> list[int] | None:
    """Token ids of τ′'s k-th call from the main chain's spans (`None` when the trajectory does not have it).
    `call_index` counts all of τ's calls; with no side calls before k it is also the main-call position."""
    spans = [(t, s, e) for t in res.trajectory.traces if t.chain_kind == "main" for _, s, e in t.call_spans]
    if call_index >= len(spans):
        return None
    t, s, e = spans[call_index]
    return list(t.response_ids[s:e])


def runner_for_run_dir(run_dir: Any, server_url: str, sessions: Sequence[SessionResult], **kw: Any) -> RolloutRunner:
    """A `RolloutRunner` for the sessions of a run directory: each session's task from `RUN_DIR/tasks.jsonl`."""
    from nemo_polar.rollout.spec import load_jsonl
    from nemo_polar.rundir import RunDir

    path = RunDir(run_dir).tasks
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: counterfactual replay re-runs each session's task")
    by_id = {t.task_id: t for t in load_jsonl(path)}
    return RolloutRunner(server_url, {s.session_id: by_id[s.task_id] for s in sessions if s.task_id in by_id}, **kw)
