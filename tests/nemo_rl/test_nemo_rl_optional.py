# SPDX-License-Identifier: Apache-2.0
"""The same checks against the real NeMo RL (run in the NeMo RL environment, see conftest.py). Validates every
recipe with NeMo RL's own `MasterConfig`, installs the plug-in into its real factory, and compares α = 1 with its
`GRPOAdvantageEstimator`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nemo_polar.credit.nemo_rl import CallCreditAdvantageEstimator, install, uninstall
from nemo_polar.credit.nemo_rl.factory import allows_name_call_credit
from nemo_polar.credit.nemo_rl.recipe import load_with_overrides

from .nemo_rl_repro import build_batch

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_validates_with_nemo_rl_master_config(recipe: Path) -> None:
    from nemo_rl.algorithms.grpo import MasterConfig

    config = load_with_overrides(recipe, ["polar.harness=codex", "+grpo.adv_estimator.my_plugin_key=1"])
    master = MasterConfig(**config)
    assert master.grpo.adv_estimator.name == "grpo"


def test_install_into_real_factory_and_alpha_one_matches_nemo_rl_grpo() -> None:
    from nemo_rl.algorithms import grpo
    from nemo_rl.algorithms.advantage_estimator import AdvEstimatorConfig, GRPOAdvantageEstimator

    assert allows_name_call_credit(grpo)
    config = load_with_overrides(ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b_call_credit.yaml")
    config["grpo"]["adv_estimator"]["call_credit"]["alpha"] = 1.0
    install(grpo)
    try:
        estimator = grpo._create_advantage_estimator(grpo.MasterConfig(**config))
    finally:
        uninstall(grpo)
    assert isinstance(estimator, CallCreditAdvantageEstimator)
    rows = [[([1, 2], [3, 4])], [([1, 2], [5])], [([1, 2], [6, 7, 8])], [([9], [3])], [([9], [4])]]
    batch = build_batch(rows, [1.0, 0.0, 1.0, 0.0, 1.0])
    batch["repeated_batch"]["polar_calls"] = [[{"role": "AE", "parents": []}]] * 5
    ours = estimator.compute_advantage(
        batch["prompt_ids"], batch["rewards"], batch["mask"], repeated_batch=batch["repeated_batch"]
    )
    theirs = GRPOAdvantageEstimator(AdvEstimatorConfig(), None).compute_advantage(
        batch["prompt_ids"], batch["rewards"], batch["mask"]
    )
    torch.testing.assert_close(ours, torch.where(batch["mask"] != 0, theirs, torch.zeros(())), rtol=0, atol=1e-6)


def test_call_credit_metrics_reach_the_synchronous_trainers_logged_metrics(tmp_path: Path) -> None:
    """Sync GRPO (`grpo_train`, `grpo_sync`) logs the `metrics` dict its advantage logging fills; async GRPO merges
    `last_metrics` by itself. After `install()`, both synchronous modules' logging carries the CALL-CREDIT metrics."""
    from nemo_rl.algorithms import grpo, grpo_sync
    from nemo_rl.utils.logger import Logger

    logger = Logger(
        {
            "log_dir": str(tmp_path),
            "wandb_enabled": False,
            "swanlab_enabled": False,
            "tensorboard_enabled": False,
            "mlflow_enabled": False,
            "wandb": {},
            "monitor_gpus": False,
            "gpu_monitoring": {},
        }
    )
    config = load_with_overrides(ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b_call_credit.yaml")
    install(grpo)
    try:
        estimator = grpo._create_advantage_estimator(grpo.MasterConfig(**config))
        rows = [[([1, 2], [3, 4])], [([1, 2], [5])], [([9], [3])], [([9], [4])]]
        batch = build_batch(rows, [1.0, 0.0, 1.0, 0.0])
        batch["repeated_batch"]["polar_calls"] = [[{"role": "AE", "parents": []}]] * 4
        adv = estimator.compute_advantage(
            batch["prompt_ids"], batch["rewards"], batch["mask"], repeated_batch=batch["repeated_batch"]
        )
        for module in (grpo, grpo_sync):
            metrics: dict = {}
            module._log_mixed_rewards_and_advantages_information(logger, 0, metrics, torch.full((4,), 0.5), adv)
            assert "advantages/mean" in metrics  # NeMo RL's own logging still ran
            assert metrics["call_credit/alpha"] == estimator.alpha
            assert metrics["call_credit/rows_annotated_from_polar_calls"] == 1.0
            assert metrics["call_credit/role_share/AE"] == 1.0
    finally:
        uninstall(grpo)
    for module in (grpo, grpo_sync):
        assert not getattr(module._log_mixed_rewards_and_advantages_information, "__call_credit_metrics_wrapped__", 0)
