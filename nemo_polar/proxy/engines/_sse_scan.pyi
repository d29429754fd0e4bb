# SPDX-License-Identifier: Apache-2.0
"""The C scan of vLLM's SSE lines (_sse_scan.c); optional: vllm_stream.py falls back to its regex without it."""

def lines(block: bytes, /) -> list[tuple[bytes, ...]]:
    """Exactly `vllm_stream._LINE.findall(block)`: one 8-tuple per `data:` line."""
