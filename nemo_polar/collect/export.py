# SPDX-License-Identifier: Apache-2.0
"""`polar export sft`: a run directory's sessions as OpenAI-style chat conversations (the paper's released format).

A session's conversation is the normalised request of its last successful main-agent call (`request.messages`,
OpenAI Chat form) followed by that call's reply as an assistant message; every message keeps only the OpenAI
Chat fields `role`, `content`, `tool_calls`, `tool_call_id` (and `name` where the schema has it), with text
content parts joined into one string. With `all_chains` each trace of the trajectory (main, subagent, side,
post-compaction chain) yields its own conversation, ending at the trace's last call. The token-level option adds
the trace's `prompt_ids`, `response_ids` and `loss_mask` (the exact tokens, with what trains).

SFT data is accepted trajectories (rejection sampling): by default only sessions whose reward reaches the
acceptance threshold (`is_accepted`: evaluated, not masked, reward >= threshold, default 1.0) are exported;
`accepted_only=False` (`polar export sft --all`) includes the rest, each line's metadata saying whether it was
accepted.

This module reads data and writes JSONL; it runs nothing and never calls a model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from nemo_polar.collect.accept import is_accepted
from nemo_polar.rundir import read_results, records_by_session
from nemo_polar.types import CallKind, CompletionRecord, SessionResult, Trace

__all__ = ["ExportStats", "conversation", "export_sft", "sft_lines", "to_openai_message"]

_ROLES = ("system", "developer", "user", "assistant", "tool")


def _text(content: Any) -> str | None:
    """Content as one string: text parts joined; non-text parts (images) rendered as a short placeholder."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, Mapping):
                if isinstance(p.get("text"), str):
                    parts.append(p["text"])
                else:
                    parts.append(f"[{p.get('type', 'part')}]")
        return "".join(parts)
    return json.dumps(content, ensure_ascii=False)


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(calls or []):
        if not isinstance(c, Mapping):
            continue
        f = c.get("function")
        fn: Mapping[str, Any] = f if isinstance(f, Mapping) else c
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        out.append(
            {
                "id": str(c.get("id") or f"call_{i}"),
                "type": "function",
                "function": {"name": str(fn.get("name", "")), "arguments": args},
            }
        )
    return out


def to_openai_message(msg: Mapping[str, Any]) -> dict[str, Any] | None:
    """One normalised message in the OpenAI Chat message schema; `None` for a role the schema does not know."""
    role = msg.get("role")
    if role not in _ROLES:
        return None
    content = _text(msg.get("content"))
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": content or None}
        calls = _tool_calls(msg.get("tool_calls"))
        if calls:
            out["tool_calls"] = calls
        elif out["content"] is None:
            out["content"] = ""
        return out
    if role == "tool":
        return {"role": "tool", "tool_call_id": str(msg.get("tool_call_id") or ""), "content": content or ""}
    out = {"role": role, "content": content or ""}
    if isinstance(msg.get("name"), str) and msg["name"]:
        out["name"] = msg["name"]
    return out


def conversation(record: CompletionRecord) -> list[dict[str, Any]]:
    """The conversation a call completed: its normalised request messages, then its reply."""
    req = record.request if isinstance(record.request, Mapping) else {}
    msgs = [m for m in (to_openai_message(x) for x in req.get("messages") or [] if isinstance(x, Mapping)) if m]
    resp = record.response if isinstance(record.response, Mapping) else {}
    reply = to_openai_message({"role": "assistant", **resp})
    if reply is not None:
        msgs.append(reply)
    return msgs


def _last_main(records: Sequence[CompletionRecord]) -> CompletionRecord | None:
    ok = [r for r in records if r.ok and r.call_kind == CallKind.MAIN.value]
    return max(ok, key=lambda r: r.seq) if ok else None


def _trace_of(traces: Iterable[Trace], record_id: str) -> Trace | None:
    return next((t for t in traces if any(rid == record_id for rid, _, _ in t.call_spans)), None)


def _tools(record: CompletionRecord) -> list[Any]:
    req = record.request if isinstance(record.request, Mapping) else {}
    tools = req.get("tools")
    return list(tools) if isinstance(tools, list) else []


