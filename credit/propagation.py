# SPDX-License-Identifier: Apache-2.0
"""Trajectory advantage Â_τ (as GRPO computes it) and its propagation to calls.

    Â_v = Â_τ · ω_role(r(v)) · d(v)/Σ_j d(v_j) · γ^(|τ|−pos(v)) · s_τ   (+ λ·r_RV(v) for RV calls)

with d(v) = outdeg(v) (`leaf_mode="literal"`) or ε for out-degree-0 calls (`"epsilon"`), pos(v) 1-based, and
s_τ the rescale factor of `PropagationConfig.rescale` (1 for the literal product). Â_τ per GRPO group:
(R − baseline)/(std + eps) with NeMo RL's conventions (leave-one-out or mean baseline; the std is the
population std of the same leave-one-out set; groups with ≤ 1 valid sample get advantage 0; no division where
the std is 0). This module does not read records or touch tokens (`fusion.py` does).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .config import CallCreditConfig, CurationConfig, PropagationConfig
from .graph import CallGraph

__all__ = ["CreditAssignment", "assign", "group_advantages", "propagate", "rv_rewards"]


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: Sequence[Hashable] | None = None,
    *,
    baseline: str = "leave_one_out",
    normalize_std: bool = True,
    std_eps: float = 1e-6,
    valid: torch.Tensor | Sequence[bool] | None = None,
) -> torch.Tensor:
    """GRPO's per-sample advantage.

    Args:
        rewards: [N] rewards.
        group_ids: [N] group keys (samples of one prompt share a key); None = one group.
        valid: [N] 0/1, samples with 0 are left out of the baseline (their advantage is still computed).

    Returns:
        [N] float64 advantages.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    n = r.numel()
    v = torch.ones(n, dtype=torch.float64) if valid is None else torch.as_tensor(valid, dtype=torch.float64)
    keys = list(group_ids) if group_ids is not None else [0] * n
    if len(keys) != n:
        raise ValueError(f"{len(keys)} group ids for {n} rewards")
    base = torch.zeros(n, dtype=torch.float64)
    sq = torch.zeros(n, dtype=torch.float64)
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    loo = baseline == "leave_one_out"
    for idx_list in groups.values():
        idx = torch.tensor(idx_list)
        rg, vg = r[idx], v[idx]
        if vg.sum() <= 1:
            base[idx] = rg  # nothing to compare against: advantage 0
            continue
        m = len(idx_list)
        mat = torch.ones(m, m, dtype=torch.float64) - (torch.eye(m, dtype=torch.float64) if loo else 0.0)
        num = vg.sum() - (1.0 if loo else 0.0)
        base[idx] = (mat @ (rg * vg)) / num
        sq[idx] = (mat @ (rg.square() * vg)) / num
    adv = r - base
    if normalize_std:
        std = (sq - base.square()).clamp_min(0.0).sqrt()
        nz = std > 0
        adv = torch.where(nz, adv / (std + std_eps), adv)
    return adv


def rv_rewards(graph: CallGraph, cfg: CurationConfig | None = None) -> torch.Tensor:
    """The RV self-correction reward per call (0 for non-RV calls).

    r_RV = c_pass·𝟙[passed] + c_id·𝟙[failed ∧ identified] + c_unid·𝟙[failed ∧ ¬identified]; the proposal's
    r_RV = 𝟙[pass] − 𝟙[fail ∧ identified] is the default (c_pass=1, c_id=−1, c_unid=0). "Identified": a later AE
    call depends on the failure in the graph (`identified_by="graph"`) or any AE call follows it.
    """
    cfg = cfg or CurationConfig()
    n = len(graph.nodes)
    out = torch.zeros(n, dtype=torch.float64)
    roles = graph.roles()
    children: dict[int, list[int]] = {}
    for e in graph.edges:
        children.setdefault(e.src, []).append(e.dst)
    for j, node in enumerate(graph.nodes):
        if node.role != "RV" or node.test_outcome is None:
            continue
        if node.test_outcome == "passed":
            out[j] = cfg.rv_pass
            continue
        if cfg.identified_by == "graph":
            identified = any(roles[k] == "AE" for k in children.get(j, []))
        else:
            identified = "AE" in roles[j + 1 :]
        out[j] = cfg.rv_fail_identified if identified else cfg.rv_fail_unidentified
    return out


@dataclass(slots=True)
class CreditAssignment:
    """Call-level credit of one trajectory.

    `credit[k]` = Â_v of node k; `factor[k]` = Â_v/Â_τ before the RV term (the structural share, defined even
    when Â_τ = 0); `omega`, `share`, `discount` are the three factors; `scale` is s_τ.
    """

    session_id: str
    group_id: Any
    reward: float
    advantage: float
    roles: list[str]
    credit: torch.Tensor
    factor: torch.Tensor
    omega: torch.Tensor
    share: torch.Tensor
    discount: torch.Tensor
    scale: float
    rv_reward: torch.Tensor
    calibrated: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "group_id": self.group_id,
            "reward": self.reward,
            "advantage": self.advantage,
            "scale": self.scale,
            "calls": [
                {
                    "call_index": k,
                    "role": self.roles[k],
                    "credit": float(self.credit[k]),
                    "factor": float(self.factor[k]),
                    "omega": float(self.omega[k]),
                    "share": float(self.share[k]),
                    "discount": float(self.discount[k]),
                    "rv_reward": float(self.rv_reward[k]),
                    **({"delta": self.calibrated[k]} if k in self.calibrated else {}),
                }
                for k in range(len(self.roles))
            ],
        }


