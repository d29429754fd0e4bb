# SPDX-License-Identifier: Apache-2.0
"""A Polar `SessionResult` (+ its proxy records) → what a NeMo Gym rollout record carries (docs/nemo.md).

- `gym_response`: a Responses-API response whose `output` is the session's MAIN chain as output items (the last
  item of each trained call carries `prompt_token_ids` / `generation_token_ids` / `generation_log_probs`); one
  record is one contiguous token chain, so other chains never enter it.
- `polar_calls`: CALL-CREDIT annotations, one entry per generated segment of that delivered chain, in order
  (`call_index` session-wide, `parents` = causal edges).
- `polar_summary`: builder stats (`delivered_fraction`, splits, …) and every chain NOT delivered (kind, calls,
  trainable tokens), so nothing is lost silently.

Pure functions of data: no NeMo Gym import, no network.
"""

from __future__ import annotations

from typing import Any

from nemo_polar.trajectory import to_gym_output_items
from nemo_polar.trajectory.export import trained_calls
from nemo_polar.types import ChainKind, CompletionRecord, SessionResult, Trace

__all__ = ["delivered_trace", "gym_response", "polar_calls", "polar_summary"]


def delivered_trace(result: SessionResult) -> Trace | None:
    """The trace one Gym record delivers: the first trace when it is the main chain (builders put it first)."""
    traces = result.trajectory.traces
    if traces and traces[0].chain_kind == ChainKind.MAIN.value:
        return traces[0]
    return None


def gym_response(
    result: SessionResult, records: list[CompletionRecord], *, model: str, created_at: int
) -> dict[str, Any]:
    trace = delivered_trace(result)
    by_id = {r.id: r for r in records}
    output = to_gym_output_items(trace, by_id) if trace is not None else []
    return {
        "id": f"resp_{result.session_id}",
        "created_at": created_at,
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }


def polar_calls(result: SessionResult, records: list[CompletionRecord], *, harness: str) -> list[dict[str, Any]]:
    """docs/nemo.md's `polar_calls` for the delivered chain: `{call_index, record_id, role, evidence, parents,
    chain_kind}` per trained call, in chain order (the graph is built over the whole session)."""
    trace = delivered_trace(result)
    if trace is None or not records:
        return []
    from nemo_polar.credit import annotate  # torch comes with it: imported only when annotating

    graph = annotate(records, harness=harness, session_id=result.session_id)
    kinds = {rid: t.chain_kind for t in result.trajectory.traces for rid, _, _ in t.call_spans}
    entries = {e["record_id"]: e for e in graph.polar_calls(kinds)}
    out = []
    for rid, _, _ in trained_calls(trace):
        entry = entries.get(rid)
        out.append(
            entry
            if entry is not None
            else {
                "call_index": None,
                "record_id": rid,
                "role": "OTHER",
                "evidence": [],
                "parents": [],
                "chain_kind": trace.chain_kind,
            }
        )
    # call_index must increase along the chain; a record missing from the graph gets the next free index
    last = -1
    for e in out:
        if e["call_index"] is None or e["call_index"] <= last:
            e["call_index"] = last + 1
        last = e["call_index"]
    return out


def polar_summary(result: SessionResult, *, elapsed_s: float) -> dict[str, Any]:
    traj = result.trajectory
    delivered = delivered_trace(result)
    others = [
        {
            "trace_index": i,
            "chain_kind": t.chain_kind,
            "calls": len(t.call_spans),
            "trainable_tokens": sum(t.loss_mask),
        }
        for i, t in enumerate(traj.traces)
        if t is not delivered
    ]
    return {
        "session_id": result.session_id,
        "task_id": result.task_id,
        "status": result.status,
        "harness": result.harness,
        "records": len(result.record_ids),
        "delivered_chain": None if delivered is None else delivered.chain_kind,
        "delivered_fraction": traj.stats.delivered_fraction if delivered is not None else 0.0,
        "stats": traj.stats.to_dict(),
        "other_chains": others,
        "agent_exit_code": result.metadata.get("agent_exit_code"),
        "failure": result.metadata.get("failure"),
        "timing": dict(result.timing),
        "elapsed_s": elapsed_s,
    }
