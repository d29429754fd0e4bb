# SPDX-License-Identifier: Apache-2.0
"""Causal-aware curation (the proposal's §3.2): DPO pairs, IG damping weights, the RV self-correction reward.

- `dpo_pairs`: for calibrated AE calls with Δ_k > θ_AE, the pair (original call, counterfactual call, Δ_k) with
  the prompt the model saw; `write_dpo_jsonl` writes one JSON object per line.
- `sampling_weights`: IG calls whose causal effect is below θ_IG (their measured Δ when there is one, else the
  credit share Â_v/Â_τ) get weight `ig_damping`, every other call 1.
- `rv_rewards`: re-exported from `propagation`.

Counterfactual results are input data here (`counterfactual.Measurement`); this module runs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from nemo_polar.types import CompletionRecord

from .config import CurationConfig
from .counterfactual import Measurement
from .graph import CallGraph
from .propagation import CreditAssignment, rv_rewards

__all__ = ["dpo_pairs", "rv_rewards", "sampling_weights", "write_dpo_jsonl"]


def sampling_weights(
    graph: CallGraph,
    assignment: CreditAssignment,
    config: CurationConfig | None = None,
    *,
    deltas: Mapping[int, float] | None = None,
) -> torch.Tensor:
    """[n] sampling weights: damped (`ig_damping`) for low-effect IG calls, 1 otherwise."""
    cfg = config or CurationConfig()
    w = torch.ones(len(graph.nodes), dtype=torch.float64)
    measured = dict(assignment.calibrated)
    if deltas:
        measured.update(deltas)
    for k, node in enumerate(graph.nodes):
        if node.role != "IG":
            continue
        effect = measured[k] if k in measured else float(assignment.factor[k])
        if effect < cfg.theta_ig:
            w[k] = cfg.ig_damping
    return w


def _response_of(rec: CompletionRecord) -> dict[str, Any]:
    resp = rec.response if isinstance(rec.response, Mapping) else {}
    return {"content": resp.get("content"), "tool_calls": resp.get("tool_calls") or []}


def dpo_pairs(
    measurements: Iterable[Measurement],
    records: Mapping[str, CompletionRecord] | Sequence[CompletionRecord],
    config: CurationConfig | None = None,
) -> list[dict[str, Any]]:
    """DPO rows `{prompt, chosen, rejected, delta, …}` for measured AE calls with Δ > θ_AE (and, with
    `swap_negative`, reversed rows for Δ < −θ_AE). Measurements without a counterfactual action are skipped."""
    cfg = config or CurationConfig()
    by_id = dict(records) if isinstance(records, Mapping) else {r.id: r for r in records}
    rows = []
    for m in measurements:
        if m.role != "AE" or m.outcome.action is None or m.record_id not in by_id:
            continue
        rec = by_id[m.record_id]
        original = _response_of(rec)
        cf = {"content": m.outcome.action.get("content"), "tool_calls": m.outcome.action.get("tool_calls") or []}
        if m.delta > cfg.theta_ae:
            chosen, rejected, swapped = original, cf, False
        elif cfg.swap_negative and m.delta < -cfg.theta_ae:
            chosen, rejected, swapped = cf, original, True
        else:
            continue
        rows.append(
            {
                "session_id": m.session_id,
                "record_id": m.record_id,
                "call_index": m.call_index,
                "role": m.role,
                "prompt": rec.request.get("messages", []) if isinstance(rec.request, Mapping) else [],
                "tools": rec.request.get("tools", []) if isinstance(rec.request, Mapping) else [],
                "prompt_token_ids": list(rec.prompt_token_ids),
                "chosen": chosen,
                "rejected": rejected,
                "chosen_token_ids": list(rec.generation_token_ids) if not swapped else m.outcome.token_ids,
                "rejected_token_ids": m.outcome.token_ids if not swapped else list(rec.generation_token_ids),
                "delta": m.delta,
                "reward_original": m.reward_original,
                "reward_counterfactual": m.outcome.reward,
                "alternative": m.alternative,
                "variant": m.variant,
                "swapped": swapped,
            }
        )
    return rows


def write_dpo_jsonl(rows: Iterable[Mapping[str, Any]], path: str | Path) -> int:
    """Write DPO rows as JSON lines; returns how many."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n
