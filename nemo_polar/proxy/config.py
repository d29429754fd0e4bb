# SPDX-License-Identifier: Apache-2.0
"""The proxy's configuration: one flat, typed `ProxyConfig` that the CLI, the rollout gateway and the tests fill.

It names the upstreams and the engine that talks to them, the record store, the sampling the gateway enforces, the
admin control token, limits and time-outs, and prefix-preserving generation (`splice` against stock vLLM, `nemo_rl`
against NeMo RL's server: see docs/contracts.md). This module holds data only; `nemo_polar.proxy.app` uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemo_polar.proxy.payloads import PAGE_CACHE_MB

__all__ = ["ProxyConfig"]


@dataclass
class ProxyConfig:
    """Everything the proxy needs; flat and typed (the CLI fills it from flags)."""

    upstreams: list[str]
    store_dir: str
    engine: str = "vllm"
    served_model: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    strict_models: bool = False
    control_token: str | None = None
    public_base_url: str | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    routing: str = "sticky"  # "sticky" (a session stays on one upstream) | "round_robin" (engines/base.py)
    pause_wait_s: float = 600.0
    fsync: bool = False
    # the record store writes a record whose prompt extends an earlier record of its session as what is new
    # (proxy/deltas.py: O(n) bytes over a session instead of O(n²)); every read resolves it
    session_deltas: bool = True
    # MiB of the store's payload file kept in the OS's page cache behind its end; older pages are dropped once on disk
    # (`RecordStore(page_cache_mb=)`; docs/performance.md, "The payload file's page cache"). None: the OS decides.
    store_page_cache_mb: int | None = PAGE_CACHE_MB
    # the payload file's frames written with O_DIRECT, past the page cache (`RecordStore(direct_io=)`;
    # docs/performance.md, "The payload file's direct writes"). None: where its file system is a local block one;
    # True: wherever the file system takes it; False: never
    store_direct_io: bool | None = None
    prefix_preserving: str | None = None  # None | "splice" (stock vLLM) | "nemo_rl" (required_prefix_token_ids)
    model_dir: str | None = None
    chat_template: str | None = None
    eot_token_ids: list[int] | None = None
    tool_call_format: str = "hermes"
    # Re-scoring a forced continuation asks vLLM for prompt_logprobs over the WHOLE prompt (no prefix cache, one
    # vocabulary row per prompt token): affordable for short prompts only. Past this many prompt tokens the record
    # keeps the grammar's logprobs and says so in `upstream.log_probs_source`; forced tokens are masked from
    # training by default (`forced_policy: mask`), so only `forced_policy: keep` users need the re-scored values.
    rescore_forced_max_prompt_tokens: int = 2048
    # How forced and `choose` plan steps are spelled in tokens: "grammar" (the engine generates the text under a
    # grammar, in whatever tokenization the model samples, then it is re-scored) | "canonical" (the tokenizer's own
    # spelling + the template's end of turn, scored by the engine; a `choose` step samples among its options by those
    # scores). Canonical needs `model_dir`; it keeps a decision at the same token positions in every sample.
    forced_tokens: str = "grammar"
    # vLLM streams: ask for this many tokens a chunk (the request field `stream_interval` of vLLM >= 0.32; a server's
    # own --stream-interval wins when larger). None: the server decides (the embedded backend runs with 8).
    # Fewer, larger chunks cost the proxy less CPU per token (docs/performance.md, long streams).
    stream_interval: int | None = None
    # A stream whose first event has not come this many seconds after the call began gets its status line and headers
    # alone (proxy/streaming.py): a long prefill on a busy engine outlasts some harnesses' wait for headers (Gemini
    # CLI gives up after 60 s and retries); so does a Google plain `generateContent` call (Gemini CLI's side calls have
    # the same deadline), whose JSON body follows with the answer. A failure after that is a dropped connection, not an
    # HTTP error. None: the headers always leave with the first event (the answer).
    stream_headers_after_s: float | None = 20.0
    # Who reads harness calls off the socket: "lean", the proxy's own HTTP/1.1 front (proxy/front.py: less CPU a call;
    # the admin API and anything unusual still go to aiohttp), or "aiohttp", aiohttp's server for everything.
    http_server: str = "lean"
