# SPDX-License-Identifier: Apache-2.0
"""Plan steps turned into what the engine must produce (docs/contracts.md, "Plans").

- `{"tool": name, "arguments": {...}}` → the exact text of that tool call in the served model's tool-call format
  (Hermes JSON: `<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`; Qwen3-Coder XML), forced through
  vLLM's `structured_outputs: {"choice": [TEXT]}` so the token ids recorded are the ones the model's grammar
  produced.
- `{"text": "..."}` → that text, forced the same way.
- `{"replay": record_id}` → a stored record's response, served without calling the model. The step may carry the
  record inline (`"record": {response, finish_reason, generation_token_ids, generation_log_probs, served_model,
  request: {sampling}}`), so a session replays a run recorded by another proxy (counterfactual replay).
- `{"live": true}` → a normal generation.
- `{"next_best": {"seed": s, "n": 4, "temperature": 1.0, "exclude_record": id, "exclude_response": {...},
  "chat_template_kwargs": {...}}}` → `n` samples from the same context (seeds s, s+1, …; the prompt rendered with
  the excluded call's template kwargs, from the step or its stored record), and the best one (highest total
  log-probability) whose action differs from the excluded record's (`action_key`: tool names and parsed
  arguments, else the text).

Also: Hermes tool-call parsing for the prefix-preserving path, where the proxy generates from token ids itself.
This module does no I/O.
"""

from __future__ import annotations

import json
import math
import random
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_polar.proxy.normalized import ChatResult, ToolCall
from nemo_polar.types import CompletionRecord, check_think

__all__ = [
    "NextBest",
    "action_key",
    "forced_text",
    "next_best_options",
    "parse_hermes",
    "pick_next_best",
    "record_from_inline",
    "result_from_record",
    "sample_option",
    "thinks",
]

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)


def forced_text(step: dict[str, Any], tool_call_format: str = "hermes") -> str | None:
    """The exact assistant text a `tool` or `text` step forces; `None` for other steps.

    A step's optional `think` text is forced too, as the reasoning block a thinking model writes before its answer
    (`<think>\n…\n</think>\n\n`, the spelling Qwen3's template renders back into history).
    """
    body = _forced_body(step, tool_call_format)
    if body is None or step.get("think") is None:
        return body
    check_think(step["think"])
    return f"<think>\n{step['think'].strip(chr(10))}\n</think>\n\n{body}"


def thinks(step: dict[str, Any]) -> bool:
    """Whether a forced step carries a reasoning block (it is generated with thinking on): its `think` field, not
    its text (a `text` step may itself start with `<think>` and is then forced as written, thinking off)."""
    return step.get("think") is not None


def _forced_body(step: dict[str, Any], tool_call_format: str) -> str | None:
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


def record_from_inline(record_id: str, data: Mapping[str, Any]) -> CompletionRecord:
    """A `replay` step's inline record (see the module docstring) as a `CompletionRecord`."""
    resp = data.get("response")
    gen = data.get("generation_token_ids", [])
    lps = data.get("generation_log_probs", [])
    if not isinstance(resp, Mapping) or not isinstance(gen, list) or not isinstance(lps, list) or len(gen) != len(lps):
        raise ValueError("an inline replay record needs response, and generation_token_ids/_log_probs of one length")
    return CompletionRecord(
        id=record_id,
        session_id=str(data.get("session_id") or "inline"),
        seq=int(data.get("seq") or 0),
        dialect=str(data.get("dialect") or "openai_chat"),
        request=dict(data.get("request") or {}),
        response=dict(resp),
        finish_reason=data.get("finish_reason"),
        generation_token_ids=[int(t) for t in gen],
        generation_log_probs=[float(x) for x in lps],
        served_model=data.get("served_model"),
    )


@dataclass(frozen=True, slots=True)
class NextBest:
    """A validated `next_best` step."""

    seed: int = 0
    n: int = 4
    temperature: float = 1.0
    exclude_record: str | None = None
    exclude_response: Mapping[str, Any] | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None


def next_best_options(step: Mapping[str, Any]) -> NextBest:
    """The options of a `{"next_best": {...}}` step; `ValueError` names what is wrong."""
    spec = step.get("next_best")
    if not isinstance(spec, Mapping):
        raise ValueError("next_best must be an object")
    unknown = set(spec) - {"seed", "n", "temperature", "exclude_record", "exclude_response", "chat_template_kwargs"}
    if unknown:
        raise ValueError(f"next_best: unknown field(s) {sorted(unknown)}")
    seed, n, temp = spec.get("seed", 0), spec.get("n", 4), spec.get("temperature", 1.0)
    if type(seed) is not int or type(n) is not int or n < 2 or n > 64:
        raise ValueError("next_best: seed must be an int and n an int in 2..64")
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp <= 0:
        raise ValueError("next_best: temperature must be a number > 0 (seeded sampling, not greedy)")
    excl, resp = spec.get("exclude_record"), spec.get("exclude_response")
    if excl is not None and not isinstance(excl, str):
        raise ValueError("next_best.exclude_record must be a record id")
    if resp is not None and not isinstance(resp, Mapping):
        raise ValueError("next_best.exclude_response must be a record's response object")
    ctk = spec.get("chat_template_kwargs")
    if ctk is not None and not isinstance(ctk, Mapping):
        raise ValueError("next_best.chat_template_kwargs must be an object")
    return NextBest(seed, n, float(temp), excl, resp, ctk)


def action_key(response: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two responses the same action: their tool calls (name, parsed arguments) in order; for a reply
    without tool calls, its stripped text. Call ids, reasoning and whitespace around a call do not count."""
    calls = []
    for tc in response.get("tool_calls") or ():
        fn = tc.get("function") or {}
        args = fn.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            parsed = args
        calls.append((fn.get("name"), json.dumps(parsed, sort_keys=True, ensure_ascii=False)))
    if calls:
        return ("tools", tuple(calls))
    return ("text", str(response.get("content") or "").strip())


def pick_next_best(candidates: Sequence[ChatResult], exclude: Mapping[str, Any] | None) -> tuple[int, list[bool]]:
    """Index of the best candidate (highest total log-probability; ties: the lower index) among those whose action
    differs from `exclude`, and which candidates were identical to it. When every candidate is identical the best
    of all is returned; the caller marks the record (the counterfactual runner then skips it)."""
    if not candidates:
        raise ValueError("no candidates")
    ex = action_key(exclude) if exclude is not None else None
    same = [ex is not None and action_key(c.response_dict()) == ex for c in candidates]
    pool = [i for i in range(len(candidates)) if not same[i]] or list(range(len(candidates)))
    best = max(pool, key=lambda i: (sum(candidates[i].generation_log_probs), -i))
    return best, same


def sample_option(log_probs: Sequence[float], temperature: float | None, seed: int | None) -> int:
    """An option index drawn with probability proportional to exp(log_prob / temperature) (temperature None: 1;
    0: the most likely, ties to the lower index); a given `seed` draws the same index every time."""
    if not log_probs:
        raise ValueError("no options")
    t = 1.0 if temperature is None else float(temperature)
    if t <= 0:
        return max(range(len(log_probs)), key=lambda i: (log_probs[i], -i))
    top = max(log_probs)
    weights = [math.exp((lp - top) / t) for lp in log_probs]
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    return rng.choices(range(len(log_probs)), weights=weights)[0]
