# SPDX-License-Identifier: Apache-2.0
"""Metrics and diagnostics: the reward-hacking rate, per-role credit distributions, the weakness report.

**Reward-hacking rate** (the proposal's definition): the share of successful trajectories (reward ≥
`success_threshold`) in which IG calls receive significantly more credit than AE calls. Credit is compared
through the structural factor Â_v/Â_τ (the credit in the direction of the trajectory's advantage; equal to
the credit up to the positive scale |Â_τ|, and defined when Â_τ = 0) and **per call**: the mean factor of the
trajectory's IG calls against the mean factor of its AE calls (`hacking_aggregate="mean"`, the default; `sum`
compares the role's credit mass, which calls a trajectory with three reads and one edit hacked even when every
call gets the same credit). "Significantly" is `hacking_test`: `ratio` (default) — mean_IG > (1 + margin)·mean_AE
+ abs_margin with margin 0.25, i.e. an IG call gets at least 25 % more credit than an AE call on average;
`zscore` — (mean_IG − mean_AE)/SE > z (one-sided 5 %, needs ≥ 2 calls of each role). A successful trajectory
without AE calls counts as hacked when its IG credit exceeds the absolute margin. Outcome-broadcast credit
(Polar's per_request: every call gets Â_τ) is `broadcast_factors`: equal per-call credit is never hacked by the
per-call definition (its `sum` rate is the share of successful trajectories with ≥ 1.25 reads per edit).

**Weakness report** (docs/call_credit.md): reads whose observations no later call uses (IG, out-degree 0), edits
never verified (AE without an AE→RV edge), failed verifications with no corrective edit after them.
This module changes no credit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .config import CurationConfig, MetricsConfig
from .graph import CallGraph
from .propagation import CreditAssignment

__all__ = [
    "broadcast_factors",
    "is_hacked",
    "reward_hacking",
    "role_distributions",
    "training_metrics",
    "weakness_report",
]

ROLES = ("IG", "AE", "RV", "OTHER")


def broadcast_factors(graph: CallGraph) -> torch.Tensor:
    """The outcome-broadcast baseline: every call gets Â_τ (factor 1)."""
    return torch.ones(len(graph.nodes), dtype=torch.float64)


def _agg(x: list[float], how: str) -> float:
    if not x:
        return 0.0
    if how == "sum":
        return float(sum(x))
    if how == "mean":
        return float(sum(x) / len(x))
    return float(max(x))


def is_hacked(roles: Sequence[str], factor: torch.Tensor, cfg: MetricsConfig | None = None) -> bool:
    """Whether IG credit significantly exceeds AE credit in one trajectory (see the module docstring)."""
    cfg = cfg or MetricsConfig()
    ig = [float(factor[k]) for k, r in enumerate(roles) if r == "IG"]
    ae = [float(factor[k]) for k, r in enumerate(roles) if r == "AE"]
    if not ig:
        return False
    if cfg.hacking_test == "zscore":
        if len(ig) < 2 or len(ae) < 2:
            return False
        mi, ma = sum(ig) / len(ig), sum(ae) / len(ae)
        vi = sum((x - mi) ** 2 for x in ig) / (len(ig) - 1)
        va = sum((x - ma) ** 2 for x in ae) / (len(ae) - 1)
        se = math.sqrt(vi / len(ig) + va / len(ae))
        if se == 0:
            return mi > ma + cfg.hacking_abs_margin
        return (mi - ma) / se > cfg.hacking_z
    a_ig, a_ae = _agg(ig, cfg.hacking_aggregate), _agg(ae, cfg.hacking_aggregate)
    return a_ig > (1 + cfg.hacking_margin) * a_ae + cfg.hacking_abs_margin


def reward_hacking(
    graphs: Sequence[CallGraph],
    rewards: Sequence[float],
    factors: Sequence[torch.Tensor],
    config: MetricsConfig | None = None,
) -> dict[str, Any]:
    """{rate, n_successful, n_hacked, sessions, per_harness: {h: {rate, n_successful, n_hacked}}}."""
    cfg = config or MetricsConfig()
    per: dict[str, dict[str, Any]] = {}
    flagged = []
    n_s = n_h = 0
    for g, r, f in zip(graphs, rewards, factors, strict=True):
        if float(r) < cfg.success_threshold:
            continue
        h = g.harness or "unknown"
        d = per.setdefault(h, {"n_successful": 0, "n_hacked": 0})
        d["n_successful"] += 1
        n_s += 1
        if is_hacked(g.roles(), f, cfg):
            d["n_hacked"] += 1
            n_h += 1
            flagged.append(g.session_id)
    for d in per.values():
        d["rate"] = d["n_hacked"] / d["n_successful"] if d["n_successful"] else None
    return {
        "rate": n_h / n_s if n_s else None,
        "n_successful": n_s,
        "n_hacked": n_h,
        "sessions": flagged,
        "per_harness": per,
    }


def training_metrics(
    graphs: Sequence[CallGraph],
    assignments: Sequence[CreditAssignment],
    config: MetricsConfig | None = None,
    *,
    prefix: str = "call_credit/",
) -> dict[str, float]:
    """Flat scalars for a trainer's logger, one batch: the reward-hacking rate (NaN without a successful
    trajectory), the share of Σ|Â_v| per role, the number of calibrated calls and their mean Δ (NaN when none),
    the mean |Â_τ| and the number of calls. Trainer-independent (the NeMo RL paths log this dict)."""
    cfg = config or MetricsConfig()
    rewards = [a.reward for a in assignments]
    rep = reward_hacking(graphs, rewards, [a.factor for a in assignments], cfg)
    mass = {r: 0.0 for r in ROLES}
    for a in assignments:
        for k, role in enumerate(a.roles):
            mass[role if role in mass else "OTHER"] += abs(float(a.credit[k]))
    total = sum(mass.values())
    deltas = [d for a in assignments for d in a.calibrated.values()]
    n_calls = sum(len(a.roles) for a in assignments)
    out = {
        "hacking_rate": float("nan") if rep["rate"] is None else float(rep["rate"]),
        "successful": float(rep["n_successful"]),
        "calibrated_calls": float(len(deltas)),
        "calibrated_mean_delta": sum(deltas) / len(deltas) if deltas else float("nan"),
        "mean_abs_traj_advantage": (
            sum(abs(a.advantage) for a in assignments) / len(assignments) if assignments else 0.0
        ),
        "calls": float(n_calls),
    }
    for role in ROLES:
        out[f"credit_share/{role}"] = mass[role] / total if total > 0 else 0.0
    return {prefix + k: v for k, v in out.items()}


def _quantile(xs: list[float], q: float) -> float:
    return float(torch.quantile(torch.tensor(xs, dtype=torch.float64), q)) if xs else float("nan")


def role_distributions(
    graphs: Sequence[CallGraph], assignments: Sequence[CreditAssignment]
) -> dict[str, dict[str, dict[str, float]]]:
    """Per harness, per role: n, mean, std, p10, p50, p90 of Â_v, and the role's share of Σ|Â_v|."""
    vals: dict[str, dict[str, list[float]]] = {}
    for g, a in zip(graphs, assignments, strict=True):
        h = g.harness or "unknown"
        for k, role in enumerate(a.roles):
            vals.setdefault(h, {}).setdefault(role, []).append(float(a.credit[k]))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for h, by_role in vals.items():
        mass = sum(abs(x) for xs in by_role.values() for x in xs)
        out[h] = {}
        for role in ROLES:
            xs = by_role.get(role, [])
            if not xs:
                continue
            mean = sum(xs) / len(xs)
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
            out[h][role] = {
                "n": float(len(xs)),
                "mean": mean,
                "std": std,
                "p10": _quantile(xs, 0.1),
                "p50": _quantile(xs, 0.5),
                "p90": _quantile(xs, 0.9),
                "mass_share": (sum(abs(x) for x in xs) / mass) if mass > 0 else 0.0,
            }
    return out


