# SPDX-License-Identifier: Apache-2.0
"""STAND-IN for NeMo RL's `examples/nemo_gym/run_grpo_nemo_gym.py` (test double, not NeMo RL).

Like the real entry script it parses `--config` plus Hydra overrides itself and builds `MasterConfig`; then, in
place of training, it does what the trainers do with the two hooks we wrap: calls the estimator factory once,
and for each of two "steps" refits (through the module global) and computes advantages on a NeMo RL-layout
batch, printing the class and the advantage sum.
"""

from __future__ import annotations

import argparse

from nemo_polar.credit.nemo_rl.recipe import load_with_overrides

from tests.nemo_rl import standin_grpo as grpo
from tests.nemo_rl.nemo_rl_repro import build_batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    args, overrides = parser.parse_known_args()
    master = grpo.MasterConfig(**load_with_overrides(args.config, overrides))
    estimator = grpo._create_advantage_estimator(master)
    batch = build_batch([[([1, 2], [3, 4])], [([1, 2], [5])]], [1.0, 0.0])
    batch["repeated_batch"]["polar_calls"] = [[{"role": "AE", "parents": []}], [{"role": "IG", "parents": []}]]
    for step in range(2):
        grpo.refit_policy_generation(None, None, False)
        adv = estimator.compute_advantage(
            batch["prompt_ids"], batch["rewards"], batch["mask"], repeated_batch=batch["repeated_batch"]
        )
        print(f"standin step {step}: {type(estimator).__name__} advantage sum {float(adv.abs().sum()):.4f}")


if __name__ == "__main__":
    main()
