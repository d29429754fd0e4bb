# SPDX-License-Identifier: Apache-2.0
"""STAND-IN for `nemo_rl.experience.rollouts` (test double, not NeMo RL).

Shaped like the pinned module where the `polar_calls` patch applies: `_postprocess_single_nemo_gym_group(
nemo_gym_rows, results, ...)` builds one prompt group's `final_batch` from `results[i]["message_log"]` and
`results[i]["full_result"]` (the Gym verify JSON) and returns a `NemoGymRolloutResult`; `full_result` itself does
not reach the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class NemoGymRolloutResult:
    input_ids: torch.Tensor
    final_batch: dict[str, Any]
    rollout_metrics: dict[str, Any]
    task_index: int | None = None


def _postprocess_single_nemo_gym_group(nemo_gym_rows: list[dict], results: list[dict], *args: Any, **kwargs: Any):
    final_batch = {
        "message_log": [r["message_log"] for r in results],
        "total_reward": torch.tensor([r["full_result"]["reward"] for r in results]),
        "loss_multiplier": torch.ones(len(results)),
    }
    return NemoGymRolloutResult(input_ids=torch.zeros(len(results), 1), final_batch=final_batch, rollout_metrics={})


def run_group(nemo_gym_rows: list[dict], results: list[dict]) -> NemoGymRolloutResult:
    """The rollout loop's call site: through the module global, like the pinned `run_async_nemo_gym_rollout`."""
    return _postprocess_single_nemo_gym_group(nemo_gym_rows, results, None, "prefix")
