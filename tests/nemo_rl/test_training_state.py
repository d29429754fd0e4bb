# SPDX-License-Identifier: Apache-2.0
"""CALL-CREDIT inside NeMo RL training (`credit/nemo_rl/training_state.py`), against the real `nemo_rl`.

- ω co-evolution changes ω over three `compute_advantage` steps, is written into a checkpoint by NeMo RL's own
  `CheckpointManager` (through the installed hooks) and restored into a fresh estimator from the directory
  `get_latest_checkpoint_path` finds;
- IG damping reaches the loss: NeMo RL's `ClippedPGLossFn` (from the smoke recipe's `loss_fn`) gives a different
  loss on the same batch with damping on and off, and the same loss when the batch has nothing to damp;
- the RV self-correction reward appears in the batch and moves Â_τ;
- a counterfactual budget without a rollout URL is refused;
- the training metrics are in `last_metrics`, which the synchronous path's wrapped logger merges.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from nemo_polar.credit.nemo_rl import CallCreditAdvantageEstimator
from nemo_polar.credit.nemo_rl import training_state as ts
from nemo_polar.credit.nemo_rl.options import read_options

from .nemo_rl_repro import build_batch
from .test_estimator_contract import MASKED, POLAR_CALLS, PROPAGATION, REWARDS, ROWS

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "recipes" / "grpo_polar_swe_smoke.yaml"


def _config(training: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": "grpo",
        "_target_": "nemo_polar.credit.nemo_rl.CallCreditAdvantageEstimator",
        "normalize_rewards": True,
        "use_leave_one_out_baseline": True,
        "call_credit": {
            "alpha": 0.25,
            "annotations": "polar_calls",
            "propagation": PROPAGATION,
            "training": training,
            **extra,
        },
    }


COEVOLUTION = {"estimator": "observational", "rule": "proportional", "eta": 0.5}


def _batch(polar_calls: list[list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    batch = build_batch(ROWS, REWARDS, mask_sample=MASKED, divisible_by=8)
    batch["repeated_batch"]["polar_calls"] = copy.deepcopy(polar_calls or POLAR_CALLS)
    return batch


def _step(est: CallCreditAdvantageEstimator, batch: dict[str, Any], **kwargs: Any) -> torch.Tensor:
    return est.compute_advantage(
        batch["prompt_ids"], batch["rewards"], batch["mask"], repeated_batch=batch["repeated_batch"], **kwargs
    )


def test_omega_coevolves_over_three_steps_and_is_restored_from_a_nemo_rl_checkpoint(tmp_path: Path) -> None:
    from nemo_polar.credit.nemo_rl.sync_metrics import track
    from nemo_rl.utils import checkpoint

    est = CallCreditAdvantageEstimator(_config({"coevolution": True}, coevolution=COEVOLUTION))
    omegas = [dict(est.training_state.omega() or {})]
    advantages = []
    for _ in range(3):
        advantages.append(_step(est, _batch()))
        omegas.append(dict(est.training_state.omega() or {}))
    assert all(omegas[i] != omegas[i + 1] for i in range(3)), omegas
    assert est.last_metrics["call_credit/coevolution_step"] == 2.0  # ω used by step 3 came from 2 updates
    # the adapted ω reaches the credit: step 2 and 3 differ from step 1 on the very same batch
    assert not torch.equal(advantages[0], advantages[2])

    ckpt_cfg = {
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "metric_name": None,
        "higher_is_better": False,
        "keep_top_k": None,
        "save_period": 1,
        "save_optimizer": False,
        "enabled": True,
    }
    assert ts.install_checkpoint_hooks()
    try:
        track(est)
        manager = checkpoint.CheckpointManager(ckpt_cfg)
        path = manager.init_tmp_checkpoint(3, {"step": 3}, None)
        manager.finalize_checkpoint(path)

        fresh = CallCreditAdvantageEstimator(_config({"coevolution": True}, coevolution=COEVOLUTION))
        assert fresh.training_state.omega() == omegas[0]
        latest = checkpoint.CheckpointManager(ckpt_cfg).get_latest_checkpoint_path()  # what NeMo RL's setup does
        assert latest is not None and (Path(latest) / ts.STATE_FILE).is_file()
        assert ts.restore(fresh)
    finally:
        ts.uninstall_checkpoint_hooks()
    assert fresh.state_dict() == est.state_dict()
    assert fresh.training_state.omega() == omegas[3]
    assert torch.equal(_step(fresh, _batch()), _step(est, _batch()))


def _loss(advantages: torch.Tensor, sample_mask: torch.Tensor, batch: dict[str, Any]) -> float:
    from nemo_polar.credit.nemo_rl.recipe import load_with_overrides
    from nemo_rl.algorithms import grpo
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn

    master = grpo.MasterConfig(**load_with_overrides(SMOKE, ["loss_fn.reference_policy_kl_penalty=0.0"]))
    loss_fn = ClippedPGLossFn(master.loss_fn)
    shape = batch["mask"].shape
    gen = torch.Generator().manual_seed(0)
    prev = -torch.rand(shape, generator=gen)
    curr = (prev - 0.1 * torch.rand(shape, generator=gen))[:, 1:]  # a policy that moved a little
    data = {
        "input_ids": batch["input_ids"],
        "token_mask": batch["mask"].float(),
        "sample_mask": sample_mask,
        "advantages": advantages,
        "prev_logprobs": prev,
        "generation_logprobs": prev,
        "reference_policy_logprobs": prev,
    }
    mask = data["token_mask"][:, 1:] * sample_mask.unsqueeze(-1)
    loss, _ = loss_fn(curr, data, sample_mask.sum(), mask.sum())
    return float(loss)


def test_ig_damping_weight_reaches_nemo_rl_clipped_pg_loss() -> None:
    damped_cfg = _config({"ig_damping": "sample"}, curation={"theta_ig": 10.0, "ig_damping": 0.2})
    b_off, b_on = _batch(), _batch()
    adv_off = _step(CallCreditAdvantageEstimator(_config({})), b_off)
    est_on = CallCreditAdvantageEstimator(damped_cfg)
    adv_on = _step(est_on, b_on)
    assert torch.equal(adv_on, adv_off)  # damping changes the loss weight, not the advantages
    off = b_off["repeated_batch"]["loss_multiplier"]
    on = b_on["repeated_batch"]["loss_multiplier"]  # the sync path's train_data["sample_mask"] is this tensor
    assert torch.equal(off, torch.tensor([1.0, 1, 1, 1, 1, 0]))
    weights = est_on.last_sample_weights
    assert weights is not None and torch.allclose(on, off * torch.tensor(weights))
    assert min(weights[:5]) < 1.0 and weights[1] == 1.0 and weights[3] == 1.0  # rows with IG calls only
    assert est_on.last_metrics["call_credit/ig_damping/damped_rows"] >= 3
    assert _loss(adv_on, on, b_on) != pytest.approx(_loss(adv_off, off, b_off), rel=1e-6)

    # nothing to damp (no IG calls): the same loss
    no_ig = [[{**c, "role": "AE" if c["role"] == "IG" else c["role"]} for c in row] for row in POLAR_CALLS]
    c_off, c_on = _batch(no_ig), _batch(no_ig)
    a_off = _step(CallCreditAdvantageEstimator(_config({})), c_off)
    a_on = _step(CallCreditAdvantageEstimator(damped_cfg), c_on)
    assert torch.equal(c_on["repeated_batch"]["loss_multiplier"], c_off["repeated_batch"]["loss_multiplier"])
    assert _loss(a_on, c_on["repeated_batch"]["loss_multiplier"], c_on) == _loss(
        a_off, c_off["repeated_batch"]["loss_multiplier"], c_off
    )


def test_ig_damping_uses_the_sample_mask_the_async_path_passes() -> None:
    b = _batch()
    sample_mask = b["repeated_batch"]["loss_multiplier"].clone()
    est = CallCreditAdvantageEstimator(_config({"ig_damping": "sample"}, curation={"theta_ig": 10.0}))
    _step(est, b, sample_mask=sample_mask)
    assert est.last_sample_weights is not None
    assert torch.allclose(sample_mask, b["repeated_batch"]["loss_multiplier"] * torch.tensor(est.last_sample_weights))


def test_ig_damping_is_refused_where_sync_grpo_would_replace_sample_mask() -> None:
    est = CallCreditAdvantageEstimator(_config({"ig_damping": "sample"}))
    ts.check_master_config(est, {"grpo": {"seq_logprob_error_threshold": None}})
    ts.check_master_config(est, {"grpo": {"seq_logprob_error_threshold": 2.0, "async_grpo": {"enabled": True}}})
    with pytest.raises(ts.TrainingOptionError, match="seq_logprob_error_threshold"):
        ts.check_master_config(est, {"grpo": {"seq_logprob_error_threshold": 2.0, "async_grpo": {"enabled": False}}})


def test_rv_reward_appears_in_the_batch_and_moves_the_trajectory_advantage() -> None:
    calls = copy.deepcopy(POLAR_CALLS)
    calls[0][2]["test_outcome"] = "passed"  # row 0: IG → AE → RV, the test passed
    calls[4][1]["test_outcome"] = "failed"  # row 4: IG, RV failed and nothing fixed it
    b_on, b_off = _batch(calls), _batch(calls)
    on = _step(CallCreditAdvantageEstimator(_config({"rv_reward": True, "rv_reward_scale": 0.5})), b_on)
    off = _step(CallCreditAdvantageEstimator(_config({})), b_off)
    column = b_on["repeated_batch"][ts.RV_REWARD_COLUMN]
    assert column.tolist() == [0.5, 0.0, 0.0, 0.0, 0.0, 0.0]  # default r_RV: 1 for a pass, 0 unidentified failure
    assert ts.RV_REWARD_COLUMN not in b_off["repeated_batch"]
    assert not torch.equal(on[:3], off[:3])  # group A's Â_τ moved
    assert torch.equal(on[3:], off[3:])  # group B got no RV reward


def test_counterfactual_budget_is_refused_without_a_rollout_url() -> None:
    with pytest.raises(ts.TrainingOptionError, match="rollout_url"):
        CallCreditAdvantageEstimator(_config({}, counterfactual={"budget": 4}))
    with pytest.raises(ts.TrainingOptionError, match="not wired"):
        CallCreditAdvantageEstimator(_config({}, counterfactual={"budget": 4, "rollout_url": "http://127.0.0.1:9"}))
    CallCreditAdvantageEstimator(_config({}, counterfactual={"budget": 0}))  # the default passes
    with pytest.raises(ValueError, match="ig_damping"):
        read_options(_config({"ig_damping": "token"}))


def test_training_metrics_are_in_last_metrics_and_reach_the_sync_logger() -> None:
    from nemo_polar.credit.nemo_rl import sync_metrics
    from nemo_rl.algorithms import grpo

    est = CallCreditAdvantageEstimator(_config({"coevolution": True}, coevolution=COEVOLUTION))
    _step(est, _batch())
    m = est.last_metrics
    for key in ("call_credit/hacking_rate", "call_credit/credit_share/IG", "call_credit/calibrated_calls"):
        assert key in m
    assert sum(m[f"call_credit/credit_share/{r}"] for r in ("IG", "AE", "RV", "OTHER")) == pytest.approx(1.0)
    assert "call_credit/omega/IG" in m

    sync_metrics.install_sync_metrics(grpo)
    try:
        sync_metrics.track(est)
        metrics: dict[str, Any] = {}
        log_fn = grpo._log_mixed_rewards_and_advantages_information

        class _Logger:
            def log_metrics(self, *args: Any, **kwargs: Any) -> None:
                pass

            def log_histogram(self, *args: Any, **kwargs: Any) -> None:
                pass

        try:
            log_fn(_Logger(), 1, metrics, torch.zeros(6), torch.zeros(6, 4))
        except TypeError as exc:  # a signature this test does not know: say so rather than pass
            pytest.fail(f"NeMo RL's logger signature changed: {exc}")
        assert metrics["call_credit/hacking_rate"] == m["call_credit/hacking_rate"] or (
            metrics["call_credit/hacking_rate"] != metrics["call_credit/hacking_rate"]  # NaN when none succeeded
        )
        assert metrics["call_credit/omega/IG"] == m["call_credit/omega/IG"]
    finally:
        sync_metrics.uninstall_sync_metrics(grpo)


def test_the_factory_restores_omega_from_the_checkpoint_nemo_rl_resumes_from(tmp_path: Path) -> None:
    from nemo_polar.credit.nemo_rl import install, uninstall
    from nemo_polar.credit.nemo_rl.recipe import load_with_overrides
    from nemo_polar.credit.nemo_rl.sync_metrics import track
    from nemo_rl.algorithms import grpo
    from nemo_rl.utils import checkpoint

    overrides = [
        "++grpo.adv_estimator.call_credit.training.coevolution=true",
        "++grpo.adv_estimator.call_credit.annotations=polar_calls",
        "++grpo.adv_estimator.call_credit.coevolution.estimator=observational",
        "++grpo.adv_estimator.call_credit.coevolution.rule=proportional",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
    ]
    master = grpo.MasterConfig(**load_with_overrides(SMOKE, overrides))
    install(grpo)
    try:
        first = grpo._create_advantage_estimator(master)
        assert isinstance(first, CallCreditAdvantageEstimator) and first.training_state.coevolution is not None
        start = first.training_state.omega()
        for _ in range(2):
            _step(first, _batch())
        assert first.training_state.omega() != start
        track(first)
        manager = checkpoint.CheckpointManager(master.checkpointing)
        manager.finalize_checkpoint(manager.init_tmp_checkpoint(2, {"step": 2}, None))

        checkpoint.CheckpointManager(master.checkpointing).get_latest_checkpoint_path()  # NeMo RL's setup()
        resumed = grpo._create_advantage_estimator(master)
    finally:
        uninstall(grpo)
        ts.uninstall_checkpoint_hooks()
    assert resumed is not first and resumed.training_state.omega() == first.training_state.omega()
    assert resumed.state_dict() == first.state_dict()
