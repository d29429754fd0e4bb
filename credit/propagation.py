# SPDX-License-Identifier: Apache-2.0
"""Trajectory advantage Â_τ (as GRPO computes it) and its propagation to calls.

    Â_v = Â_τ · ω_role(r(v)) · d(v)/Σ_j d(v_j) · γ^(|τ|−pos(v)) · s_τ   (+ λ·r_RV(v) for RV calls)

d(v) is the causal contribution (`PropagationConfig.structure`): `direct` (default, docs/call_credit.md) —
the outcome is a node of the graph, the surviving edits are its direct causes, reads and verifications earn
through the edits that used or verified them (`direct_shares`; ω weighs every split there, so it is not applied
twice); `outdegree` — the seed's literal outdeg(v) (`leaf_mode="literal"`) or ε for out-degree-0 calls
(`"epsilon"`). pos(v) is 1-based, s_τ the rescale factor of `PropagationConfig.rescale` (1 for the literal
product). Â_τ per GRPO group: (R − baseline)/(std + eps) with NeMo RL's conventions (leave-one-out or mean
baseline; the std is the Bessel-corrected std of the same leave-one-out set, as
`nemo_rl.algorithms.utils.calculate_baseline_and_std_per_prompt`; groups with ≤ 1 valid sample get advantage
0; no division where the std is 0), so `polar credit` and the trainer compute one Â_τ. This module does not
read records or touch tokens (`fusion.py` does).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .config import CallCreditConfig, CurationConfig, PropagationConfig
from .graph import CallGraph, CallNode

__all__ = [
    "CreditAssignment",
    "assign",
    "direct_shares",
    "group_advantages",
    "is_revert",
    "path_key",
    "propagate",
    "rv_rewards",
    "surviving_edits",
]


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: Sequence[Hashable] | None = None,
    *,
    baseline: str = "leave_one_out",
    normalize_std: bool = True,
    std_eps: float = 1e-6,
    valid: torch.Tensor | Sequence[bool] | None = None,
) -> torch.Tensor:
    """GRPO's per-sample advantage, exactly as NeMo RL's GRPO computes it (`nemo_rl.baseline`, tested equal).

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
    var = torch.zeros(n, dtype=torch.float64)
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    loo = baseline == "leave_one_out"
    for idx_list in groups.values():
        idx = torch.tensor(idx_list)
        rg, vg = r[idx], v[idx]
        if vg.sum() <= 1 or bool((rg[vg > 0] == rg[vg > 0][0]).all()):
            base[idx] = rg  # nothing to compare against, or no spread: advantage exactly 0 (not rounding noise)
            continue
        m = len(idx_list)
        mat = torch.ones(m, m, dtype=torch.float64) - (torch.eye(m, dtype=torch.float64) if loo else 0.0)
        num = vg.sum() - (1.0 if loo else 0.0)
        base[idx] = (mat @ (rg * vg)) / num
        # the Bessel-corrected variance of the `num` rewards (NeMo RL's); one reward has no spread
        bessel = float(num / (num - 1)) if num > 1 else 0.0
        sq[idx] = (mat @ (rg.square() * vg)) / num
        var[idx] = (sq[idx] - base[idx].square()).clamp_min(0.0) * bessel
    adv = r - base
    if normalize_std:
        std = var.sqrt()
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


_REVERT_EVIDENCE = ("shell:git checkout", "shell:git restore", "shell:git stash", "shell:git reset")


def is_revert(node: CallNode) -> bool:
    """An AE call that restores files (`git checkout/restore/stash/reset`): its change is the absence of one."""
    return node.role == "AE" and any(e.startswith(_REVERT_EVIDENCE) for e in node.evidence)


def path_key(p: str) -> str:
    """A path's last two components: `/repo/src/a/b.py`, `src/a/b.py` and `a/b.py` are one file."""
    parts = [x for x in p.strip().split("/") if x and x not in (".", "..")]
    return "/".join(parts[-2:])


def surviving_edits(graph: CallGraph) -> list[int]:
    """AE calls whose changes survive into the final diff: every edit that no later revert of one of its paths
    undid (a revert with no recorded paths, e.g. `git reset --hard`, or of `.` undoes every earlier edit). Reverts themselves are not surviving
    edits. Graphs without paths (NeMo RL annotations) have no reverts: every AE call survives."""
    out = []
    nodes = graph.nodes
    for i, nd in enumerate(nodes):
        if nd.role != "AE" or is_revert(nd):
            continue
        mine = {path_key(p) for p in nd.paths_written}
        undone = False
        for later in nodes[i + 1 :]:
            if is_revert(later):
                theirs = {path_key(p) for p in later.paths_written}
                if not theirs or "" in theirs or not mine or (mine & theirs):  # "" : `git checkout .`
                    undone = True
                    break
        if not undone:
            out.append(i)
    return out


