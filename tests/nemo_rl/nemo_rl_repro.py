# SPDX-License-Identifier: Apache-2.0
"""A faithful reproduction of NeMo RL's batch layout and GRPO advantage, for tests (NeMo RL is not installable here).

Written from NVIDIA-NeMo/RL @ 7ea279abfbeb698b092856d0dab61e7cf39bc909 (read, not copied):
- `nemo_rl/environments/nemo_gym.py`: a Gym rollout's output items become alternating `user` (the new prompt
  tokens since the last item) and `assistant` (generation_token_ids + generation_logprobs) messages with
  `content == ""`; each item's `prompt_token_ids` must start with everything seen so far;
- `grpo.add_grpo_token_loss_masks_and_generation_logprobs`: `token_loss_mask` = ones for assistant messages
  that carry `generation_logprobs`, zeros otherwise; zero `generation_logprobs` added where missing;
- `llm_message_utils.batched_message_log_to_flat_message`: concatenate per row, pad right;
- prompt ids for the advantage: the flattened initial prompt messages (`extract_initial_prompt_messages` with
  the row's `length`), padded with the pad id;
- `mask = token_mask * sample_mask[:, None]`, `sample_mask = loss_multiplier` zeroed where `mask_sample`;
- `GRPOAdvantageEstimator` + `calculate_baseline_and_std_per_prompt`: written out literally, loop by loop, as an
  independent reference for the package's vectorised version.
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
    """NeMo RL's in-place `add_grpo_token_loss_masks_and_generation_logprobs`."""
    for log in message_logs:
        for m in log:
            generated = m["role"] == "assistant" and "generation_logprobs" in m
            m["token_loss_mask"] = torch.ones_like(m["token_ids"]) if generated else torch.zeros_like(m["token_ids"])
            if "generation_logprobs" not in m:
                m["generation_logprobs"] = torch.zeros_like(m["token_ids"], dtype=torch.float32)


def flatten(message_logs: list[list[dict[str, Any]]], key: str, pad: float, divisible_by: int = 1) -> torch.Tensor:
    rows = [torch.cat([m[key] for m in log]) if log else torch.zeros(0) for log in message_logs]
    width = max(r.numel() for r in rows)
    width = -(-width // divisible_by) * divisible_by
    out = torch.full((len(rows), width), pad, dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out


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
    initial = [[m for m, _ in zip(log, range(1), strict=False)] for log in message_log]  # first message = prompt
    prompt_ids = flatten(initial, "token_ids", PAD_ID)
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
