# SPDX-License-Identifier: Apache-2.0
"""The SGLang engine: OpenAI-Chat calls with SGLang's token capture extensions.

SGLang (≥ 0.5.13) returns token data on `/v1/chat/completions` when asked with `return_prompt_token_ids: true`
(→ `choices[0].prompt_token_ids`) and `return_meta_info: true` with `logprobs: true` (→
`choices[0].meta_info.output_token_logprobs`: `[logprob, token_id, text]` triples or `{logprob, token_id}` objects).
SGLang refuses `return_prompt_token_ids` with `stream: true`, so a streaming client is served from one
non-streaming upstream call whose result is replayed as `StreamEvent`s.

SGLang cannot run on this machine (CUDA-only kernels); the tests drive this engine against a loopback fake that
is named as a fake. This module builds no provider shapes and writes no records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from nemo_polar.proxy.engines.base import (
    EngineCall,
    Generation,
    OpenAIServerEngine,
    UpstreamError,
)
from nemo_polar.proxy.normalized import ProviderError, StreamEvent

__all__ = ["SGLangEngine"]


class SGLangEngine(OpenAIServerEngine):
    name = "sglang"

    def token_fields(self, stream: bool) -> dict[str, Any]:
        """Never streamed upstream (SGLang streams no token ids): `stream_batches` replays one `chat`."""
        return {"logprobs": True, "return_prompt_token_ids": True, "return_meta_info": True, "stream": False}

    reply_name = "SGLang"

    @staticmethod
    def token_data(
        data: dict[str, Any], choice: dict[str, Any], gen: Generation
    ) -> tuple[list[int], list[int], list[float]]:
        ids: list[int] = []
        lps: list[float] = []
        for item in (choice.get("meta_info") or {}).get("output_token_logprobs") or ():
            if isinstance(item, dict):
                lp, tid = item["logprob"], (item["token_id"] if "token_id" in item else item["id"])
            else:
                lp, tid = item[0], item[1]
            ids.append(int(tid))
            lps.append(float(lp))
        if choice.get("finish_reason") == "abort":
            raise UpstreamError(502, "api_error", "SGLang aborted the generation", endpoint=gen.endpoint)
        return choice.get("prompt_token_ids") or data.get("prompt_token_ids") or [], ids, lps

    async def stream_batches(self, call: EngineCall, gen: Generation) -> AsyncIterator[list[StreamEvent]]:
        """One non-streaming upstream call (SGLang streams no token ids), its answer as one batch of events."""
        gen.adopt(await self.chat(call))
        assert gen.result is not None
        events = gen.result.as_events()
        if events:
            yield events

    async def complete_ids(self, call: EngineCall, prompt_ids: list[int]) -> tuple[Generation, str]:
        """Not available: SGLang's chat endpoint takes no prompt token ids (prefix splicing needs vLLM)."""
        raise ProviderError(500, "api_error", f"engine {self.name} cannot generate from token ids")

    async def tokenize(self, call: EngineCall) -> list[int]:
        body = self.build_body(call, stream=False)
        body["max_tokens"] = 1
        data = await self.upstreams.post_json("/v1/chat/completions", body, call.route_key, Generation(), total_s=120)
        try:
            return list(data["choices"][0]["prompt_token_ids"])
        except (KeyError, IndexError, TypeError) as exc:
            raise UpstreamError(502, "api_error", "SGLang returned no prompt_token_ids") from exc

    async def score(
        self, prompt_ids: list[int], continuation: list[int], served_model: str, route_key: str
    ) -> list[float]:
        raise UpstreamError(501, "api_error", "re-scoring forced tokens is not implemented for SGLang")
