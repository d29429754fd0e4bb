# SPDX-License-Identifier: Apache-2.0
"""CALL-CREDIT inside NeMo RL training: ω co-evolution with checkpointed state, IG damping as a loss weight, the RV
self-correction reward, the counterfactual budget check and the training metrics (docs/call_credit.md).

`TrainingState` holds what the estimator carries across steps (the `coevolution.CoevolutionState`) and applies the
per-step pieces the `call_credit.training:` options switch on (`options.TrainingOptions`). The checkpoint hooks wrap
NeMo RL's `CheckpointManager`: `init_tmp_checkpoint` also writes the tracked estimator's state as
`call_credit_state.json` into the new checkpoint directory (NeMo RL renames the whole directory when it finalizes),
and `get_latest_checkpoint_path` remembers the directory a run resumes from, so `restore()` (called by `install()`'s
factory wrapper when the estimator is built, after NeMo RL's setup looked the checkpoint up) loads the state back.

Does not: import `nemo_rl` at module level, or change NeMo RL's files.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Hashable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import torch
from nemo_polar.credit import coevolution
from nemo_polar.credit.coevolution import CoevolutionState
from nemo_polar.credit.config import CallCreditConfig
from nemo_polar.credit.curation import sampling_weights
from nemo_polar.credit.graph import CallGraph
from nemo_polar.credit.metrics import training_metrics
from nemo_polar.credit.propagation import CreditAssignment, rv_rewards

from nemo_polar.errors import PolarError

from .options import TrainingOptions
from .wrapping import Wrapper, is_wrapped, unwrap, wrap

log = logging.getLogger(__name__)

STATE_FILE = "call_credit_state.json"
RV_REWARD_COLUMN = "call_credit_rv_reward"
CHECKPOINT_MODULE = "nemo_rl.utils.checkpoint"
_WRAPPED_FLAG = "__call_credit_checkpoint_wrapped__"
_resume: list[str | None] = [None]


class TrainingOptionError(PolarError, ValueError):
    """A `call_credit.training` / `counterfactual` option asks for something this trainer cannot do."""


def check_counterfactual(config: CallCreditConfig) -> None:
    """Refuse a per-step counterfactual budget the NeMo RL path cannot spend (0, the default, passes).

    Raises:
        TrainingOptionError: budget > 0 without `counterfactual.rollout_url`, or with one (NeMo RL's rows carry no
            proxy session records to replay, so `select_calls`/`calibrate` have nothing to run here yet).
    """
    cf = config.counterfactual
    if cf.budget <= 0:
        return
    if not cf.rollout_url:
        raise TrainingOptionError(
            f"call_credit.counterfactual.budget={cf.budget} needs call_credit.counterfactual.rollout_url (the rollout "
            "server that replays sessions); set it or leave the budget at 0"
        )
    raise TrainingOptionError(
        f"call_credit.counterfactual.budget={cf.budget} with rollout_url={cf.rollout_url!r}: replaying NeMo RL batch "
        "rows is not wired (the rows carry no proxy session records); calibrate offline with "
        "`polar credit RUN_DIR --counterfactual URL --budget N` and leave the training budget at 0"
    )


def check_master_config(estimator: Any, master_config: Any) -> None:
    """Refuse `ig_damping: sample` where the synchronous trainer would drop the weight silently.

    Sync GRPO builds `train_data["sample_mask"]` from the batch's `loss_multiplier` tensor (which the damping scales
    in place), but with `grpo.seq_logprob_error_threshold` set it replaces that tensor by a new one before the
    estimator runs; async GRPO passes its current `sample_mask` to `compute_advantage`, so it is always reached.
    """
    from .options import get_key

    state = getattr(estimator, "training_state", None)
    if not isinstance(state, TrainingState) or state.options.ig_damping != "sample":
        return
    grpo_cfg = get_key(master_config, "grpo")
    threshold = get_key(grpo_cfg, "seq_logprob_error_threshold")
    async_enabled = bool(get_key(get_key(grpo_cfg, "async_grpo"), "enabled", False))
    if threshold is not None and not async_enabled:
        raise TrainingOptionError(
            "call_credit.training.ig_damping='sample' with grpo.seq_logprob_error_threshold set on synchronous GRPO: "
            "NeMo RL replaces sample_mask before computing advantages, so the damping weight would not reach the "
            "loss; unset the threshold, use async GRPO, or ig_damping: off"
        )


def group_ids(prompt_ids: torch.Tensor) -> list[int]:
    """GRPO groups: rows with identical prompt ids share an id."""
    _, inverse = torch.unique(prompt_ids.detach().to("cpu"), dim=0, return_inverse=True)
    return [int(i) for i in inverse]


class TrainingState:
    """Per-run CALL-CREDIT training state and per-step extras for `CallCreditAdvantageEstimator`."""

    def __init__(self, options: TrainingOptions, config: CallCreditConfig) -> None:
        check_counterfactual(config)
        self.options = options
        self.config = config
        self.coevolution: CoevolutionState | None = CoevolutionState.initial(config) if options.coevolution else None

    # -- ω -------------------------------------------------------------------------------------------------------

    def omega(self) -> dict[str, float] | None:
        """ω for this step's propagation (None: the configured one)."""
        return dict(self.coevolution.omega) if self.coevolution is not None else None

    def after_step(
        self, graphs: Sequence[CallGraph], rewards: Sequence[float], groups: Sequence[Hashable] | None
    ) -> None:
        """Adapt ω from this step's trajectories (no-op unless `training.coevolution`)."""
        if self.coevolution is not None:
            self.coevolution = coevolution.step(self.coevolution, graphs, rewards, self.config, group_ids=groups)

    # -- RV reward -----------------------------------------------------------------------------------------------

    def rv_call_rewards(self, graph: CallGraph) -> torch.Tensor | None:
        """r_RV per call of one row when `training.rv_reward` is on, else None."""
        return rv_rewards(graph, self.config.curation) if self.options.rv_reward else None

    def add_rv_reward(
        self, rewards: torch.Tensor, per_call: Sequence[torch.Tensor | None], repeated_batch: Any
    ) -> torch.Tensor:
        """rewards + λ·Σ_k r_RV(k) per row; the added amount is written to the batch column `call_credit_rv_reward`."""
        if not self.options.rv_reward:
            return rewards
        added = torch.tensor(
            [self.options.rv_reward_scale * float(r.sum()) if r is not None else 0.0 for r in per_call],
            dtype=torch.float32,
        )
        if isinstance(repeated_batch, MutableMapping):
            repeated_batch[RV_REWARD_COLUMN] = added
        return rewards.detach().to("cpu", torch.float32) + added

    # -- IG damping ----------------------------------------------------------------------------------------------

    def sample_weights(
        self, graphs: Sequence[CallGraph], assignments: Sequence[CreditAssignment], n_tokens: Sequence[Sequence[int]]
    ) -> list[float]:
        """Per-row loss weight: the token-weighted mean of `curation.sampling_weights` over the row's call tokens
        (what `fusion.sample_weights` gives when the calls cover the trainable tokens), 1 for a row without calls."""
        out = []
        for graph, assignment, toks in zip(graphs, assignments, n_tokens, strict=True):
            total = float(sum(toks))
            if not graph.nodes or total <= 0:
                out.append(1.0)
                continue
            w = sampling_weights(graph, assignment, self.config.curation)
            out.append(float(sum(float(w[k]) * t for k, t in enumerate(toks)) / total))
        return out

    def apply_damping(self, weights: Sequence[float], repeated_batch: Any, sample_mask: Any) -> bool:
        """Multiply NeMo RL's per-row loss weight in place (no-op unless `training.ig_damping == 'sample'`).

        The tensor is `sample_mask` when the trainer passes it (async GRPO), else `repeated_batch["loss_multiplier"]`
        (sync GRPO builds `train_data["sample_mask"]` from that very tensor before computing advantages).
        ClippedPGLossFn multiplies every token's loss by it (and normalises by the weighted token count).
        """
        if self.options.ig_damping != "sample":
            return False
        target = sample_mask if isinstance(sample_mask, torch.Tensor) else None
        if target is None and isinstance(repeated_batch, Mapping) and "loss_multiplier" in repeated_batch:
            target = repeated_batch["loss_multiplier"]
        if not isinstance(target, torch.Tensor):
            raise TrainingOptionError(
                "call_credit.training.ig_damping='sample' needs the batch's loss_multiplier (or sample_mask=) tensor"
            )
        if not target.is_floating_point():
            raise TrainingOptionError(f"loss_multiplier must be a float tensor to carry weights, got {target.dtype}")
        target.mul_(torch.tensor(list(weights), dtype=target.dtype, device=target.device))
        return True

    # -- metrics -------------------------------------------------------------------------------------------------

    def metrics(
        self, graphs: Sequence[CallGraph], assignments: Sequence[CreditAssignment], weights: Sequence[float] | None
    ) -> dict[str, float]:
        """`metrics.training_metrics` plus ω and the damping weights (flat scalars for the logger)."""
        out = training_metrics(graphs, assignments, self.config.metrics)
        if self.coevolution is not None:
            for role, value in self.coevolution.omega.items():
                out[f"call_credit/omega/{role}"] = float(value)
            out["call_credit/coevolution_step"] = float(self.coevolution.step)
        if weights:
            out["call_credit/ig_damping/mean_sample_weight"] = sum(weights) / len(weights)
            out["call_credit/ig_damping/damped_rows"] = float(sum(1 for w in weights if w < 1.0))
        return out

    # -- state ---------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"coevolution": self.coevolution.to_dict() if self.coevolution is not None else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved = state.get("coevolution")
        if saved is not None and self.options.coevolution:
            self.coevolution = CoevolutionState.from_dict(saved)

    def save(self, checkpoint_dir: str | Path) -> Path:
        """Write `call_credit_state.json` into `checkpoint_dir` (atomically)."""
        path = Path(checkpoint_dir) / STATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.state_dict(), indent=2, sort_keys=True))
        tmp.replace(path)
        return path

    def load(self, checkpoint_dir: str | Path) -> bool:
        """Load `call_credit_state.json` from `checkpoint_dir`; False when the checkpoint has none."""
        path = Path(checkpoint_dir) / STATE_FILE
        if not path.is_file():
            return False
        self.load_state_dict(json.loads(path.read_text()))
        return True


