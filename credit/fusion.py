# SPDX-License-Identifier: Apache-2.0
"""Per-token fusion: Ã_t = α·A_t^GRPO + (1−α)·Â_{v(t)}, zero on interstitial tokens.

A_t^GRPO is the trajectory advantage Â_τ on every trainable token (GRPO broadcasts it). v(t) is the call whose
span `[start, end)` contains t — `Trace.call_spans` give these spans for per_request traces (one span per
trace) and prefix_merging traces (many spans per trace) alike. Tokens with loss mask 0 (prompt deltas, tool
outputs, template glue) get 0. With α = 1 the result equals GRPO's token advantages exactly.

This module only maps credits onto token positions; it does not compute them (`propagation.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nemo_polar.types import Trace, Trajectory

from .config import CallCreditConfig, FusionConfig
from .graph import CallGraph
from .propagation import CreditAssignment

__all__ = ["fuse_batch", "fuse_row", "sample_weights", "token_advantages", "token_weights", "trace_spans"]


def fuse_row(
    mask: torch.Tensor,
    spans: Sequence[tuple[int, int, int]],
    call_credit: torch.Tensor,
    grpo_advantage: float,
    alpha: float,
    *,
    unspanned: str = "trajectory",
    call_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fused advantages of one row.

    Args:
        mask: [S] loss mask (0/1).
        spans: (start, end, k) — tokens [start, end) belong to call k of `call_credit`.
        call_credit: [K] Â_v per call.
        grpo_advantage: Â_τ.
        call_weight: optional [K] multipliers (curation sampling weights).

    Returns:
        [S] float32 advantages, 0 where `mask == 0`.
    """
    m = mask.to(torch.float32)
    grpo = torch.full_like(m, float(grpo_advantage))
    if alpha >= 1.0:
        out = grpo * m
    else:
        v = torch.full_like(m, float(grpo_advantage) if unspanned == "trajectory" else 0.0)
        w = torch.ones_like(m) if call_weight is not None else None
        cc = call_credit.to(torch.float32)
        for s, e, k in spans:
            if e > s:
                v[s:e] = cc[k]
                if w is not None and call_weight is not None:
                    w[s:e] = float(call_weight[k])
        out = (alpha * grpo + (1.0 - alpha) * v) * m
        if w is not None:
            out = out * w
    return out


def fuse_batch(
    mask: torch.Tensor,
    spans: Sequence[Sequence[tuple[int, int, int]]],
    grpo_advantages: torch.Tensor | Sequence[float],
    call_credits: Sequence[torch.Tensor],
    alpha: float,
    *,
    unspanned: str = "trajectory",
    call_weights: Sequence[torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """`fuse_row` over a padded batch.

    Args:
        mask: [B, S] loss mask.
        spans: per row, (start, end, k) into that row.
        grpo_advantages: [B] Â_τ per row.
        call_credits: per row, [K_b] Â_v.

    Returns:
        [B, S] float32.
    """
    b, s = mask.shape
    adv = torch.as_tensor(grpo_advantages, dtype=torch.float32).reshape(-1)
    m = mask.to(torch.float32)
    if alpha >= 1.0:
        return adv[:, None] * m
    v = adv[:, None].expand(b, s).clone() if unspanned == "trajectory" else torch.zeros(b, s)
    w = torch.ones(b, s) if call_weights is not None else None
    for i in range(b):
        cc = call_credits[i].to(torch.float32)
        row = v[i]
        cw = call_weights[i] if call_weights is not None else None
        for st, en, k in spans[i]:
            if en > st:
                row[st:en] = cc[k]
                if w is not None and cw is not None:
                    w[i, st:en] = float(cw[k])
    out = (alpha * adv[:, None] + (1.0 - alpha) * v) * m
    return out * w if w is not None else out


def trace_spans(trace: Trace, graph: CallGraph) -> list[tuple[int, int, int]]:
    """(start, end, node index) for every span of `trace` whose record is a node of `graph`."""
    idx = graph.index_of()
    return [(s, e, idx[rid]) for rid, s, e in trace.call_spans if rid in idx]


def token_advantages(
    trajectory: Trajectory | Trace | Sequence[Trace],
    graph: CallGraph,
    assignment: CreditAssignment,
    config: CallCreditConfig | FusionConfig | None = None,
    *,
    call_weights: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Fused token advantages for each trace (aligned with `response_ids`; the prompt is never trained).

    Works for per_request trajectories (one span per trace) and prefix_merging ones (many spans per trace).
    """
    fcfg = config.fusion if isinstance(config, CallCreditConfig) else (config or FusionConfig())
    if isinstance(trajectory, Trajectory):
        traces = list(trajectory.traces)
    elif isinstance(trajectory, Trace):
        traces = [trajectory]
    else:
        traces = list(trajectory)
    weights = call_weights if fcfg.apply_sampling_weights else None
    out = []
    for t in traces:
        mask = torch.tensor(t.loss_mask, dtype=torch.float32)
        out.append(
            fuse_row(
                mask,
                trace_spans(t, graph),
                assignment.credit,
                assignment.advantage,
                fcfg.alpha,
                unspanned=fcfg.unspanned,
                call_weight=weights,
            )
        )
    return out


def token_weights(
    trajectory: Trajectory | Trace | Sequence[Trace], graph: CallGraph, call_weights: torch.Tensor
) -> list[torch.Tensor]:
    """Per-token loss weights for each trace (aligned with `response_ids`): the call's weight on its trainable
    tokens (e.g. `curation.sampling_weights`: damped low-effect IG calls), 1 on trainable tokens outside every call,
    0 where `loss_mask` is 0. A trainer multiplies its per-token loss by these (the IG damping reaches the loss
    without changing the advantages); `sample_weights` gives the per-sample form."""
    out = []
    for t in _traces(trajectory):
        mask = torch.tensor(t.loss_mask, dtype=torch.float32)
        w = torch.ones_like(mask)
        for st, en, k in trace_spans(t, graph):
            w[st:en] = float(call_weights[k])
        out.append(w * mask)
    return out


def sample_weights(
    trajectory: Trajectory | Trace | Sequence[Trace], graph: CallGraph, call_weights: torch.Tensor
) -> list[float]:
    """Per-trace (per-sample) loss weight: the mean of `token_weights` over the trace's trainable tokens (1 for a
    trace without trainable tokens)."""
    out = []
    traces = _traces(trajectory)
    for t, w in zip(traces, token_weights(traces, graph, call_weights), strict=True):
        n = float(sum(t.loss_mask))
        out.append(float(w.sum()) / n if n > 0 else 1.0)
    return out


def _traces(trajectory: Trajectory | Trace | Sequence[Trace]) -> list[Trace]:
    if isinstance(trajectory, Trajectory):
        return list(trajectory.traces)
    if isinstance(trajectory, Trace):
        return [trajectory]
    return list(trajectory)
