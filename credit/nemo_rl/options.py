# SPDX-License-Identifier: Apache-2.0
"""The estimator's options, read from whatever NeMo RL hands over (dict, pydantic model, OmegaConf node).

Does: turn `grpo.adv_estimator` (a plain dict in NeMo RL v0.6/0.7, an `AdvEstimatorConfig` pydantic model
with extra keys at the pinned commit, an OmegaConf node in tests) into a validated `EstimatorOptions`, with
every error reported at once. The `call_credit:` block carries the CALL-CREDIT options, `alpha` included.
Does not: import `nemo_rl`, or compute anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ESTIMATOR_TARGET = "nemo_polar.credit.nemo_rl.CallCreditAdvantageEstimator"
ESTIMATOR_NAME = "call_credit"


def as_plain(obj: Any) -> Any:
    """A config object as plain Python data (dicts/lists/scalars), whatever its kind.

    Handles dicts, pydantic models (extra keys included), OmegaConf nodes, and objects with `__dict__`.
    """
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): as_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_plain(v) for v in obj]
    if isinstance(obj, BaseModel):
        # model_dump keeps extra="allow" keys (`_target_`, `call_credit`) next to the declared fields
        return as_plain(obj.model_dump())
    if type(obj).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return as_plain(OmegaConf.to_container(obj, resolve=True))
    if hasattr(obj, "__dict__"):
        return {k: as_plain(v) for k, v in vars(obj).items() if not k.startswith("__")}
    return obj


def get_key(obj: Any, key: str, default: Any = None) -> Any:
    """`obj[key]` for mappings, `getattr(obj, key)` otherwise (pydantic extras included); `default` if absent."""
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    value = getattr(obj, key, default)
    if value is default and isinstance(obj, BaseModel):
        extra = obj.model_extra or {}
        return extra.get(key, default)
    return value


class TrainingOptions(BaseModel):
    """`call_credit.training:` — the CALL-CREDIT pieces beyond the fused advantage (`training_state.py`).

    `coevolution`: adapt ω_role after every step (`coevolution.step`, the core's `coevolution:` block), the state
    saved with NeMo RL's checkpoint and restored from it; `ig_damping`: `sample` multiplies each row's
    `sample_mask` (NeMo RL's `loss_multiplier`) by the mean per-token IG damping weight
    (`curation.sampling_weights` → `fusion.sample_weights`), so ClippedPGLossFn weighs the row's loss by it;
    `rv_reward`: add λ·Σ r_RV of a row (λ = `rv_reward_scale`) to its reward before Â_τ, recorded in the batch
    column `call_credit_rv_reward`. The per-step counterfactual budget is the core's `counterfactual.budget`.
    """

    model_config = ConfigDict(extra="forbid")

    coevolution: bool = False
    ig_damping: Literal["off", "sample"] = "off"
    rv_reward: bool = False
    rv_reward_scale: float = 1.0


class CallCreditOptions(BaseModel):
    """The `call_credit:` block under `grpo.adv_estimator` (CALL-CREDIT, docs/call_credit.md).

    Own keys: `alpha` fuses GRPO's token advantage with the call credit, Ã_t = α·A_t^GRPO + (1−α)·Â_{v(t)}
    (shorthand for the core's `fusion.alpha`; giving both with different values is an error);
    `annotations` chooses where per-call roles and parents come from: `auto` (the `polar_calls` batch column
    when a row has it, else decoding with the policy tokenizer), `polar_calls` (required), `decode` (always);
    `tokenizer` defaults to `policy.tokenizer.name` (filled in by `install()`); `harness` picks the core's
    tool-name table for decoded calls (None: the generic one); `training` switches on ω co-evolution, IG damping
    and the RV reward inside training (`TrainingOptions`).
    Every other key is the CALL-CREDIT core's `CallCreditConfig` (`roles`, `graph`, `propagation`, `fusion`, …),
    validated by it: e.g. `propagation: {gamma: 0.95, omega: {AE: 1.0, IG: 0.6, RV: 0.3, OTHER: 0.1}}`.
    Â_τ always follows NeMo RL's GRPO (`normalize_rewards`, `use_leave_one_out_baseline` of `adv_estimator`);
    the core's `propagation.baseline / normalize_std / std_eps` do not apply inside NeMo RL.
    """

    model_config = ConfigDict(extra="allow")

    alpha: float | None = Field(default=None, ge=0.0, le=1.0)
    annotations: Literal["auto", "polar_calls", "decode"] = "auto"
    tokenizer: str | None = None
    harness: str | None = None
    training: TrainingOptions = Field(default_factory=TrainingOptions)

    def core_block(self) -> dict[str, Any]:
        """The core's part of the block, with `alpha` written into `fusion.alpha`."""
        block = {k: v for k, v in (self.model_extra or {}).items()}
        if self.alpha is not None:
            fusion = dict(block.get("fusion") or {})
            if "alpha" in fusion and float(fusion["alpha"]) != self.alpha:
                raise ValueError(
                    f"call_credit.alpha={self.alpha} disagrees with call_credit.fusion.alpha={fusion['alpha']}"
                )
            fusion["alpha"] = self.alpha
            block["fusion"] = fusion
        return block


class EstimatorOptions(BaseModel):
    """`grpo.adv_estimator` as this estimator reads it (unknown top-level keys are NeMo RL's and are ignored)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = "grpo"
    target: str | None = Field(default=None, alias="_target_")
    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = True
    call_credit: CallCreditOptions = Field(default_factory=CallCreditOptions)

    @field_validator("call_credit", mode="before")
    @classmethod
    def _empty_block(cls, value: Any) -> Any:
        return {} if value is None else value  # `call_credit:` with nothing under it in YAML

    def core_config(self) -> Any:
        """The CALL-CREDIT core's `CallCreditConfig` for this block (validated)."""
        from .core import validate_core_options

        return validate_core_options(self.call_credit.core_block())


def read_options(estimator_config: Any) -> EstimatorOptions:
    """Validate `grpo.adv_estimator` (dict, pydantic model or OmegaConf node) into `EstimatorOptions`.

    Raises:
        pydantic.ValidationError: listing every invalid key at once (own keys, then the core's).
    """
    plain = as_plain(estimator_config) or {}
    if not isinstance(plain, dict):
        raise TypeError(f"grpo.adv_estimator must be a mapping, got {type(estimator_config).__name__}")
    options = EstimatorOptions.model_validate(plain)
    options.core_config()  # validate the core keys now, not at the first step
    return options


def selects_call_credit(estimator_config: Any) -> bool:
    """True when `grpo.adv_estimator` asks for this estimator (`_target_` or `name: call_credit`)."""
    return get_key(estimator_config, "_target_") == ESTIMATOR_TARGET or get_key(estimator_config, "name") == (
        ESTIMATOR_NAME
    )
