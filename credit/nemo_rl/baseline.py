# SPDX-License-Identifier: Apache-2.0
"""GRPO's sequence advantage Â_τ over prompt-row groups, with NeMo RL's exact semantics.

Written from the pinned NeMo RL commit (`pinned.NEMO_RL_COMMIT`), `GRPOAdvantageEstimator` and
`calculate_baseline_and_std_per_prompt`, so that α = 1 reproduces its token advantages:

- a group is the set of rows whose `prompt_ids` rows are identical;
- every sample counts for the baseline (NeMo RL passes `valid_mask = ones`: masked samples still count);
- leave-one-out: baseline_i = mean of the *other* rewards of the group, std_i the Bessel-corrected std of the
  other rewards; otherwise the group mean and the group's Bessel-corrected std;
- a group of one sample gets baseline = reward (advantage 0);
- with `normalize_rewards`, advantages are divided by (std + 1e-6) where std > 0, left as is elsewhere.

Does not: expand to tokens or mask (the estimator does that).
"""

from __future__ import annotations

import torch

STD_EPSILON = 1e-6


def group_ids(prompt_ids: torch.Tensor) -> torch.Tensor:
    """Group index per row: rows with identical prompts share one. `prompt_ids` is [B, P] (or [B])."""
    prompts = prompt_ids if prompt_ids.dim() == 2 else prompt_ids.reshape(prompt_ids.shape[0], -1)
    _, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    return inverse


def grpo_sequence_advantages(
    prompt_ids: torch.Tensor,
    rewards: torch.Tensor,
    *,
    leave_one_out: bool = True,
    normalize: bool = True,
) -> torch.Tensor:
    """Â_τ per row, as NeMo RL's GRPO computes it.

    Args:
        prompt_ids: [B, P] prompt token ids (identical rows = one GRPO group), any device.
        rewards: [B] float rewards.
        leave_one_out: RLOO baseline (NeMo RL's `use_leave_one_out_baseline`).
        normalize: divide by the group std (NeMo RL's `normalize_rewards`).

    Returns:
        [B] advantages on CPU, in `rewards`' floating dtype (float32 for integer rewards).
    """
    r = rewards.detach().to("cpu")
    if not torch.is_floating_point(r):
        r = r.float()
    groups = group_ids(prompt_ids.detach().to("cpu"))
    baseline = torch.zeros_like(r)
    std = torch.zeros_like(r)
    for g in torch.unique(groups).tolist():
        idx = torch.nonzero(groups == g, as_tuple=True)[0]
        n = int(idx.numel())
        rg = r[idx]
        if n <= 1:
            baseline[idx] = rg
            continue
        weights = torch.ones((n, n), dtype=r.dtype) - (torch.eye(n, dtype=r.dtype) if leave_one_out else 0)
        count = n - int(leave_one_out)
        mean = (weights @ rg) / count
        mean_sq = (weights @ rg.pow(2)) / count
        baseline[idx] = mean
        # (count / (count - 1)) turns the population variance of the `count` rewards into the sample variance;
        # a 0/0 or x/0 here (count == 1) is NaN and means "no spread" (0), as upstream's nan_to_num(0) does
        # for the 0·inf case.
        std[idx] = ((mean_sq - mean.square()) * (count / (count - 1) if count > 1 else float("inf"))).sqrt()
    std = std.nan_to_num(0.0)
    advantages = r - baseline
    if normalize:
        spread = std > 0
        advantages[spread] = advantages[spread] / (std[spread] + STD_EPSILON)
    return advantages
