# SPDX-License-Identifier: Apache-2.0
"""Plan steps turned into what the engine must produce (DESIGN §3 "Plan").

- `{"tool": name, "arguments": {...}}` → the exact text of that tool call in the served model's tool-call format
  (Hermes JSON: `<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`; Qwen3-Coder XML), forced through
  vLLM's `structured_outputs: {"choice": [TEXT]}` so the token ids recorded are the ones the model's grammar
  produced.
- `{"text": "..."}` → that text, forced the same way.
- `{"replay": record_id}` → a stored record's response, served without calling the model.
- `{"live": true}` → a normal generation.

Also: Hermes tool-call parsing for the prefix-preserving path, where the proxy generates from token ids itself.
This module does no I/O.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from nemo_polar.proxy.normalized import ChatResult, ToolCall
from nemo_polar.types import CompletionRecord

__all__ = ["forced_text", "parse_hermes", "result_from_record"]

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)


def forced_text(step: dict[str, Any], tool_call_format: str = "hermes") -> str | None:
    """The exact assistant text a `tool` or `text` step forces; `None` for other steps."""
    if "text" in step:
        return str(step["text"])
    if "tool" not in step:
        return None
    args = step.get("arguments", {})
    if tool_call_format == "hermes":
        return (
            "<tool_call>\n"
            + json.dumps({"name": step["tool"], "arguments": args}, ensure_ascii=False)
            + "\n</tool_call>"
        )
    if tool_call_format == "qwen3_coder":
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
            for k, v in args.items()
        )
        return f"<tool_call>\n<function={step['tool']}>\n{params}</function>\n</tool_call>"
    raise ValueError(f"unknown tool_call_format {tool_call_format!r}")


def parse_hermes(text: str) -> tuple[str, str | None, list[ToolCall]]:
    """Split a raw Hermes-format generation into (content, reasoning, tool calls)."""
    reasoning = None
    m = _THINK.match(text)
    if m:
        reasoning = m.group(1).strip("\n") or None
        text = text[m.end() :]
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    for m in _HERMES.finditer(text):
        try:
            obj = json.loads(m.group(1))
            name = obj["name"]
            args = obj.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            continue  # not a well-formed call: it stays in the content, as vLLM's parser would leave it
        kept.append(text[pos : m.start()])
        pos = m.end()
        calls.append(
            ToolCall(
                id=f"chatcmpl-tool-{uuid.uuid4().hex[:16]}",
                name=str(name),
                arguments=args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
            )
        )
    kept.append(text[pos:])
    content = "".join(kept) if calls else text
    return content.strip() if calls else content, reasoning, calls


def result_from_record(rec: CompletionRecord) -> ChatResult:
    """The response of a stored record, as a `ChatResult` (for `replay` steps)."""
    resp = rec.response or {}
    calls = [
        ToolCall(id=tc.get("id") or f"call_{i}", name=tc["function"]["name"], arguments=tc["function"]["arguments"])
        for i, tc in enumerate(resp.get("tool_calls") or [])
    ]
    return ChatResult(
        content=resp.get("content") or "",
        reasoning=resp.get("reasoning"),
        tool_calls=calls,
        finish_reason=rec.finish_reason or ("tool_calls" if calls else "stop"),
        prompt_tokens=len(rec.prompt_token_ids),
        completion_tokens=len(rec.generation_token_ids),
        generation_token_ids=list(rec.generation_token_ids),
        generation_log_probs=list(rec.generation_log_probs),
        served_model=rec.served_model or "",
    )
