# SPDX-License-Identifier: Apache-2.0
"""Exports of built traces: NeMo Gym output items, a NeMo RL `message_log`, plain JSONL.

NeMo Gym (docs/nemo.md): one rollout record is one contiguous token chain; the LAST output item of each model call
carries `prompt_token_ids` (everything before the call in the chain), `generation_token_ids` and
`generation_log_probs`. NeMo RL: a `message_log` alternates `user` messages (prompt delta: the first prompt,
tool outputs, template glue) and `assistant` messages (one trained call), each with `token_ids`,
`token_loss_mask` and `generation_logprobs`, `content == ""`. Calls a policy masked are not presented as
generations (NeMo RL would train every assistant message): their tokens travel inside the next prompt delta,
which is exactly where the next call saw them. This module builds nothing and imports no trainer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from nemo_polar.types import CompletionRecord, Trace, Trajectory

__all__ = ["to_gym_output_items", "to_gym_records", "to_message_log", "traces_to_jsonl", "trained_calls"]


def trained_calls(trace: Trace) -> list[tuple[str, int, int]]:
    """The call spans that carry at least one trainable token, in order."""
    mask = trace.loss_mask
    return [(rid, s, e) for rid, s, e in trace.call_spans if e > s and any(mask[s:e])]


def _tool_outputs(rec: CompletionRecord) -> list[dict[str, Any]]:
    """Function-call outputs the harness sent since the last assistant message of this request."""
    msgs = rec.request.get("messages") if isinstance(rec.request, dict) else None
    if not isinstance(msgs, list):
        return []
    tail: list[dict[str, Any]] = []
    for m in reversed(msgs):
        if not isinstance(m, dict) or m.get("role") != "tool":
            break
        content = m.get("content")
        if not isinstance(content, str):
            content = orjson.dumps(content).decode()
        tail.append({"type": "function_call_output", "call_id": str(m.get("tool_call_id", "")), "output": content})
    tail.reverse()
    return tail


def _call_items(rec: CompletionRecord | None, rid: str) -> list[dict[str, Any]]:
    resp: Mapping[str, Any] = rec.response if rec is not None and isinstance(rec.response, dict) else {}
    items: list[dict[str, Any]] = []
    if resp.get("reasoning"):
        items.append(
            {"type": "reasoning", "id": f"rs_{rid}", "summary": [{"type": "summary_text", "text": resp["reasoning"]}]}
        )
    if resp.get("content") or not resp.get("tool_calls"):
        items.append(
            {
                "type": "message",
                "id": f"msg_{rid}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": resp.get("content") or "", "annotations": []}],
            }
        )
    for k, tc in enumerate(resp.get("tool_calls") or []):
        fn = tc.get("function", {}) if isinstance(tc, dict) else {}
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{rid}_{k}",
                "call_id": str(tc.get("id", "")) if isinstance(tc, dict) else "",
                "name": fn.get("name", ""),
                "arguments": fn.get("arguments", ""),
                "status": "completed",
            }
        )
    return items


def to_gym_output_items(trace: Trace, records: Mapping[str, CompletionRecord] | None = None) -> list[dict[str, Any]]:
    """`response.output` items for one trace (one contiguous chain).

    With `records`, items mirror each call's response (reasoning, message, function calls) and the tool outputs
    sent before it; without, each call is one empty assistant message. Token fields sit on each call's last item.
    """
    out: list[dict[str, Any]] = []
    ids = trace.prompt_ids + trace.response_ids
    base = len(trace.prompt_ids)
    for n, (rid, s, e) in enumerate(trained_calls(trace)):
        rec = records.get(rid) if records is not None else None
        if n and rec is not None:
            out.extend(_tool_outputs(rec))
        items = _call_items(rec, rid)
        items[-1].update(
            prompt_token_ids=ids[: base + s],
            generation_token_ids=trace.response_ids[s:e],
            generation_log_probs=trace.response_logprobs[s:e],
        )
        out.extend(items)
    return out


def to_gym_records(
    trajectory: Trajectory, records: Iterable[CompletionRecord] | None = None, *, main_only: bool = False
) -> list[dict[str, Any]]:
    """One NeMo Gym-shaped rollout dict per trace (main chain first): `response.output`, `reward`, metadata."""
    by_id = {r.id: r for r in records} if records is not None else None
    rows: list[dict[str, Any]] = []
    for i, t in enumerate(trajectory.traces):
        if main_only and i:
            break
        rows.append(
            {
                "response": {"output": to_gym_output_items(t, by_id)},
                "reward": 0.0 if t.reward is None else float(t.reward),
                "chain_kind": t.chain_kind,
                "trace_index": i,
            }
        )
    return rows


def to_message_log(trace: Trace, *, as_tensors: bool = False) -> list[dict[str, Any]]:
    """NeMo RL `message_log` rows for one trace: alternating user prompt deltas and assistant calls.

    Flat position of a message is the running sum of earlier `token_ids` lengths, and the concatenation of all
    `token_ids` is `prompt_ids + response_ids` up to the last trained call. `as_tensors=True` returns torch tensors
    (imported lazily), as NeMo RL holds them.
    """
    msgs: list[dict[str, Any]] = []
    ids = trace.prompt_ids + trace.response_ids
    base = len(trace.prompt_ids)
    pos = 0
    for _rid, s, e in trained_calls(trace):
        delta = ids[pos : base + s]
        msgs.append(
            {
                "role": "user",
                "content": "",
                "token_ids": delta,
                "token_loss_mask": [0] * len(delta),
                "generation_logprobs": [0.0] * len(delta),
            }
        )
        msgs.append(
            {
                "role": "assistant",
                "content": "",
                "token_ids": trace.response_ids[s:e],
                "token_loss_mask": trace.loss_mask[s:e],
                "generation_logprobs": trace.response_logprobs[s:e],
            }
        )
        pos = base + e
    if as_tensors:
        import torch

        for m in msgs:
            m["token_ids"] = torch.tensor(m["token_ids"], dtype=torch.long)
            m["token_loss_mask"] = torch.tensor(m["token_loss_mask"], dtype=torch.long)
            m["generation_logprobs"] = torch.tensor(m["generation_logprobs"], dtype=torch.float32)
    return msgs


def traces_to_jsonl(trajectory: Trajectory, *, compact: bool = False) -> bytes:
    """Plain JSONL, one trace per line (token arrays as plain lists unless `compact`)."""
    return b"".join(t.to_json(compact=compact) + b"\n" for t in trajectory.traces)
