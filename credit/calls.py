# SPDX-License-Identifier: Apache-2.0
"""Calls as CALL-CREDIT sees them: a recorded model call's action(s) and the observation that followed.

`extract_calls(records)` orders a session's `CompletionRecord`s by `seq` and turns each into a `Call`: its
actions (the structured tool calls of `response.tool_calls`, or, for harnesses without tools such as
mini-swe-agent, the ```bash block of the reply text) and, for each action, the tool result that the
harness sent back — found in a later record's normalised `request.messages` (`tool` messages by
`tool_call_id`, else positionally after the last assistant message of the next request).

It does not classify roles or build edges (`roles.py`, `graph.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_polar.types import CompletionRecord

__all__ = ["SHELL_ARG_KEYS", "Action", "Call", "extract_calls", "message_text", "shell_command_of"]

SHELL_ARG_KEYS = ("command", "cmd", "script", "commandLine", "shell_command")
_BASH_BLOCK = re.compile(r"```(?:bash|sh|shell|console|zsh)?[ \t]*\n(.*?)```", re.S)


@dataclass(slots=True)
class Action:
    """One tool call (or one shell block of a tool-less reply)."""

    tool: str | None
    arguments: dict[str, Any]
    call_id: str | None = None
    observation: str | None = None


@dataclass(slots=True)
class Call:
    """One model call of a session, in `seq` order (`index` is its 0-based position)."""

    index: int
    record_id: str
    seq: int
    call_kind: str
    text: str
    actions: list[Action] = field(default_factory=list)
    n_tokens: int = 0
    ok: bool = True

    @property
    def observation(self) -> str:
        return "\n".join(a.observation for a in self.actions if a.observation)

    def action_text(self) -> str:
        """Everything the action says (tool arguments as JSON, shell blocks), for reference matching."""
        parts = []
        for a in self.actions:
            if a.tool is not None:
                parts.append(a.tool)
            parts.append(_flatten_args(a.arguments))
        return "\n".join(parts)


def _flatten_args(args: Mapping[str, Any]) -> str:
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, Mapping):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif v is not None:
            out.append(str(v))

    walk(args)
    return "\n".join(out)


def message_text(content: Any) -> str:
    """The text of an OpenAI message content (a string or a part array)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, Mapping):
                t = p.get("text") if isinstance(p.get("text"), str) else p.get("content")
                parts.append(message_text(t) if t is not None else "")
        return "\n".join(x for x in parts if x)
    if isinstance(content, Mapping):
        return message_text(content.get("text") or content.get("content"))
    return str(content)


def shell_command_of(arguments: Mapping[str, Any]) -> str | None:
    """The shell command carried by a shell tool's arguments (`command` may be a string or an argv list)."""
    for key in SHELL_ARG_KEYS:
        v = arguments.get(key)
        if isinstance(v, str):
            return v
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            if len(v) >= 3 and v[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh") and v[1].startswith("-"):
                return v[2]
            return " ".join(_quote(x) for x in v)
    return None


def _quote(s: str) -> str:
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\"'\"'") + "'"


def _parse_arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str):
        try:
            v = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return {"_raw": raw}
        return v if isinstance(v, dict) else {"_value": v}
    return {}


def _actions_of(response: Mapping[str, Any], text_shell_blocks: bool) -> list[Action]:
    out = []
    raw_calls = response.get("tool_calls")
    for tc in raw_calls if isinstance(raw_calls, list) else []:
        if not isinstance(tc, Mapping):
            continue
        fn = tc.get("function") if isinstance(tc.get("function"), Mapping) else tc
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if name is not None and not isinstance(name, str):
            name = str(name)
        args = _parse_arguments(fn.get("arguments") if isinstance(fn, Mapping) else None)
        out.append(Action(tool=str(name) if name else "", arguments=args, call_id=tc.get("id")))
    if not out and text_shell_blocks:
        content = message_text(response.get("content"))
        for m in _BASH_BLOCK.finditer(content):
            out.append(Action(tool=None, arguments={"command": m.group(1).strip()}))
    return out


def _tail_after_last_assistant(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], Mapping) and messages[i].get("role") == "assistant":
            return list(messages[i + 1 :])
    return []


def extract_calls(records: Iterable[CompletionRecord], *, text_shell_blocks: bool = True) -> list[Call]:
    """Turn one session's records into `Call`s in `seq` order, with observations attached."""
    recs = sorted(records, key=lambda r: (r.seq, r.arrived_at))
    calls: list[Call] = []
    for i, r in enumerate(recs):
        resp = r.response if isinstance(r.response, Mapping) else {}
        calls.append(
            Call(
                index=i,
                record_id=r.id,
                seq=r.seq,
                call_kind=r.call_kind,
                text=message_text(resp.get("content")),
                actions=_actions_of(resp, text_shell_blocks),
                n_tokens=len(r.generation_token_ids),
                ok=r.error is None,
            )
        )
    _attach_observations(recs, calls)
    return calls


def _attach_observations(recs: list[CompletionRecord], calls: list[Call]) -> None:
    by_id: dict[str, Action] = {}
    for c in calls:
        for a in c.actions:
            if a.call_id:
                by_id[a.call_id] = a
    # next record of the same call_kind, for positional matching
    next_of: dict[int, int] = {}
    last_of_kind: dict[str, int] = {}
    for i in range(len(recs) - 1, -1, -1):
        k = recs[i].call_kind
        if k in last_of_kind:
            next_of[i] = last_of_kind[k]
        last_of_kind[k] = i
    seen_ids: set[str] = set()
    for i, c in enumerate(calls):
        if not c.actions or i not in next_of:
            continue
        msgs = recs[next_of[i]].request.get("messages") if isinstance(recs[next_of[i]].request, Mapping) else None
        if not isinstance(msgs, list):
            continue
        tail = [m for m in _tail_after_last_assistant(msgs) if isinstance(m, Mapping)]
        positional = [m for m in tail if m.get("role") in ("tool", "user", "function")]
        unmatched = [a for a in c.actions if a.observation is None]
        for m in positional:
            tid = m.get("tool_call_id")
            if isinstance(tid, str) and tid in by_id and tid not in seen_ids:
                by_id[tid].observation = message_text(m.get("content"))
                seen_ids.add(tid)
        unmatched = [a for a in c.actions if a.observation is None]
        leftovers = [
            m for m in positional if not (isinstance(m.get("tool_call_id"), str) and m["tool_call_id"] in seen_ids)
        ]
        for a, m in zip(unmatched, leftovers, strict=False):
            a.observation = message_text(m.get("content"))
    # ids never found in the next request (parallel chains, compaction): search every request once
    missing = {cid for cid, a in by_id.items() if a.observation is None}
    if missing:
        for r in recs:
            msgs = r.request.get("messages") if isinstance(r.request, Mapping) else None
            for m in msgs or []:
                if isinstance(m, Mapping) and m.get("role") == "tool" and m.get("tool_call_id") in missing:
                    by_id[m["tool_call_id"]].observation = message_text(m.get("content"))
                    missing.discard(m["tool_call_id"])
            if not missing:
                break
