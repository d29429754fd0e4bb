# SPDX-License-Identifier: Apache-2.0
"""NeMo RL-layout batches for the estimator tests, built with NeMo RL's own functions where they run on CPU.

- the message log of a Gym rollout (`gym_row`) is written out here: NeMo RL builds it inside its `NemoGym` Ray
  actor (`_postprocess_nemo_gym_to_nemo_rl_result`), which needs a running Gym; the rule is the same: alternating
  `user` (new prompt tokens since the last item) and `assistant` (generation_token_ids + generation_logprobs)
  messages, each item's prompt starting with everything seen so far;
- loss masks, prompt extraction and flattening are NeMo RL's: `add_grpo_token_loss_masks_and_generation_logprobs`,
  `extract_initial_prompt_messages`, `batched_message_log_to_flat_message`;
- `mask = token_mask * sample_mask[:, None]`, `sample_mask = loss_multiplier` zeroed where `mask_sample`;
- `reference_grpo`: GRPO's advantage written out loop by loop, an independent reference for the package's
  vectorised version (the tests also compare with NeMo RL's own `GRPOAdvantageEstimator`).
Runs in the NeMo RL environment (tests/nemo_rl/conftest.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch

PAD_ID = 0


def gym_row(items: list[tuple[list[int], list[int]]]) -> list[dict[str, Any]]:
    """message_log of one Gym rollout: `items` = [(prompt_token_ids, generation_token_ids)] per model call."""
    seen: list[int] = []
    log: list[dict[str, Any]] = []
    for prompt, generation in items:
        assert prompt[: len(seen)] == seen, "Non-contiguous messages found!"
        log.append({"role": "user", "content": "", "token_ids": torch.tensor(prompt[len(seen) :])})
        log.append(
            {
                "role": "assistant",
                "content": "",
                "token_ids": torch.tensor(generation),
                "generation_logprobs": torch.full((len(generation),), -0.5),
            }
        )
        seen = [*prompt, *generation]
    return log


def add_loss_masks(message_logs: list[list[dict[str, Any]]]) -> None:
    """NeMo RL's own `add_grpo_token_loss_masks_and_generation_logprobs` (in place)."""
    from nemo_rl.algorithms.grpo import add_grpo_token_loss_masks_and_generation_logprobs

    add_grpo_token_loss_masks_and_generation_logprobs(message_logs)


def flatten(message_logs: list[list[dict[str, Any]]], key: str, pad: float, divisible_by: int = 1) -> torch.Tensor:
    """One padded [B, T] tensor of `key`, by NeMo RL's own `batched_message_log_to_flat_message`."""
    from nemo_rl.data.llm_message_utils import batched_message_log_to_flat_message

    flat, _ = batched_message_log_to_flat_message(
        message_logs, pad_value_dict={key: pad}, make_sequence_length_divisible_by=divisible_by
    )
    return flat[key]


def build_batch(
    rows: list[list[tuple[list[int], list[int]]]],
    rewards: list[float],
    *,
    mask_sample: list[bool] | None = None,
    divisible_by: int = 1,
) -> dict[str, Any]:
    """Everything `compute_advantage` receives at the pinned call site, built the way NeMo RL builds it."""
    message_log = [gym_row(items) for items in rows]
    length = torch.tensor([int(log[0]["token_ids"].numel()) for log in message_log])
    repeated_batch: dict[str, Any] = {
        "message_log": message_log,
        "length": length,
        "loss_multiplier": torch.ones(len(rows)),
        "total_reward": torch.tensor(rewards, dtype=torch.float32),
    }
    if mask_sample is not None:
        repeated_batch["mask_sample"] = torch.tensor(mask_sample)
        repeated_batch["loss_multiplier"] = repeated_batch["loss_multiplier"].clone()
        repeated_batch["loss_multiplier"][repeated_batch["mask_sample"]] = 0
    from nemo_rl.algorithms.grpo import extract_initial_prompt_messages

    prompt_ids = flatten(extract_initial_prompt_messages(message_log, length), "token_ids", PAD_ID)
    add_loss_masks(message_log)
    token_mask = flatten(message_log, "token_loss_mask", 0, divisible_by)
    input_ids = flatten(message_log, "token_ids", PAD_ID, divisible_by)
    mask = token_mask * repeated_batch["loss_multiplier"].unsqueeze(-1)
    return {
        "prompt_ids": prompt_ids,
        "rewards": repeated_batch["total_reward"],
        "mask": mask,
        "repeated_batch": repeated_batch,
        "input_ids": input_ids,
    }


def reference_grpo(
    prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, *, leave_one_out: bool, normalize: bool
) -> torch.Tensor:
    """NeMo RL's GRPO token advantages, written out loop by loop (expanded to mask.shape, NOT masked)."""
    n = rewards.shape[0]
    baseline = [0.0] * n
    std = [0.0] * n
    r = [float(x) for x in rewards]
    for i in range(n):
        group = [j for j in range(n) if torch.equal(prompt_ids[j], prompt_ids[i])]
        if len(group) <= 1:
            baseline[i] = r[i]
            continue
        others = [j for j in group if j != i] if leave_one_out else group
        k = len(others)
        mean = sum(r[j] for j in others) / k
        mean_sq = sum(r[j] ** 2 for j in others) / k
        baseline[i] = mean
        var = (mean_sq - mean**2) * (k / (k - 1)) if k > 1 else float("nan")
        std[i] = 0.0 if (math.isnan(var) or var < 0) else math.sqrt(var)
    adv = []
    for i in range(n):
        a = r[i] - baseline[i]
        if normalize and std[i] > 0:
            a = a / (std[i] + 1e-6)
        adv.append(a)
    return torch.tensor(adv, dtype=torch.float32).unsqueeze(-1).expand(mask.shape)
