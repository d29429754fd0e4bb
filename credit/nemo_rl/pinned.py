# SPDX-License-Identifier: Apache-2.0
"""The NVIDIA-NeMo/RL commit every NeMo RL fact in this package was read from.

Does: name the commit (also written to `NEMO_RL_COMMIT` next to this file, for humans and scripts) and the
NeMo RL symbols we wrap or mirror, so that a version bump is one reviewed change here plus the tests.
Does not: import `nemo_rl`.

Facts taken from that commit (see `schema.py` for the config keys):
- `nemo_rl.algorithms.grpo._create_advantage_estimator(master_config)`: a closed if/elif on
  `master_config.grpo.adv_estimator.name` (`gdpo | grpo | opd | reinforce_plus_plus`), called by `grpo_train`
  and `async_grpo_train` through the module global, so wrapping the module attribute takes effect.
- `AdvEstimatorConfig(BaseModel, extra="allow")`: `name: str` (not a Literal at this commit, so
  `name: call_credit` validates), `normalize_rewards`, `use_leave_one_out_baseline`, `reward_weights`,
  `minus_baseline`; extra keys (`_target_`, `call_credit`) survive validation as attributes.
- `GRPOAdvantageEstimator.compute_advantage`: baseline/std from
  `nemo_rl.algorithms.utils.calculate_baseline_and_std_per_prompt(prompt_ids, rewards, ones, leave_one_out)`,
  `(r - baseline) / (std + 1e-6)` where `std > 0`, expanded to `mask.shape` (not masked).
- Call sites pass `prompt_ids=[B, P]` (the flattened initial prompt messages), `rewards=[B]`,
  `mask = token_mask * sample_mask[:, None]`, `repeated_batch`, `logprobs_policy`, `logprobs_reference`; the
  async trainer adds `teacher_logprobs`, `prev_logprobs`, `generation_logprobs`, `sample_mask` and merges
  `last_metrics` into the rollout metrics.
- `refit_policy_generation(policy, policy_generation, colocated_inference, ...)`: the weight update, called
  through the module global by both trainers.
- `nemo_rl.experience.rollouts._postprocess_single_nemo_gym_group(nemo_gym_rows, results, ...)`: builds the
  group's `final_batch` (a `NemoGymRolloutResult`) where each `results[i]["full_result"]` is the Gym verify
  JSON — the one place the `polar_calls` list is still in reach.
- `examples/nemo_gym/run_grpo_nemo_gym.py`: the NeMo Gym GRPO entry script (`--config` + Hydra overrides).
"""

from __future__ import annotations

NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
NEMO_RL_REPO = "https://github.com/NVIDIA-NeMo/RL"

GRPO_MODULE = "nemo_rl.algorithms.grpo"
FACTORY_NAME = "_create_advantage_estimator"
REFIT_NAME = "refit_policy_generation"
ROLLOUTS_MODULE = "nemo_rl.experience.rollouts"
GYM_GROUP_POSTPROCESS_NAME = "_postprocess_single_nemo_gym_group"
ENTRY_SCRIPT = "examples/nemo_gym/run_grpo_nemo_gym.py"
# the synchronous trainers' advantage logging (`metrics` it fills is logged with the step); see sync_metrics.py
GRPO_SYNC_MODULE = "nemo_rl.algorithms.grpo_sync"
SYNC_METRICS_LOG_NAME = "_log_mixed_rewards_and_advantages_information"
# names the pinned factory accepts for grpo.adv_estimator.name
BUILTIN_ESTIMATOR_NAMES = ("gdpo", "grpo", "opd", "reinforce_plus_plus")
