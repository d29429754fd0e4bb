# SPDX-License-Identifier: Apache-2.0
"""Optional per-trace rewards: an evaluator scores a subagent chain apart from the session, and POSTRUN's
trajectory carries that reward on that trace only (the others keep the session reward); a key naming no trace is
reported, a non-finite one makes the verdict a masked failure.

POSTRUN runs for real (`SessionWork.postrun`: build → evaluate → rebuild with the reward → apply trace rewards);
its proxy link is a stub that hands over two recorded calls (main, subagent), the only part not exercised here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nemo_polar.evaluators import EvalContext
from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.rollout.stages import Job, SessionWork
from nemo_polar.types import CompletionRecord, EvalResult, SessionResult

P_MAIN = [1, 10, 100, 2, 3, 1, 11, 101, 2, 3, 1, 12]
P_SUB = [1, 10, 150, 2, 3, 1, 11, 151, 2, 3, 1, 12]


def _rec(rid: str, seq: int, prompt: list[int], gen: list[int], call_kind: str) -> CompletionRecord:
    return CompletionRecord(
        id=rid,
        session_id="sess",
        seq=seq,
        dialect="openai_chat",
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.5] * len(gen),
        call_kind=call_kind,
    ).validate()


class _Records:
    """Stands in for the hosted proxy: the session's committed records."""

    base_url = "http://127.0.0.1:9"
    idle_limit_s = 1800

    def __init__(self, records: list[CompletionRecord]):
        self._records = records

    async def open_session(self, request: Any) -> Any:
        raise AssertionError("POSTRUN opens no session")

    async def close_session(self, session_id: str) -> None:
        return None

    async def records(self, session_id: str) -> list[CompletionRecord]:
        return self._records


async def score_subagent_apart(ctx: EvalContext) -> EvalResult:
    """Session reward 1.0; the subagent chain (found in the trajectory the evaluator is shown) gets 0.25."""
    assert ctx.trajectory is not None
    sub = [t.call_spans[0][0] for t in ctx.trajectory.traces if t.chain_kind == "subagent"]
    return EvalResult(reward=1.0, resolved=True, trace_rewards={**dict.fromkeys(sub, 0.25), "no-such-trace": 0.5})


async def non_finite_trace_reward(ctx: EvalContext) -> EvalResult:
    return EvalResult(reward=1.0, trace_rewards={"r0": float("nan")})


def _postrun(tmp_path: Path, evaluator: str) -> SessionResult:
    records = [_rec("r0", 0, P_MAIN, [200, 2], "main"), _rec("r1", 1, P_SUB, [250, 251, 2], "subagent")]
    task = TaskSpec.model_validate(
        {
            "task_id": "t",
            "instruction": "x",
            "runtime": {"isolation": "none"},
            "agent": {"harness": "simulation"},
            "builder": "per_request",
            "evaluator": f"{__name__}:{evaluator}",
        }
    )
    work = SessionWork(
        node_id="n0",
        work_dir=tmp_path,
        proxy=_Records(records),
        model="m",
        builder_options={},
        keep_runtimes=False,
    )
    job = Job("sess", task, 0, 0, tmp_path / "sessions" / "sess", proxy_session="sess")
    job.session_dir.mkdir(parents=True)
    return asyncio.run(work.postrun(job))


def test_an_evaluator_scores_a_subagent_trace_apart_and_the_trajectory_carries_it(tmp_path: Path) -> None:
    result = _postrun(tmp_path / "ok", "score_subagent_apart")
    assert result.eval is not None and result.eval.reward == 1.0
    by_first = {t.call_spans[0][0]: t for t in result.trajectory.traces}
    assert set(by_first) == {"r0", "r1"} and by_first["r1"].chain_kind == "subagent"
    assert by_first["r0"].reward == 1.0 and "reward_source" not in by_first["r0"].metadata  # the session's
    assert by_first["r1"].reward == 0.25 and by_first["r1"].metadata["reward_source"] == "trace"
    assert result.metadata["unmatched_trace_rewards"] == ["no-such-trace"]
    # what a trainer gets over the API: the same, after a JSON round trip
    again = SessionResult.from_json(result.to_json())
    assert [t.reward for t in again.trajectory.traces] == [t.reward for t in result.trajectory.traces]
    assert again.eval is not None and again.eval.trace_rewards == {"r1": 0.25, "no-such-trace": 0.5}

    bad = _postrun(tmp_path / "bad", "non_finite_trace_reward")
    assert bad.eval is not None and bad.eval.mask_sample and bad.eval.failure_kind == "evaluator_bad_result"
    assert bad.eval.reward == 0.0 and bad.eval.trace_rewards == {}
    assert all(t.reward == 0.0 for t in bad.trajectory.traces)
