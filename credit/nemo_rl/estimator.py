# SPDX-License-Identifier: Apache-2.0
"""`CallCreditAdvantageEstimator`: CALL-CREDIT as a NeMo RL GRPO advantage estimator.

NeMo RL's estimator contract is duck-typed (docs/nemo.md): `__init__(estimator_config, loss_config)` and
`compute_advantage(prompt_ids, rewards, mask, repeated_batch=None, logprobs_policy=None,
logprobs_reference=None, **kwargs) -> Tensor[B, S]`. This one returns, per token t of call v(t),
Ã_t = α·Â_τ + (1−α)·Â_{v(t)} — GRPO's token advantage is Â_τ on every token of the row — as a CPU, detached,
float32 tensor of exactly `mask.shape`, zero where `mask == 0`, without touching its inputs. It reads its
options from a dict or a pydantic model (`grpo.adv_estimator`, `call_credit:` block; see `options.py`), finds
the calls in `repeated_batch["message_log"]` (`layout.py`) and fails loudly without it, takes roles and parents
from a `polar_calls` column or by decoding the calls with the policy tokenizer (`annotations.py`), applies the
`call_credit.training` pieces (ω co-evolution, IG damping on the row's loss weight, RV reward; `training_state.py`),
and leaves `last_metrics` (the core's `training_metrics` included) for both GRPO paths to log.

Does not: import `nemo_rl` (it is selected by `install()`), or load a tokenizer before one is needed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from . import core
from .annotations import AnnotationError, CallAnnotation, Classifier, DecodedCall
from .annotations import from_polar_calls as annotations_from_polar_calls
from .baseline import grpo_sequence_advantages
from .layout import RowLayout, batch_layout, segment_token_ids
from .options import EstimatorOptions, read_options
from .training_state import TrainingState, group_ids

log = logging.getLogger(__name__)

Decoder = Callable[[list[int]], str]


def decoder_for(tokenizer: Any) -> Decoder:
    """A `ids -> text` function for a `tokenizers.Tokenizer` or a transformers tokenizer (special tokens kept)."""

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    return decode


def load_decoder(name_or_path: str) -> Decoder:
    """Load the policy tokenizer: a `tokenizer.json` file or directory via `tokenizers`, else transformers."""
    path = Path(name_or_path).expanduser()
    candidate = path / "tokenizer.json" if path.is_dir() else path
    if candidate.is_file() and candidate.suffix == ".json":
        from tokenizers import Tokenizer

        return decoder_for(Tokenizer.from_file(str(candidate)))
    from transformers import AutoTokenizer

    return decoder_for(AutoTokenizer.from_pretrained(name_or_path))


class CallCreditAdvantageEstimator:
    """CALL-CREDIT advantages for NeMo RL's GRPO (selected by `install()` from `grpo.adv_estimator`)."""

    def __init__(
        self,
        estimator_config: Any,
        loss_config: Any = None,
        *,
        decoder: Decoder | None = None,
        tokenizer: Any = None,
        classifier: Classifier | None = None,
    ) -> None:
        self.options: EstimatorOptions = read_options(estimator_config)
        self.config = self.options.core_config()  # the CALL-CREDIT core's CallCreditConfig
        self.alpha = float(self.config.fusion.alpha)
        self.unspanned = str(getattr(self.config.fusion, "unspanned", "trajectory"))
        self.loss_config = loss_config
        self._decoder = decoder if decoder is not None else (decoder_for(tokenizer) if tokenizer is not None else None)
        self._classifier = classifier
        self.last_metrics: dict[str, float] = {}
        self.last_annotations: list[list[CallAnnotation]] = []
        self.last_call_credit: list[list[float]] = []
        self.last_sample_weights: list[float] | None = None
        # ω co-evolution, IG damping, RV reward, counterfactual budget check (training_state.py)
        self.training_state = TrainingState(self.options.call_credit.training, self.config)

    # -- the contract ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What the estimator carries across steps (ω co-evolution), for NeMo RL's checkpoint."""
        return self.training_state.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.training_state.load_state_dict(state)

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        repeated_batch: Any = None,
        logprobs_policy: torch.Tensor | None = None,
        logprobs_reference: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Token advantages Ã for the batch.

        Args:
            prompt_ids: [B, P] prompt token ids; identical rows form one GRPO group.
            rewards: [B] rewards.
            mask: [B, S] token_loss_mask · sample_mask; the output is zero where it is 0.
            repeated_batch: NeMo RL's batch; needs `message_log` (one message list per row), may carry
                `polar_calls` (one list of per-call annotations per row).
            logprobs_policy, logprobs_reference, **kwargs: accepted for the contract, unused.

        Returns:
            [B, S] float32 CPU tensor, detached.
        """
        if mask.dim() != 2:
            raise ValueError(f"mask must be [B, S], got shape {tuple(mask.shape)}")
        batch, seq_len = mask.shape
        if rewards.shape[0] != batch or prompt_ids.shape[0] != batch:
            raise ValueError(
                f"batch sizes differ: mask {batch}, rewards {rewards.shape[0]}, prompt_ids {prompt_ids.shape[0]}"
            )
        layouts = batch_layout(repeated_batch, batch, seq_len)
        annotations, from_column = self._annotate(repeated_batch, layouts)
        n_tokens = [[c.end - c.start for c in layout.calls] for layout in layouts]
        graphs = [core.row_graph(anns, toks) for anns, toks in zip(annotations, n_tokens, strict=True)]
        state = self.training_state
        rv = [state.rv_call_rewards(g) for g in graphs]
        rewards_used = state.add_rv_reward(rewards, rv, repeated_batch)
        adv_tau = grpo_sequence_advantages(
            prompt_ids,
            rewards_used,
            leave_one_out=self.options.use_leave_one_out_baseline,
            normalize=self.options.normalize_rewards,
        )
        omega = state.omega()

        alpha = self.alpha
        out = torch.zeros((batch, seq_len), dtype=torch.float32)
        in_call = torch.zeros((batch, seq_len), dtype=torch.bool)
        credits: list[list[float]] = []
        assignments = []
        for layout, graph, rv_row in zip(layouts, graphs, rv, strict=True):
            a_tau = float(adv_tau[layout.row])
            assignment = core.row_assignment(
                graph, a_tau, float(rewards_used[layout.row]), self.config, omega=omega, rv_reward=rv_row
            )
            assignments.append(assignment)
            credit = [float(c) for c in assignment.credit]
            credits.append(credit)
            # trainable tokens outside every call (none in NeMo RL's layout) use Â_τ or 0 as their call credit
            outside = a_tau if self.unspanned == "trajectory" else 0.0
            out[layout.row, :] = alpha * a_tau + (1.0 - alpha) * outside
            for call, c in zip(layout.calls, credit, strict=True):
                out[layout.row, call.start : call.end] = alpha * a_tau + (1.0 - alpha) * c
                in_call[layout.row, call.start : call.end] = True
        valid = mask.detach().to("cpu") != 0
        out = torch.where(valid, out, torch.zeros((), dtype=out.dtype))
        weights = None
        if state.options.ig_damping != "off":
            weights = state.sample_weights(graphs, assignments, n_tokens)
            state.apply_damping(weights, repeated_batch, kwargs.get("sample_mask"))
        self.last_annotations = annotations
        self.last_call_credit = credits
        self.last_sample_weights = weights
        self.last_metrics = self._metrics(annotations, credits, from_column, int((valid & ~in_call).sum()))
        self.last_metrics.update(state.metrics(graphs, assignments, weights))
        state.after_step(graphs, [float(r) for r in rewards_used], group_ids(prompt_ids))
        return out

    # -- annotations ----------------------------------------------------------------------------------------

    def _annotate(self, repeated_batch: Any, layouts: Sequence[RowLayout]) -> tuple[list[list[CallAnnotation]], int]:
        mode = self.options.call_credit.annotations
        column = _column(repeated_batch, "polar_calls") if mode != "decode" else None
        if mode == "polar_calls" and column is None:
            raise AnnotationError(
                "call_credit.annotations is 'polar_calls' but the batch has no polar_calls column; "
                "set polar.polar_calls_patch: true in the recipe (launcher) or use annotations: auto"
            )
        out: list[list[CallAnnotation]] = []
        from_column = 0
        for layout in layouts:
            entries = column[layout.row] if column is not None else None
            if entries is not None:
                out.append(annotations_from_polar_calls(entries, len(layout.calls), layout.row))
                from_column += 1
            elif mode == "polar_calls":
                raise AnnotationError(f"row {layout.row} has no polar_calls entry")
            else:
                out.append(self._decode_row(repeated_batch["message_log"][layout.row], layout))
        return out, from_column

    def _decode_row(self, messages: Sequence[Mapping[str, Any]], layout: RowLayout) -> list[CallAnnotation]:
        if not layout.calls:
            return []
        decode = self._get_decoder()
        calls = [
            DecodedCall(
                action=decode(segment_token_ids(messages, c.start, c.end)),
                observation=decode(segment_token_ids(messages, c.obs_start, c.obs_end)),
            )
            for c in layout.calls
        ]
        if self._classifier is not None:
            annotations = self._classifier(calls)
        else:
            annotations = core.classify_decoded(calls, self.config, self.options.call_credit.harness)
        if len(annotations) != len(calls):
            raise AnnotationError(f"the classifier returned {len(annotations)} annotations for {len(calls)} calls")
        return annotations

    def _get_decoder(self) -> Decoder:
        if self._decoder is None:
            name = self.options.call_credit.tokenizer
            if not name:
                raise AnnotationError(
                    "decoding calls needs the policy tokenizer: set grpo.adv_estimator.call_credit.tokenizer "
                    "(install() fills it from policy.tokenizer.name) or pass decoder=/tokenizer="
                )
            log.info("CALL-CREDIT: loading tokenizer %s to decode calls", name)
            self._decoder = load_decoder(name)
        return self._decoder

    # -- metrics --------------------------------------------------------------------------------------------

    def _metrics(
        self,
        annotations: Sequence[Sequence[CallAnnotation]],
        credits: Sequence[Sequence[float]],
        from_column: int,
        outside: int,
    ) -> dict[str, float]:
        rows = max(len(annotations), 1)
        calls = [a for row in annotations for a in row]
        roles = Counter(a.role for a in calls)
        metrics = {
            "call_credit/alpha": self.alpha,
            "call_credit/calls_per_sample/mean": len(calls) / rows,
            "call_credit/rows_annotated_from_polar_calls": from_column / rows,
            "call_credit/masked_tokens_outside_calls": float(outside),
        }
        by_role: dict[str, list[float]] = {}
        for row_anns, row_credit in zip(annotations, credits, strict=True):
            for ann, credit in zip(row_anns, row_credit, strict=True):
                by_role.setdefault(ann.role, []).append(credit)
        for role in ("IG", "AE", "RV", "OTHER"):
            metrics[f"call_credit/role_share/{role}"] = roles.get(role, 0) / max(len(calls), 1)
            values = by_role.get(role, [])
            metrics[f"call_credit/credit/{role}/mean"] = sum(values) / len(values) if values else 0.0
        return metrics


def _column(repeated_batch: Any, key: str) -> Sequence[Any] | None:
    try:
        if key in repeated_batch:
            value = repeated_batch[key]
            return value if value is not None else None
    except TypeError:
        return None
    return None
