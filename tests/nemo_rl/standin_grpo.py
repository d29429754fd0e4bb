# SPDX-License-Identifier: Apache-2.0
"""STAND-IN for `nemo_rl.algorithms.grpo` (NeMo RL is not installable here). Not NeMo RL: a test double.

Shaped like the pinned module (NVIDIA-NeMo/RL @ 7ea279abfbeb) in what the launcher and `install()` touch:
pydantic `AdvEstimatorConfig` / `GRPOConfig` / `ClippedPGLossConfig` / `MasterConfig` with `extra="allow"`
(`name` a plain `str`), the closed if/elif factory `_create_advantage_estimator(master_config)` reading
`master_config.grpo.adv_estimator.name`, a `GRPOAdvantageEstimator` with NeMo RL's semantics, and
`refit_policy_generation(policy, policy_generation, colocated_inference, ...)`. Both trainers of the real module
reach the factory and the refit through these module globals, so wrapping them here is what `install()` does there.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from .nemo_rl_repro import reference_grpo

REFITS: list[tuple[Any, ...]] = []


class AdvEstimatorConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = "grpo"
    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = True
    reward_weights: list[float] | None = None
    minus_baseline: bool = True


class GRPOConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    adv_estimator: AdvEstimatorConfig = Field(default_factory=AdvEstimatorConfig)


class ClippedPGLossConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    use_importance_sampling_correction: bool = False


class MasterConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    policy: dict[str, Any]
    loss_fn: ClippedPGLossConfig
    env: dict[str, Any]
    data: dict[str, Any]
    grpo: GRPOConfig
    logger: dict[str, Any]
    cluster: dict[str, Any]
    checkpointing: dict[str, Any]


class GRPOAdvantageEstimator:
    """NeMo RL's GRPO estimator semantics (expanded to mask.shape, not masked)."""

    def __init__(self, estimator_config: AdvEstimatorConfig, loss_config: Any) -> None:
        self.use_leave_one_out_baseline = estimator_config.use_leave_one_out_baseline
        self.normalize_rewards = estimator_config.normalize_rewards

    def compute_advantage(self, prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, **kwargs: Any):
        return reference_grpo(
            prompt_ids, rewards, mask, leave_one_out=self.use_leave_one_out_baseline, normalize=self.normalize_rewards
        )


class _OtherBuiltinEstimator:
    """Stands in for NeMo RL's GDPO / OPD / Reinforce++ estimators (only their selection matters here)."""

    def __init__(self, estimator_config: Any, loss_config: Any) -> None:
        self.name = estimator_config.name


def _create_advantage_estimator(master_config: MasterConfig) -> Any:
    name = master_config.grpo.adv_estimator.name
    if name == "gdpo":
        return _OtherBuiltinEstimator(master_config.grpo.adv_estimator, master_config.loss_fn)
    elif name == "grpo":
        print("  ✓ Using GRPO advantage estimator")
        return GRPOAdvantageEstimator(master_config.grpo.adv_estimator, master_config.loss_fn)
    elif name in ("opd", "reinforce_plus_plus"):
        return _OtherBuiltinEstimator(master_config.grpo.adv_estimator, master_config.loss_fn)
    else:
        raise ValueError(f"Invalid adv_estimator name: {name}")


def refit_policy_generation(
    policy: Any, policy_generation: Any, colocated_inference: bool, _refit_buffer_size_gb: float | None = None
) -> dict[str, float]:
    REFITS.append((policy, policy_generation, colocated_inference))
    return {}
