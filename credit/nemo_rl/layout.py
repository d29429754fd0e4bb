# SPDX-License-Identifier: Apache-2.0
"""Where each model call sits in a NeMo RL row: `repeated_batch["message_log"]` → call segments.

NeMo RL's layout (pinned commit, `nemo_rl/environments/nemo_gym.py` and `grpo.py`): row i of the batch is
`message_log[i]`, a list of messages, each with `role`, `token_ids` (1-D), and — by the time the estimator
runs — `token_loss_mask` and `generation_logprobs`. Flattening concatenates `token_ids` in order and pads
on the right, so a message's flat position is the running sum of the lengths before it, and
`advantages[i, t]` weights token `input_ids[i, t]`. Gym rows alternate `user` (the prompt delta: tool
outputs plus template glue) and `assistant` (one model call) messages with `content == ""`.

A generated call is a message whose `token_loss_mask` has a non-zero entry (every message carries zero
`generation_logprobs` by then, so that key says nothing). Without `token_loss_mask` (a batch taken before
NeMo RL adds it) the pinned rule is used: an `assistant` message carrying `generation_logprobs`.
The observation of call k is every non-generated message between call k and call k+1 (or the row's end).

Does: compute `RowLayout`s. Does not: decode, classify, or touch advantages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nemo_polar.errors import PolarError


class LayoutError(PolarError, ValueError):
    """The batch is not in NeMo RL's message_log layout (missing key, wrong shapes, rows too long)."""


@dataclass(frozen=True)
class CallSegment:
    """One generated model call of a row: flat token range `[start, end)` and its observation range."""

    call_index: int
    message_index: int
    start: int
    end: int
    obs_start: int
    obs_end: int


@dataclass(frozen=True)
class RowLayout:
    """All calls of one row, in order; `length` is the row's unpadded token count."""

    row: int
    length: int
    calls: tuple[CallSegment, ...]


def _token_ids(message: Mapping[str, Any], row: int, index: int) -> torch.Tensor:
    ids = message.get("token_ids")
    if ids is None:
        raise LayoutError(f"message_log[{row}][{index}] has no token_ids")
    tensor = ids if isinstance(ids, torch.Tensor) else torch.as_tensor(ids)
    if tensor.dim() != 1:
        raise LayoutError(f"message_log[{row}][{index}].token_ids must be 1-D, got shape {tuple(tensor.shape)}")
    return tensor


def is_generated(message: Mapping[str, Any]) -> bool:
    """True for a message the policy generated (one model call)."""
    loss_mask = message.get("token_loss_mask")
    if loss_mask is not None:
        mask = loss_mask if isinstance(loss_mask, torch.Tensor) else torch.as_tensor(loss_mask)
        return bool(mask.any())
    return message.get("role") == "assistant" and "generation_logprobs" in message


def row_layout(messages: Sequence[Mapping[str, Any]], row: int) -> RowLayout:
    """The call segments of one row, from its message list."""
    spans: list[tuple[int, int, bool]] = []  # (start, end, generated) per message
    pos = 0
    for index, message in enumerate(messages):
        n = int(_token_ids(message, row, index).numel())
        spans.append((pos, pos + n, is_generated(message)))
        pos += n
    calls: list[CallSegment] = []
    generated = [i for i, (_, _, g) in enumerate(spans) if g]
    for k, index in enumerate(generated):
        start, end, _ = spans[index]
        nxt = generated[k + 1] if k + 1 < len(generated) else len(spans)
        obs_end = spans[nxt][0] if nxt < len(spans) else pos
        calls.append(CallSegment(k, index, start, end, end, obs_end))
    return RowLayout(row=row, length=pos, calls=tuple(calls))


def batch_layout(repeated_batch: Any, batch_size: int, seq_len: int) -> list[RowLayout]:
    """The layouts of every row; checks the batch has `message_log` with one row per sample that fits `seq_len`.

    Raises:
        LayoutError: `message_log` missing, a row count other than `batch_size`, or a row longer than `seq_len`.
    """
    message_log = None
    if repeated_batch is not None:
        try:
            message_log = repeated_batch["message_log"]
        except (KeyError, TypeError):
            message_log = None
    if message_log is None:
        raise LayoutError(
            "CallCreditAdvantageEstimator needs repeated_batch['message_log'] to find the model calls of each row; "
            "got " + ("no repeated_batch" if repeated_batch is None else f"keys {sorted(map(str, repeated_batch))}")
        )
    if len(message_log) != batch_size:
        raise LayoutError(f"message_log has {len(message_log)} rows, the mask has {batch_size}")
    layouts = [row_layout(messages, i) for i, messages in enumerate(message_log)]
    for layout in layouts:
        if layout.length > seq_len:
            raise LayoutError(f"row {layout.row} has {layout.length} tokens, more than the mask's {seq_len}")
    return layouts


def segment_token_ids(messages: Sequence[Mapping[str, Any]], start: int, end: int) -> list[int]:
    """The flat token ids `[start, end)` of a row (across message boundaries)."""
    out: list[int] = []
    pos = 0
    for index, message in enumerate(messages):
        ids = _token_ids(message, -1, index)
        n = int(ids.numel())
        lo, hi = max(start, pos), min(end, pos + n)
        if lo < hi:
            out.extend(int(t) for t in ids[lo - pos : hi - pos].tolist())
        pos += n
        if pos >= end:
            break
    return out
