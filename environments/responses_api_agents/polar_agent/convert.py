# SPDX-License-Identifier: Apache-2.0
"""A Polar `SessionResult` (+ its proxy records) → what a NeMo Gym rollout record carries (docs/nemo.md).

- `gym_response`: a Responses-API response whose `output` is the session's MAIN chain as output items (the last
  item of each trained call carries `prompt_token_ids` / `generation_token_ids` / `generation_log_probs`); one
  record is one contiguous token chain, so other chains never enter it.
- `polar_calls`: CALL-CREDIT annotations, one entry per generated segment of that delivered chain, in order
  (`call_index` session-wide, `parents` = causal edges).
- `polar_summary`: builder stats (`delivered_fraction`, splits, …) and every chain NOT delivered (kind, calls,
  trainable tokens), so nothing is lost silently.
- `delivery` / `delivery_metrics` / `undelivered_note`: how much of the session (calls, generated tokens, trainable
  tokens) reaches the trainer through this one record, per chain; the flat numbers become top-level result keys,
  which NeMo RL logs per agent and step (`<agent>/polar_delivered_tokens_fraction/mean`, ...), and the note is the
  warning a user sees when a chain kind is left out (docs/nemo.md).

Pure functions of data: no NeMo Gym import, no network.
"""

from __future__ import annotations

from typing import Any

from nemo_polar.trajectory import to_gym_output_items
from nemo_polar.trajectory.export import trained_calls
from nemo_polar.types import ChainKind, CompletionRecord, SessionResult, Trace

__all__ = [
    "delivered_trace",
    "delivery",
    "delivery_metrics",
    "gym_response",
    "polar_calls",
    "polar_summary",
    "undelivered_note",
]


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


def polar_summary(
    result: SessionResult, *, elapsed_s: float, records: list[CompletionRecord] | None = None
) -> dict[str, Any]:
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
        **({"delivery": delivery(result, records)} if records is not None else {}),
    }


def _chain_label(trace: Trace) -> str:
    """`side`, `subagent`, `post_compaction`, or `main (<split reason>)` for a main chain after the first."""
    if trace.chain_kind != ChainKind.MAIN.value:
        return trace.chain_kind
    return f"main ({trace.metadata.get('split_reason') or 'split'})"


def delivery(result: SessionResult, records: list[CompletionRecord]) -> dict[str, Any]:
    """What of the session reaches the trainer through its one Gym record, and what does not (docs/nemo.md).

    Counted over the session's successful model calls (`records` without `error`), sampled or forced alike (in a
    real session every call is the policy's): `calls`, `generated_tokens` (each call's completion tokens) and
    `trainable_tokens` (the builder's loss mask), in total and delivered. `chains`: one entry per trace (`chain`:
    `main`, `main (<split reason>)`, `side`, `subagent`, `post_compaction`) plus `dropped` for calls no trace
    holds (side calls under `side_calls: drop`), each with `delivered`, `calls`, `generated_tokens`,
    `trainable_tokens`. A call's generated tokens are its record's, or its span's length without the record.
    """
    ok = {r.id: r for r in records if r.error is None}
    sent = delivered_trace(result)
    seen: set[str] = set()
    chains: list[dict[str, Any]] = []
    for i, t in enumerate(result.trajectory.traces):
        calls = [(rid, e - s) for rid, s, e in t.call_spans if rid not in seen]
        seen.update(rid for rid, _ in calls)
        chains.append(
            {
                "trace_index": i,
                "chain": "main" if t is sent else _chain_label(t),
                "delivered": t is sent,
                "calls": len(calls),
                "generated_tokens": sum(len(ok[rid].generation_token_ids) if rid in ok else n for rid, n in calls),
                "trainable_tokens": sum(t.loss_mask),
            }
        )
    loose = [r for rid, r in ok.items() if rid not in seen]
    if loose:
        chains.append(
            {
                "trace_index": None,
                "chain": "dropped",
                "delivered": False,
                "calls": len(loose),
                "generated_tokens": sum(len(r.generation_token_ids) for r in loose),
                "trainable_tokens": 0,
            }
        )
    out: dict[str, Any] = {"chains": chains}
    for key in ("calls", "generated_tokens", "trainable_tokens"):
        out[key] = sum(c[key] for c in chains)
        out[f"delivered_{key}"] = sum(c[key] for c in chains if c["delivered"])
    return out


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 1.0


def delivery_metrics(d: dict[str, Any]) -> dict[str, float | int]:
    """Flat numbers for the top level of the Gym result: NeMo RL logs every top-level number of a result per agent
    (`<agent>/<key>/mean|min|max|...`, rollouts.py's per-agent metrics), so these show up in a GRPO run's logs.
    A fraction is 1.0 when there is nothing to count."""
    return {
        "polar_delivered_calls_fraction": _share(d["delivered_calls"], d["calls"]),
        "polar_delivered_tokens_fraction": _share(d["delivered_generated_tokens"], d["generated_tokens"]),
        "polar_delivered_trainable_fraction": _share(d["delivered_trainable_tokens"], d["trainable_tokens"]),
        "polar_undelivered_calls": d["calls"] - d["delivered_calls"],
        "polar_undelivered_tokens": d["generated_tokens"] - d["delivered_generated_tokens"],
    }


def undelivered_note(d: dict[str, Any], *, session_id: str) -> str | None:
    """One line saying what of a session the trainer does not get (None when everything is delivered)."""
    missed = [c for c in d["chains"] if not c["delivered"] and c["calls"]]
    if not missed:
        return None
    by: dict[str, list[int]] = {}
    for c in missed:
        acc = by.setdefault(c["chain"], [0, 0, 0])
        acc[0] += c["calls"]
        acc[1] += c["generated_tokens"]
        acc[2] += c["trainable_tokens"]
    parts = ", ".join(f"{k}: {n} calls, {g} generated / {t} trainable tokens" for k, (n, g, t) in sorted(by.items()))
    tok = _share(d["delivered_generated_tokens"], d["generated_tokens"])
    return (
        f"session {session_id}: the trainer gets {d['delivered_calls']} of {d['calls']} calls "
        f"({100 * tok:.1f} % of generated tokens); not delivered: {parts}. NeMo RL's Gym path takes one contiguous "
        "chain per row (docs/nemo.md); per step, see <agent>/polar_delivered_tokens_fraction and "
        "<agent>/polar_undelivered_tokens in NeMo RL's rollout metrics"
    )
