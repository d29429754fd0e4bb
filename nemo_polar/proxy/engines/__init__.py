# SPDX-License-Identifier: Apache-2.0
"""Inference engines behind the proxy: vLLM (`vllm.VLLMEngine`) and SGLang (`sglang.SGLangEngine`).

Both turn a normalised `ChatRequest` into an upstream call, capture prompt/generation token ids and logprobs, and
return a `ChatResult` (or `StreamEvent`s then a `ChatResult`). Shared plumbing (endpoints, sticky routing,
failover, error mapping) is in `base`.
"""

from nemo_polar.proxy.engines.base import Engine, EngineCall, Generation, UpstreamError

__all__ = ["Engine", "EngineCall", "Generation", "UpstreamError"]
