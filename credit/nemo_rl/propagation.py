# SPDX-License-Identifier: Apache-2.0
"""Fallback call credit Â_v, used only when the CALL-CREDIT core (`nemo_polar.credit`) is not importable.

Same formula, option names and defaults as the core's `PropagationConfig` / `propagation.propagate`:
Â_v = Â_τ · ω_role(r(v)) · d(v)/Σ_j d(v_j) · γ^(|τ|−pos(v)) · s_τ, pos 1-based, d(v) = outdeg(v), or ε for
out-degree-0 calls when `leaf_mode="epsilon"`; a uniform share when every d is 0; s_τ from `rescale`
(`none` = 1, `mean`: mean over calls of Â_v/Â_τ = 1, `token_mean`: token-weighted mean = 1, `max`: largest
factor = 1). Every factor but Â_τ is ≥ 0, so each call keeps the sign of Â_τ, and Â_τ = 0 gives zero credit.

Does: the per-row math on plain floats. Does not: touch tensors or tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .annotations import CallAnnotation


class FallbackPropagation(BaseModel):
    model_config = ConfigDict(extra="allow")

    omega: dict[str, float] = Field(default_factory=lambda: {"AE": 1.0, "IG": 0.6, "RV": 0.3, "OTHER": 0.1})
    gamma: float = Field(default=0.95, gt=0, le=1)
    leaf_mode: Literal["epsilon", "literal"] = "epsilon"
    epsilon: float = Field(default=0.5, ge=0)
    rescale: Literal["none", "mean", "token_mean", "max"] = "mean"


class FallbackFusion(BaseModel):
    model_config = ConfigDict(extra="allow")

    alpha: float = Field(default=0.5, ge=0, le=1)


class FallbackCallCreditConfig(BaseModel):
    """The subset of the core's `CallCreditConfig` this package reads (other sections pass unchecked)."""

    model_config = ConfigDict(extra="allow")

    propagation: FallbackPropagation = Field(default_factory=FallbackPropagation)
    fusion: FallbackFusion = Field(default_factory=FallbackFusion)


def out_degrees(annotations: Sequence[CallAnnotation]) -> list[int]:
    """Number of later calls that list each call as a parent."""
    degree = [0] * len(annotations)
    for ann in annotations:
        for parent in set(ann.parents):
            degree[parent] += 1
    return degree


def propagate(
    adv_tau: float, annotations: Sequence[CallAnnotation], n_tokens: Sequence[int], cfg: FallbackPropagation
) -> list[float]:
    """Â_v for every call of one row, in call order (see the module docstring)."""
    n = len(annotations)
    if n == 0:
        return []
    degree = [float(d) if d > 0 or cfg.leaf_mode == "literal" else cfg.epsilon for d in out_degrees(annotations)]
    if sum(degree) <= 0:
        degree = [1.0] * n
    total = sum(degree)
    factor = [
        cfg.omega.get(a.role, cfg.omega.get("OTHER", 0.0)) * (d / total) * cfg.gamma ** (n - pos)
        for pos, (a, d) in enumerate(zip(annotations, degree, strict=True), start=1)
    ]
    f_sum = sum(factor)
    scale = 1.0
    if cfg.rescale != "none" and f_sum > 0:
        if cfg.rescale == "mean":
            scale = n / f_sum
        elif cfg.rescale == "token_mean":
            tokens = [max(int(t), 0) for t in n_tokens] if sum(max(int(t), 0) for t in n_tokens) > 0 else [1] * n
            weighted = sum(t * f for t, f in zip(tokens, factor, strict=True))
            scale = sum(tokens) / weighted if weighted > 0 else 1.0
        else:
            scale = 1.0 / max(factor)
    return [adv_tau * f * scale for f in factor]
