# SPDX-License-Identifier: Apache-2.0
"""CALL-CREDIT (imported as `nemo_polar.credit`): call-level causal credit for agentic RL.

Pure: imports only `nemo_polar.types` and `nemo_polar.trajectory` (plus torch, numpy, pydantic), except
`counterfactual_rollout` (`RolloutRunner`), the one module that talks to the rollout service. The only NeMo RL
touch point is `nemo_polar.credit.nemo_rl`, which imports `nemo_rl` lazily.

API:
- `annotate(records | trajectory, …) -> CallGraph` — roles (IG/AE/RV/OTHER, with evidence) and causal edges;
- `assign(graphs, rewards, config, group_ids=…) -> list[CreditAssignment]` — Â_τ as GRPO computes it, and
  Â_v = Â_τ · ω_role · outdeg share · γ^(|τ|−pos);
- `token_advantages(trajectory, graph, assignment, config)` / `fuse_batch(...)` — Ã_t = α·A^GRPO + (1−α)·Â_v(t);
- curation (`dpo_pairs`, `sampling_weights` → per-token / per-sample loss weights `token_weights`,
  `sample_weights`; `rv_rewards`), co-evolution (`CoevolutionState`, `coevolution.step`),
  counterfactual calibration (`CounterfactualRunner`, `calibrate`, `RolloutRunner`), metrics (`reward_hacking`,
  `role_distributions`, `weakness_report`); all options in `CallCreditConfig`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Lazy exports (PEP 562): `polar` builds its parser by importing every subsystem's cli module, and this
# package's submodules pull in torch; importing `nemo_polar.credit` itself must stay cheap.
_EXPORTS: dict[str, str] = {
    "Alternative": "counterfactual",
    "CallCreditConfig": "config",
    "CallGraph": "graph",
    "CallNode": "graph",
    "CoevolutionState": "coevolution",
    "CounterfactualOutcome": "counterfactual",
    "CounterfactualRequest": "counterfactual",
    "CounterfactualRunner": "counterfactual",
    "CreditAssignment": "propagation",
    "DEFAULT_TOOL_ROLES": "roles",
    "RolloutRunner": "counterfactual_rollout",
    "Edge": "graph",
    "Measurement": "counterfactual",
    "adapter_tool_roles": "roles",
    "annotate": "graph",
    "apply_calibration": "counterfactual",
    "assign": "propagation",
    "broadcast_factors": "metrics",
    "calibrate": "counterfactual",
    "dpo_pairs": "curation",
    "estimate_role_effects": "coevolution",
    "fuse_batch": "fusion",
    "fuse_row": "fusion",
    "group_advantages": "propagation",
    "openai_judge": "roles",
    "propagate": "propagation",
    "replay_plan": "counterfactual",
    "reward_hacking": "metrics",
    "role_distributions": "metrics",
    "rv_rewards": "propagation",
    "sample_weights": "fusion",
    "sampling_weights": "curation",
    "select_calls": "counterfactual",
    "token_advantages": "fusion",
    "token_weights": "fusion",
    "training_metrics": "metrics",
    "update_omega": "coevolution",
    "weakness_report": "metrics",
    "write_dpo_jsonl": "curation",
}

if TYPE_CHECKING:
    from .coevolution import CoevolutionState, estimate_role_effects, update_omega
    from .config import CallCreditConfig
    from .counterfactual import (
        Alternative,
        CounterfactualOutcome,
        CounterfactualRequest,
        CounterfactualRunner,
        Measurement,
        apply_calibration,
        calibrate,
        replay_plan,
        select_calls,
    )
    from .counterfactual_rollout import RolloutRunner
    from .curation import dpo_pairs, sampling_weights, write_dpo_jsonl
    from .fusion import fuse_batch, fuse_row, sample_weights, token_advantages, token_weights
    from .graph import CallGraph, CallNode, Edge, annotate
    from .metrics import broadcast_factors, reward_hacking, role_distributions, training_metrics, weakness_report
    from .propagation import CreditAssignment, assign, group_advantages, propagate, rv_rewards
    from .roles import DEFAULT_TOOL_ROLES, adapter_tool_roles, openai_judge


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_TOOL_ROLES",
    "Alternative",
    "CallCreditConfig",
    "CallGraph",
    "CallNode",
    "CoevolutionState",
    "CounterfactualOutcome",
    "CounterfactualRequest",
    "CounterfactualRunner",
    "CreditAssignment",
    "Edge",
    "Measurement",
    "RolloutRunner",
    "adapter_tool_roles",
    "annotate",
    "apply_calibration",
    "assign",
    "broadcast_factors",
    "calibrate",
    "dpo_pairs",
    "estimate_role_effects",
    "fuse_batch",
    "fuse_row",
    "group_advantages",
    "openai_judge",
    "propagate",
    "replay_plan",
    "reward_hacking",
    "role_distributions",
    "rv_rewards",
    "sample_weights",
    "sampling_weights",
    "select_calls",
    "token_advantages",
    "token_weights",
    "training_metrics",
    "update_omega",
    "weakness_report",
    "write_dpo_jsonl",
]
