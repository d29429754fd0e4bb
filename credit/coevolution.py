# SPDX-License-Identifier: Apache-2.0
"""Credit–capability co-evolution (the proposal's §3.3): re-estimate per-role causal effects after each step
and adapt ω_role from their drift; the state is saved and restored as JSON.

Per-role causal effect e_r (`CoevolutionConfig.estimator`):
- `counterfactual`: the mean measured Δ of the role's calibrated calls this step;
- `observational`: within GRPO groups, the least-squares slope of the reward on the number of the role's calls
  that are connected in the causal graph (group-centred, so the task's difficulty cancels) — an observational,
  confounded estimate, used when no counterfactuals exist;
- `auto`: counterfactual for roles that have measurements, observational for the rest.

Effects are smoothed (EMA). The `literal` rule is the proposal's: when AE's effect falls by more than the
threshold, ω(IG) grows by (1+η) (the policy has learnt to use IG information); when RV's effect rises, ω(RV)
grows. This module computes no credit.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import CallCreditConfig, CoevolutionConfig
from .counterfactual import Measurement
from .graph import CallGraph

__all__ = ["CoevolutionState", "estimate_role_effects", "step", "update_omega"]

ROLES = ("AE", "IG", "RV", "OTHER")


@dataclass(slots=True)
class CoevolutionState:
    """ω_role, the smoothed per-role effects and the history of both."""

    omega: dict[str, float]
    step: int = 0
    effects: dict[str, float | None] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def initial(cls, config: CallCreditConfig | None = None) -> CoevolutionState:
        cfg = config or CallCreditConfig()
        return cls(omega=dict(cfg.propagation.omega))

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "step": self.step, "omega": self.omega, "effects": self.effects, "history": self.history}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CoevolutionState:
        if d.get("version") != 1:
            raise ValueError(f"unknown co-evolution state version {d.get('version')!r}")
        return cls(
            omega={k: float(v) for k, v in d["omega"].items()},
            step=int(d["step"]),
            effects={k: (None if v is None else float(v)) for k, v in d.get("effects", {}).items()},
            history=list(d.get("history", [])),
        )

    def save(self, path: str | Path) -> None:
        """Write atomically (temp file + rename)."""
        p = Path(path)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))
        tmp.replace(p)

    @classmethod
    def load(cls, path: str | Path) -> CoevolutionState:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _observational(
    graphs: Sequence[CallGraph], rewards: Sequence[float], group_ids: Sequence[Hashable] | None
) -> dict[str, float | None]:
    keys = list(group_ids) if group_ids is not None else [0] * len(graphs)
    connected: list[dict[str, int]] = []
    for g in graphs:
        touched = {e.src for e in g.edges} | {e.dst for e in g.edges}
        cnt = dict.fromkeys(ROLES, 0)
        for n in g.nodes:
            if n.index in touched and n.role in cnt:
                cnt[n.role] += 1
        connected.append(cnt)
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out: dict[str, float | None] = {}
    for role in ROLES:
        sxy = sxx = 0.0
        for idx in groups.values():
            if len(idx) < 2:
                continue
            mx = sum(connected[i][role] for i in idx) / len(idx)
            my = sum(float(rewards[i]) for i in idx) / len(idx)
            for i in idx:
                dx = connected[i][role] - mx
                sxy += dx * (float(rewards[i]) - my)
                sxx += dx * dx
        out[role] = sxy / sxx if sxx > 0 else None
    return out


def estimate_role_effects(
    graphs: Sequence[CallGraph],
    rewards: Sequence[float],
    *,
    group_ids: Sequence[Hashable] | None = None,
    measurements: Sequence[Measurement] = (),
    estimator: str = "auto",
) -> dict[str, float | None]:
    """e_r per role (None where nothing supports an estimate)."""
    cf: dict[str, list[float]] = {}
    for m in measurements:
        cf.setdefault(m.role, []).append(m.delta)
    cf_mean: dict[str, float | None] = {r: (sum(v) / len(v) if (v := cf.get(r)) else None) for r in ROLES}
    if estimator == "counterfactual":
        return cf_mean
    obs = _observational(graphs, rewards, group_ids)
    if estimator == "observational":
        return obs
    return {r: cf_mean[r] if cf_mean[r] is not None else obs[r] for r in ROLES}


def update_omega(
    state: CoevolutionState, effects: Mapping[str, float | None], config: CoevolutionConfig | None = None
) -> CoevolutionState:
    """One adaptation step (see the module docstring); returns a new state."""
    cfg = config or CoevolutionConfig()
    prev = dict(state.effects)
    smoothed: dict[str, float | None] = {}
    for r in ROLES:
        e, p = effects.get(r), prev.get(r)
        smoothed[r] = p if e is None else (e if p is None else cfg.ema * p + (1 - cfg.ema) * e)
    drift: dict[str, float | None] = {}
    for r in ROLES:
        now, before = smoothed[r], prev.get(r)
        drift[r] = None if now is None or before is None else now - before
    om = dict(state.omega)
    moves: list[str] = []
    d_ae, d_rv = drift.get("AE"), drift.get("RV")
    if cfg.rule in ("literal", "symmetric"):
        if d_ae is not None and d_ae < -cfg.threshold:
            om["IG"] *= 1 + cfg.eta
            moves.append("AE effect fell: ω(IG)↑")
        if d_rv is not None and d_rv > cfg.threshold:
            om["RV"] *= 1 + cfg.eta
            moves.append("RV effect rose: ω(RV)↑")
        if cfg.rule == "symmetric":
            if d_ae is not None and d_ae > cfg.threshold:
                om["IG"] *= 1 - cfg.eta
                moves.append("AE effect rose: ω(IG)↓")
            if d_rv is not None and d_rv < -cfg.threshold:
                om["RV"] *= 1 - cfg.eta
                moves.append("RV effect fell: ω(RV)↓")
    else:  # proportional
        e_ae = smoothed.get("AE")
        if e_ae is not None and e_ae > 0:
            for r in ("IG", "RV"):
                e_r = smoothed.get(r)
                if e_r is not None:
                    target = om["AE"] * max(e_r, 0.0) / e_ae
                    om[r] = (1 - cfg.eta) * om[r] + cfg.eta * target
                    moves.append(f"ω({r})→{target:.3g}")
    for r in om:
        om[r] = min(max(om[r], cfg.omega_min), cfg.omega_max)
    if cfg.keep_order:
        om["IG"] = min(om["IG"], om["AE"])
        om["RV"] = min(om["RV"], om["IG"])
    hist = [
        *state.history,
        {"step": state.step + 1, "omega": dict(om), "effects": smoothed, "drift": drift, "moves": moves},
    ]
    return CoevolutionState(omega=om, step=state.step + 1, effects=smoothed, history=hist)


def step(
    state: CoevolutionState,
    graphs: Sequence[CallGraph],
    rewards: Sequence[float],
    config: CallCreditConfig | None = None,
    *,
    group_ids: Sequence[Hashable] | None = None,
    measurements: Sequence[Measurement] = (),
) -> CoevolutionState:
    """After a training step: estimate per-role effects on the new trajectories and adapt ω."""
    cfg = config or CallCreditConfig()
    eff = estimate_role_effects(
        graphs, rewards, group_ids=group_ids, measurements=measurements, estimator=cfg.coevolution.estimator
    )
    return update_omega(state, eff, cfg.coevolution)
