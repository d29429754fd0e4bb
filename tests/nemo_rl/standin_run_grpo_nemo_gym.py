# SPDX-License-Identifier: Apache-2.0
"""STAND-IN for NeMo RL's `examples/nemo_gym/run_grpo_nemo_gym.py` (test double, not NeMo RL), with a FAKE
generation interface.

Why a stand-in: the real entry script cannot run on a CPU-only machine (NeMo RL's GRPO setup hard-codes GPUs).
Everything it calls is NeMo RL's own: like the real script it parses `--config` plus Hydra overrides and builds
the real `MasterConfig`; then, in place of training, it does what the trainers do with the two hooks `launch`
wraps: calls NeMo RL's estimator factory once, and for each of two "steps" calls NeMo RL's real
`refit_policy_generation` (through the module global) and computes advantages on a NeMo RL-layout batch, printing
the class and the advantage sum. `FakeGeneration` is the named fake: the generation interface NeMo RL's refit
hands the weights to (its `weight_synchronizer` hook); it only records each sync.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

REFITS: list[int] = []


class _RecordingSynchronizer:
    def __init__(self, on_sync: Callable[..., Any] | None) -> None:
        self.on_sync = on_sync

    def sync_weights(self, timer: Any = None, kv_scales: Any = None) -> dict[str, float]:
        REFITS.append(len(REFITS) + 1)
        if self.on_sync is not None:
            self.on_sync()
        return {}


class FakeGeneration:
    """FAKE generation interface (no GPU worker can exist here): NeMo RL's refit calls its weight synchronizer."""

    def __init__(self, on_sync: Callable[..., Any] | None = None) -> None:
        self.weight_synchronizer = _RecordingSynchronizer(on_sync)


def main() -> None:
    from nemo_polar.credit.nemo_rl.recipe import load_with_overrides
    from nemo_rl.algorithms import grpo

    from tests.nemo_rl.nemo_rl_repro import build_batch
    from tests.nemo_rl.standin_run_grpo_nemo_gym import FakeGeneration as Generation  # the module's own REFITS

    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    args, overrides = parser.parse_known_args()
    master = grpo.MasterConfig(**load_with_overrides(args.config, overrides))
    estimator = grpo._create_advantage_estimator(master)
    batch = build_batch([[([1, 2], [3, 4])], [([1, 2], [5])]], [1.0, 0.0])
    batch["repeated_batch"]["polar_calls"] = [[{"role": "AE", "parents": []}], [{"role": "IG", "parents": []}]]
    generation = Generation()
    for step in range(2):
        grpo.refit_policy_generation(None, generation, False)
        adv = estimator.compute_advantage(
            batch["prompt_ids"], batch["rewards"], batch["mask"], repeated_batch=batch["repeated_batch"]
        )
        print(f"standin step {step}: {type(estimator).__name__} advantage sum {float(adv.abs().sum()):.4f}")


if __name__ == "__main__":
    main()
