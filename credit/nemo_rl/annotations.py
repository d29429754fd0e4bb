# SPDX-License-Identifier: Apache-2.0
"""Per-call CALL-CREDIT annotations (role + causal parents) for the calls of a NeMo RL row.

Two routes (docs/nemo.md, "Carrying the per-call annotations"):
- the `polar_calls` batch column (one list per row, one entry per generated segment of the delivered chain,
  in order: `{call_index, record_id, role, evidence, parents, chain_kind}`), copied there by the optional patch;
- decoding: each call's generated tokens and the observation tokens after it are decoded with the policy
  tokenizer and classified; the text classifier is the CALL-CREDIT core's when it provides one
  (`classify_decoded_calls`), else the small rule set below.

Does: validate the column, run the text route. Does not: compute credit (see `estimator.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_polar.credit.config import ROLES

from nemo_polar.errors import PolarError


class AnnotationError(PolarError, ValueError):
    """A `polar_calls` entry disagrees with the row it is attached to."""


@dataclass(frozen=True)
class CallAnnotation:
    """Role of one call and the earlier calls it depends on (edges parent → this call)."""

    role: str
    parents: tuple[int, ...] = ()
    source: str = "decode"
    test_outcome: str | None = None  # RV calls: "passed" / "failed" when known (drives the RV self-correction reward)


@dataclass(frozen=True)
class DecodedCall:
    """One call as text: what the model generated and what the environment answered before the next call."""

    action: str
    observation: str


Classifier = Callable[[Sequence[DecodedCall]], list[CallAnnotation]]


def from_polar_calls(entries: Sequence[Mapping[str, Any]], n_calls: int, row: int) -> list[CallAnnotation]:
    """Annotations from one row's `polar_calls` list (one entry per generated segment, in order).

    `call_index` may number the calls of the whole session (side calls and other chains included), so entries are
    matched to segments by position, `call_index` must increase, and `parents` are mapped from call indices to
    segment positions; a parent outside the delivered chain has no segment here and is dropped.

    Raises:
        AnnotationError: count, order, role or parent indices do not fit the row's `n_calls` generated segments.
    """
    if len(entries) != n_calls:
        raise AnnotationError(f"row {row}: polar_calls has {len(entries)} entries for {n_calls} generated segments")
    position: dict[int, int] = {}
    out: list[CallAnnotation] = []
    last = -1
    for k, entry in enumerate(entries):
        index = int(entry.get("call_index", k))
        if index <= last:
            raise AnnotationError(f"row {row}: polar_calls[{k}].call_index {index} does not increase")
        last = index
        role = str(entry.get("role", "OTHER")).upper()
        if role not in ROLES:
            raise AnnotationError(f"row {row}: polar_calls[{k}].role {role!r} is not one of {ROLES}")
        parents = [int(p) for p in entry.get("parents") or ()]
        if any(p >= index for p in parents):
            raise AnnotationError(f"row {row}: polar_calls[{k}].parents {parents} must be earlier call indices")
        mapped = tuple(sorted({position[p] for p in parents if p in position}))
        position[index] = k
        outcome = entry.get("test_outcome")
        out.append(
            CallAnnotation(
                role=role, parents=mapped, source="polar_calls", test_outcome=None if outcome is None else str(outcome)
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------------------
# the text route: tool calls recovered from decoded generations (roles come from the core's rules)

_HERMES = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
_XML_FUNCTION = re.compile(r"<function=([\w.-]+)>(.*?)</function>", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([\w.-]+)>\s*(.*?)\s*</parameter>", re.DOTALL)


def parse_tool_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """Tool calls in a decoded generation: Hermes JSON or Qwen3-Coder XML inside `<tool_call>` blocks."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for block in _HERMES.findall(text):
        try:
            obj = json.loads(block)
        except json.JSONDecodeError:
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = {"raw": args}
        calls.append((str(obj.get("name", "")), args if isinstance(args, dict) else {"raw": args}))
    for name, body in _XML_FUNCTION.findall(text):
        calls.append((name, dict(_XML_PARAM.findall(body))))
    return calls


_BASH_BLOCK = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```", re.DOTALL)


def bash_blocks(text: str) -> list[str]:
    """Shell commands in ```bash blocks of a reply without tool calls (mini-swe-agent style)."""
    return [m.strip() for m in _BASH_BLOCK.findall(text)]
