# SPDX-License-Identifier: Apache-2.0
"""The C scan of vLLM's SSE lines (_sse_scan.c); optional: vllm_stream.py falls back to its regex without it."""

from typing import Any

from typing_extensions import Buffer

def lines(block: Buffer, /) -> list[tuple[bytes, ...]]:
    """Exactly `vllm_stream._LINE.findall(block)`: one 8-tuple per `data:` line."""

def segments(block: Buffer, /) -> list[Any]:
    """Exactly `vllm_stream._segments_py(block)` (other lines' text and runs' columns), but each run's rows given
    as the slice of `block` that holds them."""

def answer_logprobs(answer: Buffer, ids: bool = False, /) -> tuple[bytes, int, bytes | None] | None:
    """A non-streamed vLLM chat answer (or a streamed chunk) with the n entries of `choices[0].logprobs.content`
    replaced by their logprob numbers and, with `ids`, the top-level `prompt_token_ids` emptied; returns it, n (0: no
    entries cut) and those ids packed as little-endian int32 (None: not cut); None when nothing was cut or it is not
    an answer it can be sure of (see `vllm.fast_answer`)."""
