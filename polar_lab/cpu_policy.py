# SPDX-License-Identifier: Apache-2.0
"""FAKE policy worker for GRPO steps on CPU: the one thing of NeMo RL's training loop that cannot exist here.

NeMo RL trains through GPU policy workers (DTensor / Megatron); none can start without an accelerator. This class
stands in for one, and only for that: it holds a CPU copy of the policy's Hugging Face weights (the same directory
the vLLM backend serves), computes next-token logprobs for a flattened NeMo RL batch, applies NeMo RL's own loss
function object (e.g. `ClippedPGLossFn` built from the recipe's `loss_fn`) exactly as NeMo RL calls it
(`loss_fn(next_token_logprobs, data, global_valid_seqs, global_valid_toks)`), takes an optimizer step, and saves
the new weights for the generation server to load. Everything around it (batching, masks, advantages, the loss) is
NeMo RL's and the project's real code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class StepResult:
    loss: float
    metrics: dict[str, Any]
    logprob_grad: torch.Tensor  # d loss / d next-token logprobs, [B, T-1]: zero wherever nothing is trained
    grad_norm: float


class FakeCpuPolicyWorker:
    """FAKE NeMo RL policy worker on CPU (a GPU worker cannot exist here): logprobs, loss, optimizer step, save."""

    def __init__(self, model_dir: str | Path, lr: float = 1e-3, seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.version = 1

    def next_token_logprobs(
        self, input_ids: torch.Tensor, where: torch.Tensor | None = None, chunk: int = 512
    ) -> torch.Tensor:
        """log p(token[t+1] | tokens[..t]), [B, T-1]; with `where` ([B, T-1] bool) only at those positions (0 elsewhere).

        The vocabulary projection runs `chunk` positions at a time and is recomputed in backward (activation
        checkpointing): full [B, T, vocab] float32 logits of a real harness session (~18k tokens x 151k vocab)
        would not fit in CPU memory. Positions outside `where` get a constant 0 (no vocabulary projection): a loss
        that masks them leaves their gradient exactly 0, one that does not gives them a non-zero gradient."""
        from torch.utils.checkpoint import checkpoint

        hidden = self.model.model(input_ids=input_ids).last_hidden_state[:, :-1]
        targets = input_ids[:, 1:]
        if where is None:
            where = torch.ones_like(targets, dtype=torch.bool)
        rows, cols = where.nonzero(as_tuple=True)
        h, t = hidden[rows, cols], targets[rows, cols]
        head = self.model.get_output_embeddings()

        def piece(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            logprobs = torch.log_softmax(head(h).float(), dim=-1)
            return logprobs.gather(-1, t.unsqueeze(-1)).squeeze(-1)

        values = [
            checkpoint(piece, h[i : i + chunk], t[i : i + chunk], use_reentrant=False)
            for i in range(0, h.shape[0], chunk)
        ]
        out = torch.zeros(targets.shape, dtype=torch.float32)
        return out.index_put((rows, cols), torch.cat(values) if values else torch.zeros(0))

    def train_data(
        self,
        flat: dict[str, torch.Tensor],
        sample_mask: torch.Tensor,
        advantages: torch.Tensor,
        where: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """NeMo RL's train_data for a flattened batch (`flat`: token_ids, token_loss_mask, generation_logprobs):
        the current policy's logprobs (at `where`, [B, T-1]; everywhere when None) serve as prev and reference
        logprobs, in NeMo RL's [B, T] layout (the loss reads [:, 1:])."""
        with torch.no_grad():
            prev = self.next_token_logprobs(flat["token_ids"], where=where)
        prev = torch.cat([torch.zeros(prev.shape[0], 1), prev], dim=1)
        return {
            "input_ids": flat["token_ids"],
            "token_mask": flat["token_loss_mask"].float(),
            "sample_mask": sample_mask,
            "advantages": advantages,
            "prev_logprobs": prev,
            "generation_logprobs": flat["generation_logprobs"].float(),
            "reference_policy_logprobs": prev,
        }

    def train_step(self, loss_fn: Any, data: dict[str, torch.Tensor]) -> StepResult:
        """One optimizer step on `data` (NeMo RL's train_data keys: input_ids, token_mask, sample_mask, advantages,
        prev_logprobs, generation_logprobs, reference_policy_logprobs)."""
        self.optimizer.zero_grad(set_to_none=True)
        mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
        logprobs = self.next_token_logprobs(data["input_ids"], where=mask != 0)
        logprobs.retain_grad()
        global_valid_toks = mask.sum()
        global_valid_seqs = data["sample_mask"].sum()
        loss, metrics = loss_fn(logprobs, data, global_valid_seqs, global_valid_toks)
        loss.backward()
        assert logprobs.grad is not None
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=1e9)
        self.optimizer.step()
        return StepResult(float(loss.detach()), dict(metrics), logprobs.grad.detach().clone(), float(grad_norm))

    def save(self, out_dir: str | Path) -> Path:
        """The current weights as a Hugging Face model directory (what a generation server loads); bumps version."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(out), safe_serialization=True)
        self.version += 1
        return out
