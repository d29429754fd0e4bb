# SPDX-License-Identifier: Apache-2.0
"""The recipe schema: NeMo RL's GRPO `MasterConfig` keys at the pinned commit, as pydantic models.

Derived from NVIDIA-NeMo/RL @ 7ea279abfbeb698b092856d0dab61e7cf39bc909 (`pinned.NEMO_RL_COMMIT`):
`nemo_rl/algorithms/grpo.py` (`MasterConfig`, `GRPOConfig`, `AsyncGRPOConfig`, `RewardScalingConfig`),
`nemo_rl/algorithms/advantage_estimator.py` (`AdvEstimatorConfig`), `nemo_rl/algorithms/loss/loss_functions.py`
(`ClippedPGLossConfig`), and the required keys of the TypedDicts `PolicyConfig`, `TokenizerConfig`,
`DTensorConfig`, `GenerationConfig`, `VllmSpecificArgs`, `DataConfig`, `ClusterConfig`, `CheckpointingConfig`,
`LoggerConfig`. Like upstream every model allows extra keys (NeMo RL's pydantic models are `extra="allow"`);
required keys and types are checked, and so are the cross-field rules the pinned trainer asserts at start-up
(async GRPO needs importance-sampling correction and an async vLLM engine). On top, the CALL-CREDIT block:
a config that selects our estimator has its `call_credit:` options validated by `CallCreditOptions`.

`nemo_rl_config_keys.json` (written by `pinned_keys.py` from the commit's source) lists those keys; a test checks
these models against it. Does: validate a resolved recipe (`validate_recipe`), reporting every error at once.
Does not: import NeMo RL (where it is importable, tests also validate against its own `MasterConfig`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .options import read_options, selects_call_credit
from .pinned import BUILTIN_ESTIMATOR_NAMES, NEMO_RL_COMMIT

SCHEMA_COMMIT = NEMO_RL_COMMIT


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- grpo ---------------------------------------------------------------------------------------------------


class AdvEstimatorSchema(_Open):
    name: str = "grpo"
    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = True
    reward_weights: list[float] | None = None
    minus_baseline: bool = True

    @model_validator(mode="after")
    def _known_estimator(self) -> AdvEstimatorSchema:
        extra = self.model_extra or {}
        if selects_call_credit({"name": self.name, **extra}):
            read_options({"name": self.name, **extra})  # own keys and the CALL-CREDIT core's, all at once
        elif "_target_" not in extra and self.name not in BUILTIN_ESTIMATOR_NAMES:
            raise ValueError(f"name {self.name!r} is not one of {BUILTIN_ESTIMATOR_NAMES} and no _target_ is set")
        return self


class AsyncGRPOSchema(_Open):
    enabled: bool = False
    max_trajectory_age_steps: int = 1
    max_generation_failures: int = 0
    in_flight_weight_updates: bool = False
    recompute_kv_cache_after_weight_updates: bool = False


class RewardScalingSchema(_Open):
    enabled: bool = False
    source_min: float = 0.0
    source_max: float = 1.0
    target_min: float = 0.0
    target_max: float = 1.0


class GRPOSchema(_Open):
    num_prompts_per_step: int = 32
    num_generations_per_prompt: int = 16
    max_num_epochs: int = 1
    max_num_steps: int = 1000000
    max_rollout_turns: int = 1
    normalize_rewards: bool = True
    advantage_clip_low: float | None = None
    advantage_clip_high: float | None = None
    use_leave_one_out_baseline: bool = True
    val_period: int = 10
    val_start_at: int = -1
    val_batch_size: int | None = 256
    val_at_start: bool = False
    val_at_end: bool = False
    max_val_samples: int | None = 256
    val_num_generations_per_prompt: int = 1
    stop_at_validation_metric: str | None = None
    stop_at_validation_threshold: float | None = None
    skip_reference_policy_logprobs_calculation: bool = False
    seed: int = 42
    async_grpo: AsyncGRPOSchema | None = Field(default_factory=AsyncGRPOSchema)
    overlong_filtering: bool = False
    use_dynamic_sampling: bool = False
    dynamic_sampling_max_gen_batches: int = 10
    batch_multiplier: float = 1.0
    reward_shaping: _Open = Field(default_factory=_Open)
    reward_scaling: RewardScalingSchema = Field(default_factory=RewardScalingSchema)
    calculate_advantages_on_gpu: bool = False
    seq_logprob_error_threshold: float | None = None
    invalid_tool_call_advantage: float | None = None
    malformed_thinking_advantage: float | None = None
    adv_estimator: AdvEstimatorSchema = Field(default_factory=AdvEstimatorSchema)
    deduplicate_multimodal_data: bool = False
    debug_payload_metrics: bool = False


class LossFnSchema(_Open):
    disable_ppo_ratio: bool = False
    token_level_loss: bool = True
    sequence_level_importance_ratios: bool = False
    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.2
    ratio_clip_c: float | None = None
    reference_policy_kl_penalty: float = 0.01
    reference_policy_kl_type: str = "k3"
    kl_input_clamp_value: float | None = 20.0
    kl_output_clamp_value: float | None = 10.0
    use_kl_in_reward: bool = False
    use_importance_sampling_correction: bool = False
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] | None = None
    truncated_importance_sampling_ratio: float | None = None
    truncated_importance_sampling_ratio_min: float | None = None
    use_on_policy_kl_approximation: bool = False
    force_on_policy_ratio: bool = False
    use_cispo: bool = False
    positive_example_nll_weight: float = 0.0


# -- policy (TypedDicts upstream: only their required keys are required here) ---------------------------------


class TokenizerSchema(_Open):
    name: str


class EnabledSchema(_Open):
    enabled: bool


class DTensorSchema(_Open):
    """`DTensorConfig | DTensorConfigDisabled` upstream: the other keys are required only when enabled."""

    REQUIRED_WHEN_ENABLED: ClassVar[tuple[str, ...]] = (
        "tensor_parallel_size",
        "context_parallel_size",
        "sequence_parallel",
        "activation_checkpointing",
        "cpu_offload",
    )
    enabled: bool

    @model_validator(mode="after")
    def _required_when_enabled(self) -> DTensorSchema:
        if self.enabled:
            missing = [k for k in self.REQUIRED_WHEN_ENABLED if k not in (self.model_extra or {})]
            if missing:
                raise ValueError(f"dtensor_cfg.enabled=true needs {missing}")
        return self


class DynamicBatchingSchema(_Open):
    enabled: bool

    @model_validator(mode="after")
    def _required_when_enabled(self) -> DynamicBatchingSchema:
        missing = [k for k in ("train_mb_tokens", "sequence_length_round") if k not in (self.model_extra or {})]
        if self.enabled and missing:
            raise ValueError(f"dynamic_batching.enabled=true needs {missing}")
        return self


class VllmSpecificSchema(_Open):
    tensor_parallel_size: int
    pipeline_parallel_size: int
    expert_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    skip_tokenizer_init: bool
    async_engine: bool
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3"]


class ColocationSchema(_Open):
    enabled: bool
    resources: dict[str, Any]


class GenerationSchema(_Open):
    backend: str
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int | None
    val_temperature: float
    val_top_p: float
    val_top_k: int | None
    stop_token_ids: list[int] | None
    stop_strings: list[str] | None
    colocated: ColocationSchema | None = None
    vllm_cfg: VllmSpecificSchema | None = None

    @model_validator(mode="after")
    def _vllm_needs_cfg(self) -> GenerationSchema:
        if self.backend == "vllm" and self.vllm_cfg is None:
            raise ValueError("generation.backend=vllm needs vllm_cfg")
        return self


class PolicySchema(_Open):
    model_name: str
    tokenizer: TokenizerSchema
    train_global_batch_size: int
    train_micro_batch_size: int
    precision: str
    dtensor_cfg: DTensorSchema
    dynamic_batching: DynamicBatchingSchema
    make_sequence_length_divisible_by: int
    max_total_sequence_length: int
    generation: GenerationSchema | None = None
    megatron_cfg: EnabledSchema | None = None
    sequence_packing: EnabledSchema | None = None


# -- data, env, logger, cluster, checkpointing ----------------------------------------------------------------


class DatasetSchema(_Open):
    data_path: str | None = None
    dataset_name: str | None = None
    env_name: str | None = None
    processor: str | None = None


class DataSchema(_Open):
    max_input_seq_length: int | None
    shuffle: bool
    train: DatasetSchema | list[DatasetSchema]
    validation: DatasetSchema | list[DatasetSchema] | None = None
    default: DatasetSchema | None = None


class NemoGymSchema(_Open):
    config_paths: list[str] = Field(min_length=1)


class EnvSchema(_Open):
    should_use_nemo_gym: bool = False
    nemo_gym: NemoGymSchema | None = None

    @model_validator(mode="after")
    def _gym_needs_block(self) -> EnvSchema:
        if self.should_use_nemo_gym and self.nemo_gym is None:
            raise ValueError("env.should_use_nemo_gym=true needs env.nemo_gym.config_paths")
        return self


class LoggerSchema(_Open):
    log_dir: str
    wandb_enabled: bool
    swanlab_enabled: bool
    tensorboard_enabled: bool
    mlflow_enabled: bool
    wandb: dict[str, Any]
    monitor_gpus: bool
    gpu_monitoring: dict[str, Any]
    num_val_samples_to_print: int


class ClusterSchema(_Open):
    gpus_per_node: int
    num_nodes: int


class CheckpointingSchema(_Open):
    enabled: bool
    checkpoint_dir: str
    metric_name: str | None
    higher_is_better: bool
    save_period: int


class PolarSchema(BaseModel):
    """Our launcher's own section (`polar:`; NeMo RL's `MasterConfig` keeps it as an extra key and ignores it)."""

    model_config = ConfigDict(extra="forbid")

    harness: Literal[
        "claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi", "mini_swe_agent", "shell"
    ] = "claude_code"
    builder: Literal["per_request", "prefix_merging"] = "prefix_merging"
    gateways: list[str] = Field(default_factory=list)
    admin_timeout_s: float = Field(default=30.0, gt=0)
    polar_calls_patch: bool = False


class MasterConfigSchema(_Open):
    """A resolved GRPO recipe (NeMo RL's `MasterConfig` at `SCHEMA_COMMIT`) plus our optional `polar:` section."""

    policy: PolicySchema
    loss_fn: LossFnSchema
    env: EnvSchema
    data: DataSchema
    grpo: GRPOSchema
    logger: LoggerSchema
    cluster: ClusterSchema
    checkpointing: CheckpointingSchema
    reward_penalties: dict[str, Any] | None = None
    data_plane: dict[str, Any] | None = None
    on_policy_distillation: dict[str, Any] | None = None
    polar: PolarSchema = Field(default_factory=PolarSchema)

    @model_validator(mode="after")
    def _gym_path_rules(self) -> MasterConfigSchema:
        """Refuse what NeMo RL's Gym path cannot deliver, instead of training on a silently truncated session."""
        env = self.env.model_dump()
        if not env.get("should_use_nemo_gym"):
            return self
        problems = []
        if self.polar.builder == "per_request":
            problems.append(
                "polar.builder=per_request: NeMo RL's Gym path takes one contiguous chain per sample, so only the "
                "first model call of each session would be trained; use polar.builder=prefix_merging"
            )
        agent = (((env.get("nemo_gym") or {}).get("polar_agent") or {}).get("responses_api_agents") or {}).get(
            "polar_agent"
        ) or {}
        if self.polar.harness == "shell" and not (agent.get("agent_options") or {}).get("command_line"):
            problems.append(
                "polar.harness=shell needs env.nemo_gym.polar_agent.responses_api_agents.polar_agent.agent_options."
                "command_line (the agent command to run); without it every session fails"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _async_grpo_rules(self) -> MasterConfigSchema:
        if self.grpo.async_grpo is not None and self.grpo.async_grpo.enabled:
            problems = []
            if not self.loss_fn.use_importance_sampling_correction:
                problems.append("loss_fn.use_importance_sampling_correction must be true")
            gen = self.policy.generation
            if (
                gen is not None
                and gen.backend == "vllm"
                and gen.vllm_cfg is not None
                and not gen.vllm_cfg.async_engine
            ):
                problems.append("policy.generation.vllm_cfg.async_engine must be true")
            if problems:
                raise ValueError("grpo.async_grpo.enabled=true: " + "; ".join(problems))
        return self


def validate_recipe(config: dict[str, Any]) -> MasterConfigSchema:
    """Validate a resolved recipe; raises `pydantic.ValidationError` listing every problem."""
    return MasterConfigSchema.model_validate(config)