def propagate(
    graph: CallGraph,
    advantage: float,
    config: PropagationConfig | None = None,
    *,
    omega: Mapping[str, float] | None = None,
    rv_reward: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Â_v for every node of `graph` given Â_τ = `advantage`.

    Returns:
        ([n] float64 credits, {"factor", "omega", "share", "discount": [n] tensors, "scale": float}).
    """
    cfg = config or PropagationConfig()
    w = dict(cfg.omega if omega is None else omega)
    n = len(graph.nodes)
    empty = torch.zeros(0, dtype=torch.float64)
    if n == 0:
        return empty, {"factor": empty, "omega": empty, "share": empty, "discount": empty, "scale": 1.0}
    deg = torch.tensor(graph.out_degree(), dtype=torch.float64)
    d = torch.where(deg > 0, deg, torch.full_like(deg, cfg.epsilon)) if cfg.leaf_mode == "epsilon" else deg
    if float(d.sum()) <= 0:
        d = torch.ones(n, dtype=torch.float64)
    share = d / d.sum()
    pos = torch.arange(1, n + 1, dtype=torch.float64)
    discount = torch.pow(torch.tensor(cfg.gamma, dtype=torch.float64), n - pos)
    om = torch.tensor([w.get(nd.role, w.get("OTHER", 0.0)) for nd in graph.nodes], dtype=torch.float64)
    f = om * share * discount
    total = float(f.sum())
    if cfg.rescale == "none" or total <= 0:
        scale = 1.0
    elif cfg.rescale == "mean":
        scale = n / total
    elif cfg.rescale == "token_mean":
        tok = torch.tensor([max(nd.n_tokens, 0) for nd in graph.nodes], dtype=torch.float64)
        if float(tok.sum()) <= 0:
            tok = torch.ones(n, dtype=torch.float64)
        scale = float(tok.sum()) / float((tok * f).sum()) if float((tok * f).sum()) > 0 else 1.0
    else:  # max
        scale = 1.0 / float(f.max())
    factor = f * scale
    credit = advantage * factor
    if rv_reward is not None and cfg.rv_reward_weight != 0.0:
        roles = torch.tensor([nd.role == "RV" for nd in graph.nodes])
        credit = credit + cfg.rv_reward_weight * rv_reward * roles
    return credit, {"factor": factor, "omega": om, "share": share, "discount": discount, "scale": scale}


def assign(
    graphs: Sequence[CallGraph],
    rewards: Sequence[float] | torch.Tensor,
    config: CallCreditConfig | None = None,
    *,
    group_ids: Sequence[Hashable] | None = None,
    omega: Mapping[str, float] | None = None,
    valid: Sequence[bool] | None = None,
    advantages: Sequence[float] | torch.Tensor | None = None,
) -> list[CreditAssignment]:
    """Credit for every call of every trajectory of a batch.

    Args:
        graphs: one `CallGraph` per trajectory.
        rewards: [N] outcome rewards.
        group_ids: GRPO groups (samples of one task); None = the whole batch is one group.
        omega: role weights overriding the config's (co-evolution passes its current ω here).
        advantages: precomputed Â_τ (e.g. NeMo RL's); when None they are computed from `rewards` as GRPO does.
    """
    cfg = config or CallCreditConfig()
    p = cfg.propagation
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    if r.numel() != len(graphs):
        raise ValueError(f"{r.numel()} rewards for {len(graphs)} graphs")
    if advantages is None:
        adv = group_advantages(
            r, group_ids, baseline=p.baseline, normalize_std=p.normalize_std, std_eps=p.std_eps, valid=valid
        )
    else:
        adv = torch.as_tensor(advantages, dtype=torch.float64).reshape(-1)
    out = []
    for i, g in enumerate(graphs):
        rv = rv_rewards(g, cfg.curation)
        credit, parts = propagate(g, float(adv[i]), p, omega=omega, rv_reward=rv)
        out.append(
            CreditAssignment(
                session_id=g.session_id,
                group_id=None if group_ids is None else group_ids[i],
                reward=float(r[i]),
                advantage=float(adv[i]),
                roles=g.roles(),
                credit=credit,
                factor=parts["factor"],
                omega=parts["omega"],
                share=parts["share"],
                discount=parts["discount"],
                scale=float(parts["scale"]),
                rv_reward=rv,
            )
        )
    return out