# -- NeMo RL checkpoint hooks -----------------------------------------------------------------------------------


def _tracked_state() -> TrainingState | None:
    from .sync_metrics import tracked

    state = getattr(tracked(), "training_state", None)
    return state if isinstance(state, TrainingState) else None


def _checkpoint_module(checkpoint_module: Any) -> Any:
    """`checkpoint_module`, else NeMo RL's checkpoint module; None when that is not importable."""
    try:
        return checkpoint_module or importlib.import_module(CHECKPOINT_MODULE)
    except ImportError:
        return None


def _saving_state(init_tmp: Wrapper) -> Wrapper:
    def init_tmp_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        path = init_tmp(self, *args, **kwargs)
        state = _tracked_state()
        if state is not None:
            state.save(path)
        return path

    return init_tmp_checkpoint


def _remembering_resume(latest: Wrapper) -> Wrapper:
    def get_latest_checkpoint_path(self: Any) -> Any:
        path = latest(self)
        _resume[0] = None if path is None else str(path)
        return path

    return get_latest_checkpoint_path


def install_checkpoint_hooks(checkpoint_module: Any = None) -> bool:
    """Wrap `CheckpointManager.init_tmp_checkpoint` (save) and `get_latest_checkpoint_path` (remember the resume
    directory) of NeMo RL's checkpoint module; idempotent. False when the module is not importable."""
    module = _checkpoint_module(checkpoint_module)
    if module is None:
        return False
    manager = module.CheckpointManager
    if is_wrapped(manager.init_tmp_checkpoint, _WRAPPED_FLAG):
        return True
    # the resume hook first: a manager without it raises before anything is patched
    wrap(manager, "get_latest_checkpoint_path", _remembering_resume, _WRAPPED_FLAG)
    wrap(manager, "init_tmp_checkpoint", _saving_state, _WRAPPED_FLAG)
    return True


def uninstall_checkpoint_hooks(checkpoint_module: Any = None) -> None:
    """Put NeMo RL's `CheckpointManager` methods back (no-op when not installed or not importable)."""
    module = _checkpoint_module(checkpoint_module)
    if module is None:
        return
    for name in ("init_tmp_checkpoint", "get_latest_checkpoint_path"):
        unwrap(module.CheckpointManager, name, _WRAPPED_FLAG)


def restore(estimator: Any, checkpoint_dir: str | Path | None = None) -> bool:
    """Load the estimator's training state from `checkpoint_dir` (default: the directory NeMo RL resumed from)."""
    state = getattr(estimator, "training_state", None)
    where = checkpoint_dir if checkpoint_dir is not None else _resume[0]
    if not isinstance(state, TrainingState) or where is None:
        return False
    loaded = state.load(where)
    if loaded:
        log.info("CALL-CREDIT: training state restored from %s", where)
    return loaded
