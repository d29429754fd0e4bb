# SPDX-License-Identifier: Apache-2.0
"""The bridge to the CALL-CREDIT core (`nemo_polar.credit`): config, text classification, propagation.

The estimator needs three things from the core: its option model (`CallCreditConfig`), the role classifier
and graph builder for calls recovered by decoding (`classify_calls`, `build_edges` over `Call`/`Action`), and
the propagation Â_v (`propagation.propagate` over a `CallGraph`). This module adapts NeMo RL rows to those
APIs; it holds no CALL-CREDIT rule or formula of its own (the core ships in the same distribution).

Â_τ never comes from the core here: NeMo RL's own GRPO semantics apply (`baseline.py`).
Does not: import `nemo_rl`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from nemo_polar.credit.calls import Action, Call
from nemo_polar.credit.config import CallCreditConfig
from nemo_polar.credit.graph import CallGraph, CallNode, Edge, build_edges
from nemo_polar.credit.propagation import CreditAssignment, assign_one
from nemo_polar.credit.propagation import propagate as core_propagate
from nemo_polar.credit.roles import classify_calls

from .annotations import CallAnnotation, DecodedCall, bash_blocks, parse_tool_calls


def validate_core_options(block: dict[str, Any]) -> CallCreditConfig:
    """The core's `CallCreditConfig` for the core keys of a `call_credit:` block."""
    return CallCreditConfig.model_validate(block)


def _split_observation(observation: str, n: int) -> list[str | None]:
    # Qwen/Hermes templates wrap each tool result in <tool_response>…</tool_response>: one per tool call
    parts = [p.strip() for p in observation.split("<tool_response>")[1:]]
    parts = [p.split("</tool_response>")[0].strip() for p in parts]
    if len(parts) == n:
        return list(parts)
    return [observation] + [None] * (n - 1) if n else []


def classify_decoded(calls: Sequence[DecodedCall], config: Any, harness: str | None) -> list[CallAnnotation]:
    """Roles and parents for one row's decoded calls, by the core's rules."""
    core_calls = []
    for k, decoded in enumerate(calls):
        parsed: list[tuple[str | None, dict[str, Any]]] = list(parse_tool_calls(decoded.action))
        parsed = parsed or [(None, {"command": b}) for b in bash_blocks(decoded.action)]
        observations = _split_observation(decoded.observation, len(parsed))
        actions = [
            Action(tool=name, arguments=args, observation=obs)
            for (name, args), obs in zip(parsed, observations, strict=True)
        ]
        core_calls.append(
            Call(index=k, record_id=f"call{k}", seq=k, call_kind="main", text=decoded.action, actions=actions)
        )
    labels = classify_calls(core_calls, harness=harness, config=config.roles)
    edges = build_edges(core_calls, labels, config.graph)
    parents: list[set[int]] = [set() for _ in core_calls]
    for edge in edges:
        parents[edge.dst].add(edge.src)
    return [
        CallAnnotation(role=label.role, parents=tuple(sorted(p)), source="decode")
        for label, p in zip(labels, parents, strict=True)
    ]


def row_graph(annotations: Sequence[CallAnnotation], n_tokens: Sequence[int]) -> CallGraph:
    """The core's `CallGraph` of one row: a node per call (role, token count, test outcome), edges parent → call."""
    nodes = [
        CallNode(
            index=k,
            record_id=f"call{k}",
            seq=k,
            call_kind="main",
            role=ann.role,
            evidence=[f"from {ann.source}"],
            ambiguous=False,
            source=ann.source,
            n_tokens=int(n),
            paths_read=[],
            paths_written=[],
            test_targets=[],
            scoped=False,
            test_outcome=ann.test_outcome,
            summary="",
        )
        for k, (ann, n) in enumerate(zip(annotations, n_tokens, strict=True))
    ]
    edges = [
        Edge(src=p, dst=k, kinds=["annotation"]) for k, ann in enumerate(annotations) for p in sorted(set(ann.parents))
    ]
    return CallGraph(session_id="", harness=None, nodes=nodes, edges=edges)


def row_assignment(
    graph: CallGraph,
    adv_tau: float,
    reward: float,
    config: Any,
    *,
    omega: Mapping[str, float] | None = None,
    rv_reward: torch.Tensor | None = None,
) -> CreditAssignment:
    """The core's `CreditAssignment` of one row (propagation with the given ω and RV rewards)."""
    return assign_one(graph, float(adv_tau), float(reward), config.propagation, omega=omega, rv_reward=rv_reward)


def call_credit(
    adv_tau: float, annotations: Sequence[CallAnnotation], n_tokens: Sequence[int], config: Any
) -> list[float]:
    """Â_v per call of one row (the core's `propagate` on a graph built from the annotations)."""
    if not annotations:
        return []
    credit, _ = core_propagate(row_graph(annotations, n_tokens), adv_tau, config.propagation)
    return [float(c) for c in credit]