def weakness_report(
    graphs: Sequence[CallGraph],
    config: MetricsConfig | None = None,
    curation: CurationConfig | None = None,
) -> dict[str, dict[str, Any]]:
    """Per harness: unused reads, unverified edits, failed verifications without a corrective edit (counts,
    rates over the role's calls, and up to `max_examples` examples each)."""
    cfg = config or MetricsConfig()
    cur = curation or CurationConfig()
    out: dict[str, dict[str, Any]] = {}
    for g in graphs:
        h = g.harness or "unknown"
        rep = out.setdefault(
            h,
            {
                "sessions": 0,
                "reads": 0,
                "edits": 0,
                "failed_verifications": 0,
                "unused_reads": {"count": 0, "examples": []},
                "unverified_edits": {"count": 0, "examples": []},
                "uncorrected_failures": {"count": 0, "examples": []},
            },
        )
        rep["sessions"] += 1
        roles = g.roles()
        children: dict[int, list[int]] = {}
        for e in g.edges:
            children.setdefault(e.src, []).append(e.dst)
        for k, n in enumerate(g.nodes):
            kids = children.get(k, [])
            ex = {"session_id": g.session_id, "call_index": k, "record_id": n.record_id, "summary": n.summary}
            if n.role == "IG":
                rep["reads"] += 1
                if not kids:
                    _add(rep["unused_reads"], ex, cfg.max_examples)
            elif n.role == "AE":
                rep["edits"] += 1
                if not any(roles[c] == "RV" for c in kids):
                    _add(rep["unverified_edits"], ex, cfg.max_examples)
            elif n.role == "RV" and n.test_outcome == "failed":
                rep["failed_verifications"] += 1
                if cur.identified_by == "graph":
                    fixed = any(roles[c] == "AE" for c in kids)
                else:
                    fixed = "AE" in roles[k + 1 :]
                if not fixed:
                    _add(rep["uncorrected_failures"], ex, cfg.max_examples)
    for rep in out.values():
        rep["unused_reads"]["rate"] = _rate(rep["unused_reads"]["count"], rep["reads"])
        rep["unverified_edits"]["rate"] = _rate(rep["unverified_edits"]["count"], rep["edits"])
        rep["uncorrected_failures"]["rate"] = _rate(rep["uncorrected_failures"]["count"], rep["failed_verifications"])
    return out


def _add(slot: dict[str, Any], ex: dict[str, Any], max_examples: int) -> None:
    slot["count"] += 1
    if len(slot["examples"]) < max_examples:
        slot["examples"].append(ex)


def _rate(a: int, b: int) -> float | None:
    return a / b if b else None