def _line(
    s: SessionResult, rec: CompletionRecord, trace: Trace | None, chain: str, tokens: bool, accepted: bool | None
) -> dict[str, Any]:
    line: dict[str, Any] = {
        "messages": conversation(rec),
        "tools": _tools(rec),
        "metadata": {
            "session_id": s.session_id,
            "task_id": s.task_id,
            "sample_index": s.sample_index,
            "harness": s.harness,
            "reward": s.reward,
            "status": s.status,
            "accepted": accepted,
            "chain_kind": chain,
            "record_id": rec.id,
            "repo": s.metadata.get("repo"),
            "instance_id": s.metadata.get("instance_id"),
        },
    }
    if tokens:
        line["tokens"] = (
            None
            if trace is None
            else {
                "prompt_ids": list(trace.prompt_ids),
                "response_ids": list(trace.response_ids),
                "loss_mask": list(trace.loss_mask),
                "response_logprobs": list(trace.response_logprobs),
                "chain_kind": trace.chain_kind,
            }
        )
    return line


def sft_lines(
    session: SessionResult,
    records: Sequence[CompletionRecord],
    *,
    all_chains: bool = False,
    tokens: bool = False,
    accepted: bool | None = None,
) -> list[dict[str, Any]]:
    """The SFT lines of one session (its main conversation, or one per trace with `all_chains`); `accepted` is
    written into each line's metadata (None: not judged)."""
    by_id = {r.id: r for r in records}
    traces = session.trajectory.traces
    if not all_chains:
        rec = _last_main(records)
        if rec is None:
            return []
        trace = _trace_of(traces, rec.id)
        return [_line(session, rec, trace, trace.chain_kind if trace else rec.call_kind, tokens, accepted)]
    out = []
    for t in traces:
        recs = [by_id[rid] for rid, _, _ in t.call_spans if rid in by_id and by_id[rid].ok]
        if recs:
            last = max(recs, key=lambda r: r.seq)
            out.append(_line(session, last, t, t.chain_kind, tokens, accepted))
    return out


@dataclass(frozen=True, slots=True)
class ExportStats:
    sessions: int
    lines: int
    skipped: int  # sessions that gave no line: rejected (left out) or without a successful main call
    out: Path
    accepted: int = 0  # sessions at or above the threshold
    rejected: int = 0  # sessions below it (left out unless `accepted_only=False`)
    accept_threshold: float = 1.0
    accepted_only: bool = True

    def describe(self) -> str:
        """One line for the user: what was written, and what the acceptance rule left out."""
        rule = f"accepted = evaluated with reward >= {self.accept_threshold:g}"
        if self.accepted_only:
            left = f"{self.rejected} rejected session(s) left out (--all includes them)"
        else:
            left = f"{self.rejected} rejected session(s) included (--all)"
        empty = self.skipped - (self.rejected if self.accepted_only else 0)
        tail = f", {empty} without a successful main call" if empty else ""
        return (
            f"{self.lines} conversation(s) from {self.sessions} session(s): {self.accepted} accepted ({rule}), "
            f"{left}{tail} → {self.out}"
        )


def export_sft(
    run_dir: str | Path,
    out: str | Path,
    *,
    accepted_only: bool = True,
    accept_threshold: float = 1.0,
    all_chains: bool = False,
    tokens: bool = False,
) -> ExportStats:
    """Write `out` (JSONL, one conversation per line) from `run_dir`'s trajectories and records: the accepted
    sessions (reward >= `accept_threshold`), or every session with `accepted_only=False`."""
    rd = Path(run_dir)
    results = read_results(rd)
    records = records_by_session(rd)
    n_lines = skipped = n_accepted = 0
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "wb") as f:
        for s in results:
            accepted = is_accepted(s, accept_threshold)
            n_accepted += accepted
            if accepted_only and not accepted:
                skipped += 1
                continue
            lines = sft_lines(
                s, records.get(s.session_id, []), all_chains=all_chains, tokens=tokens, accepted=accepted
            )
            if not lines:
                skipped += 1
            for line in lines:
                f.write(orjson.dumps(line) + b"\n")
                n_lines += 1
    return ExportStats(
        sessions=len(results),
        lines=n_lines,
        skipped=skipped,
        out=out_path,
        accepted=n_accepted,
        rejected=len(results) - n_accepted,
        accept_threshold=accept_threshold,
        accepted_only=accepted_only,
    )
