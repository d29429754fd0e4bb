# SPDX-License-Identifier: Apache-2.0
"""A reproduction of NeMo RL's contiguity rule for NeMo Gym rollout records (docs/nemo.md).

NeMo RL (`nemo_rl/environments/nemo_gym.py`, `_postprocess_nemo_gym_to_nemo_rl_result`) walks
`response.output`, skips items without (or with empty) `generation_token_ids`, and for every other item asserts
that the tokens seen so far are a prefix of its `prompt_token_ids` ("Non-contiguous messages found!"); then it
appends a user message (the new prompt tokens) and an assistant message (the generation, with its logprobs) and
extends the seen tokens with both. This module does the same on plain lists, plus the per-call shape checks NeMo RL
relies on implicitly (equal generation / logprob lengths, integer ids), and returns the message log it builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NonContiguous", "to_message_log"]


class NonContiguous(AssertionError):
    """Raised where NeMo RL raises "Non-contiguous messages found!"."""


def to_message_log(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    seen: list[int] = []
    log: list[dict[str, Any]] = []
    for k, item in enumerate(record["response"]["output"]):
        gen = item.get("generation_token_ids")
        if not gen:
            continue
        prompt = item["prompt_token_ids"]
        logprobs = item["generation_log_probs"]
        if not all(isinstance(t, int) for t in [*prompt, *gen]):
            raise NonContiguous(f"output[{k}]: token ids must be integers")
        if len(logprobs) != len(gen):
            raise NonContiguous(f"output[{k}]: {len(gen)} generation ids but {len(logprobs)} logprobs")
        if prompt[: len(seen)] != seen:
            raise NonContiguous(
                f"Non-contiguous messages found! output[{k}]: the prompt does not start with the {len(seen)} "
                "tokens seen so far"
            )
        log.append({"role": "user", "content": "", "token_ids": prompt[len(seen) :]})
        log.append({"role": "assistant", "content": "", "token_ids": list(gen), "generation_logprobs": list(logprobs)})
        seen.extend(log[-2]["token_ids"])
        seen.extend(gen)
    return log