def direct_shares(
    graph: CallGraph, omega: Mapping[str, float], source_weight: str = "kinds", unverified_weight: float = 1.0
) -> torch.Tensor | None:
    """d(v) of `structure="direct"`: credit flowing back from the outcome node (docs/call_credit.md).

    The outcome Y is a node whose parents are the surviving edits (`surviving_edits`): Y gives each ω(AE), or
    ω(AE)·`unverified_weight` when no verification covers it. An edit splits what it receives among itself
    (weight ω(AE)), its sources and its verifiers (weight ω of their role, times the share of evidence kinds —
    path, symbol, test — the edge carries with `source_weight="kinds"`, 1 with `"edge"`):
    - an edit's sources are its graph parents that informed it: reads (IG), verifications whose output it used
      (RV) and reverts (they made room for it); earlier edits are not sources (they survive or were undone on
      their own), and undone edits receive nothing;
    - its verifiers are the verifications that cover it (AE→RV edges).
    A source or verifier keeps the largest share any one of its edits gave it (not the sum over edits), so no read
    earns more than the edit it informed; one hop, so a listing that every later call mentions does not collect
    a chain's credit. Returns None when no edit survives (the caller falls back to the out-degree share).
    """
    n = len(graph.nodes)
    roles = graph.roles()
    survivors = surviving_edits(graph)
    if not survivors:
        return None
    alive = set(survivors)
    reverts = {i for i, nd in enumerate(graph.nodes) if is_revert(nd)}
    parents: dict[int, list[tuple[int, float]]] = {}
    verifiers: dict[int, list[tuple[int, float]]] = {}
    for e in graph.edges:
        kinds = min(len(e.kinds), 3) / 3.0 if source_weight == "kinds" else 1.0
        rs, rd = roles[e.src], roles[e.dst]
        if rs == "AE" and rd == "RV":
            if e.src in alive:
                verifiers.setdefault(e.src, []).append((e.dst, kinds))
            continue
        if rd != "AE":
            continue
        if rs in ("IG", "RV") or e.src in reverts:
            parents.setdefault(e.dst, []).append((e.src, kinds))
    w = [float(omega.get(r, omega.get("OTHER", 0.0))) for r in roles]
    kept = [0.0] * n
    base = {v: w[v] * (1.0 if verifiers.get(v) else unverified_weight) for v in survivors}
    if sum(base.values()) <= 0.0:
        base = {v: w[v] for v in survivors}
    for v in survivors:
        shares = [(v, w[v])]
        shares += [(p, w[p] * k) for p, k in parents.get(v, []) if p < v]
        shares += [(r, w[r] * k) for r, k in verifiers.get(v, [])]
        total = sum(x for _, x in shares)
        for u, x in shares:
            if u == v:
                kept[u] += base[v] * x / total
            else:  # a source or verifier keeps what its most important use gave it, never the sum over uses
                kept[u] = max(kept[u], base[v] * x / total)
    return torch.tensor(kept, dtype=torch.float64)


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
    om = torch.tensor([w.get(nd.role, w.get("OTHER", 0.0)) for nd in graph.nodes], dtype=torch.float64)
    pos = torch.arange(1, n + 1, dtype=torch.float64)
    discount = torch.pow(torch.tensor(cfg.gamma, dtype=torch.float64), n - pos)
    direct = direct_shares(graph, w, cfg.source_weight, cfg.unverified_weight) if cfg.structure == "direct" else None
    if direct is not None and float(direct.sum()) > 0:
        share = direct / direct.sum()
        f = share * discount  # ω already weighed every split of the flow
    else:
        deg = torch.tensor(graph.out_degree(), dtype=torch.float64)
        d = torch.where(deg > 0, deg, torch.full_like(deg, cfg.epsilon)) if cfg.leaf_mode == "epsilon" else deg
        if float(d.sum()) <= 0:
            d = torch.ones(n, dtype=torch.float64)
        share = d / d.sum()
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
        group_id = None if group_ids is None else group_ids[i]
        out.append(assign_one(g, float(adv[i]), float(r[i]), p, omega=omega, rv_reward=rv, group_id=group_id))
    return out


def assign_one(
    graph: CallGraph,
    advantage: float,
    reward: float,
    p: PropagationConfig,
    *,
    omega: Mapping[str, float] | None = None,
    rv_reward: torch.Tensor | None = None,
    group_id: Hashable | None = None,
) -> CreditAssignment:
    """One trajectory's `CreditAssignment`: `propagate` with its trajectory advantage, ω and RV rewards (zeros when
    none are given)."""
    credit, parts = propagate(graph, advantage, p, omega=omega, rv_reward=rv_reward)
    rv = rv_reward if rv_reward is not None else torch.zeros(len(graph.nodes), dtype=torch.float64)
    return CreditAssignment(
        session_id=graph.session_id,
        group_id=group_id,
        reward=reward,
        advantage=advantage,
        roles=graph.roles(),
        credit=credit,
        factor=parts["factor"],
        omega=parts["omega"],
        share=parts["share"],
        discount=parts["discount"],
        scale=float(parts["scale"]),
        rv_reward=rv,
    )
