# SPDX-License-Identifier: Apache-2.0
"""The vLLM engine: OpenAI-Chat calls with token capture (`return_token_ids`, `logprobs`, `top_logprobs: 0`).

Non-streaming: top-level `prompt_token_ids`, `choices[0].token_ids`, `choices[0].logprobs.content[*].logprob`; the
logprob entries are read as bare numbers and the prompt ids packed as int32 (`TokenIds`) where `fast_answer` can (C,
`_sse_scan.answer_logprobs`), the full `orjson` parse otherwise, with the same result.
Streaming: `prompt_token_ids` in the first chunk, `token_ids` and `logprobs` per delta, a final usage chunk
(`stream_options.include_usage`). Reasoning arrives as `reasoning_content` or `reasoning` (vLLM renamed it).
Token ids, logprobs and usage are checked against each other before a result is returned. The chunks are folded
by `engines/vllm_stream.py` (plain token chunks decoded a read at a time, not one by one).

Also: `/tokenize` (count_tokens), `/v1/completions` from token ids (prefix-preserving generation) and re-scoring a
continuation with `prompt_logprobs` (the model's own logprobs of forced tokens).
This module builds no provider shapes and writes no records.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from nemo_polar.proxy.engines import vllm_stream
from nemo_polar.proxy.engines.base import (
    EngineCall,
    Generation,
    OpenAIServerEngine,
    UpstreamError,
    Upstreams,
    check_alignment,
    check_token_data,
    with_usage,
)
from nemo_polar.proxy.engines.vllm_stream import StreamAccumulator
from nemo_polar.proxy.normalized import ChatResult, StreamEvent
from nemo_polar.proxy.upstream_http import UpstreamDisconnected, UpstreamTimeout
from nemo_polar.types import TokenIds

__all__ = ["ANSWER_READER", "CAPTURE_FIELDS", "VLLMEngine", "fast_answer"]

# what every request asks vLLM for, streamed or not: the token ids and each sampled token's logprob
CAPTURE_FIELDS: dict[str, Any] = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0}


class VLLMEngine(OpenAIServerEngine):
    """Talks to one or more vLLM OpenAI servers (stock vLLM or NeMo RL's exposed server)."""

    name = "vllm"

    def __init__(self, upstreams: Upstreams, *, total_timeout_s: float = 900.0, stream_interval: int | None = None):
        super().__init__(upstreams, total_timeout_s=total_timeout_s)
        if stream_interval is not None and stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {stream_interval}")
        self.stream_interval = stream_interval  # tokens a streamed chunk (vLLM's request field), None: the server's

    # -- request --------------------------------------------------------------------------------------------------

    def token_fields(self, stream: bool) -> dict[str, Any]:
        fields: dict[str, Any] = {**CAPTURE_FIELDS, "stream": stream}
        if stream:
            fields["stream_options"] = {"include_usage": True}
            if self.stream_interval:
                fields["stream_interval"] = self.stream_interval
        return fields

    # -- non-streaming ----------------------------------------------------------------------------------------------

    @classmethod
    def read_chat(cls, raw: bytes, served_model: str, gen: Generation) -> ChatResult:
        """`parse_chat` of the answer, its logprob entries read as bare numbers and its prompt ids packed (`TokenIds`)
        when `fast_answer` can (the same result: most of the CPU of parsing a long answer goes to the entries' dicts,
        which nothing else reads, and to the prompt ids' ints, which the record packs again)."""
        fast = fast_answer(raw)
        if fast is None:
            return super().read_chat(raw, served_model, gen)
        return cls.parse_chat(fast[0], served_model, gen, fast[1], fast[2])

    @staticmethod
    def token_data(
        data: dict[str, Any], choice: dict[str, Any], gen: Generation
    ) -> tuple[list[int], list[int], list[float]]:
        lp = choice.get("logprobs") or {}
        return (
            data.get("prompt_token_ids") or choice.get("prompt_token_ids") or [],
            choice.get("token_ids") or [],
            [c["logprob"] for c in (lp.get("content") or [])],
        )

    # -- streaming --------------------------------------------------------------------------------------------------

    async def stream_batches(self, call: EngineCall, gen: Generation) -> AsyncIterator[list[StreamEvent]]:
        """Like `stream`, but the events of every chunk that arrived together come as one list.

        One list per network read lets the proxy answer with one write per read instead of one per token (a 512-token
        answer that arrives in a few reads costs a few socket writes, not 512). Closing the generator early (client
        went away) closes the upstream connection, which aborts the generation in vLLM.
        """
        resp = await self.upstreams.post(
            "/v1/chat/completions", self.build_body(call, stream=True), call.route_key, gen
        )
        acc = StreamAccumulator(call.served_model)
        rest = b""
        body = resp.chunks()
        try:
            async for data in body:
                buf = rest + data if rest else data
                cut = buf.rfind(b"\n") + 1
                if not cut:
                    rest = buf
                    continue
                rest = buf[cut:]  # an incomplete line waits for the next read
                events = acc.feed_block(buf[:cut] if rest else buf, gen.endpoint)
                if events:
                    yield events
                if acc.done:
                    break
            if acc.done:  # the body's terminating chunk may follow `[DONE]`: wait a moment, reuse the connection
                await resp.drain()
        except UpstreamTimeout as exc:
            raise UpstreamError(
                504, "timeout", "upstream stream stalled", endpoint=gen.endpoint, retry_after_s=1
            ) from exc
        except UpstreamDisconnected as exc:
            raise UpstreamError(
                502,
                "api_error",
                f"upstream stream broke: {type(exc).__name__}: {exc}",
                endpoint=gen.endpoint,
                retry_after_s=1,
            ) from exc
        finally:
            await body.aclose()
            resp.close()  # before the body's end this closes the connection, which aborts the generation upstream
        if not acc.done and rest.strip():  # a last line without its newline
            events = acc.feed_block(rest, gen.endpoint)
            if events:
                yield events
        if not acc.done:
            raise UpstreamError(502, "api_error", "upstream stream ended without [DONE]", endpoint=gen.endpoint)
        gen.finished_at = time.time()
        gen.usage = acc.usage
        gen.result = acc.result()
        check_alignment(gen.result, gen.usage, gen.endpoint)

    # -- token-level helpers -----------------------------------------------------------------------------------------

    async def tokenize(self, call: EngineCall) -> list[int]:
        body: dict[str, Any] = {"model": call.served_model, "messages": call.request.messages}
        if call.request.tools:
            body["tools"] = call.request.tools
        ctk = call.sampling.get("chat_template_kwargs")
        if ctk:
            body["chat_template_kwargs"] = ctk
        data = await self.upstreams.post_json("/tokenize", body, call.route_key, Generation(), total_s=60)
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            raise UpstreamError(502, "api_error", "upstream /tokenize returned no tokens")
        return tokens

    async def complete_ids(self, call: EngineCall, prompt_ids: list[int]) -> tuple[Generation, str]:
        """Generate from token ids with `/v1/completions` (the call's sampling, the token fields, then `call.extra`
        over them); returns the generation and the raw text."""
        gen = Generation()
        body: dict[str, Any] = {"model": call.served_model, "prompt": prompt_ids}
        body.update({k: v for k, v in call.sampling.items() if k != "chat_template_kwargs"})
        body.update({"return_token_ids": True, "logprobs": 0, "stream": False})
        body.update(call.extra)
        data = await self.upstreams.post_json(
            "/v1/completions", body, call.route_key, gen, total_s=self.total_timeout_s
        )
        try:
            choice = data["choices"][0]
            lp = choice.get("logprobs") or {}
            text = choice.get("text") or ""
            result = ChatResult(
                finish_reason=choice.get("finish_reason") or "stop",
                prompt_token_ids=choice.get("prompt_token_ids") or data.get("prompt_token_ids") or list(prompt_ids),
                generation_token_ids=choice.get("token_ids") or [],
                generation_log_probs=[float(x) for x in (lp.get("token_logprobs") or [])],
                served_model=data.get("model") or call.served_model,
                response_id=data.get("id") or "",
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UpstreamError(502, "api_error", f"unexpected /v1/completions reply: {exc!r}") from exc
        gen.result = with_usage(result, data.get("usage") or {}, gen)
        return gen, text

    async def score(
        self, prompt_ids: list[int], continuation: list[int], served_model: str, route_key: str
    ) -> list[float]:
        """The model's own logprob of each continuation token after `prompt_ids` (teacher forcing)."""
        if not continuation:
            return []
        body = {
            "model": served_model,
            "prompt": list(prompt_ids) + list(continuation),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
            "stream": False,
        }
        data = await self.upstreams.post_json(
            "/v1/completions", body, route_key, Generation(), total_s=self.total_timeout_s
        )
        try:
            choice = data["choices"][0]
            plp: list[Any] = choice.get("prompt_logprobs") or data.get("prompt_logprobs") or []
            tail = plp[-len(continuation) :]
            scores = [float(entry[str(tid)]["logprob"]) for entry, tid in zip(tail, continuation, strict=True)]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UpstreamError(502, "api_error", f"re-scoring with prompt_logprobs failed: {exc!r}") from exc
        check_token_data(prompt_ids, continuation, scores, None)
        return scores


# the cut in C (_sse_scan.c, imported once, by vllm_stream); without it every answer takes the full parse, which
# gives the same result
_answer_logprobs: Callable[[bytes, bool], tuple[bytes, int, bytes | None] | None] | None = vllm_stream._answer_logprobs
ANSWER_READER = (
    "orjson" if _answer_logprobs is None else "c"
)  # how `read_chat` reads long answers (benchmarks print it)


def fast_answer(raw: bytes) -> tuple[dict[str, Any], list[float] | None, TokenIds | None] | None:
    """A non-streamed answer parsed without its logprob entries' dicts and its prompt ids' ints: the answer (its
    `choices[0].logprobs` without `content`, its `prompt_token_ids` empty where they were cut), those entries'
    logprobs exactly as the full parse would give them, and the prompt ids packed (None: not cut); None when it
    cannot be sure.

    `_sse_scan.answer_logprobs` finds `choices[0].logprobs.content`, checks that every entry is one of the shapes
    vLLM writes at `top_logprobs: 0` (and JSON the full parse reads without error), and replaces each entry by its
    logprob's number; it packs the top-level `prompt_token_ids` (ints in [0, 2**31), as `check_token_data` wants)
    and leaves `[]` in their place; one `orjson` parse of that gives the rest of the answer and the numbers as
    orjson reads them. Anything else (another entry shape, an escaped or repeated key on the way, an id that is not
    a token id, a number orjson refuses) is None: the caller parses the whole answer, which reports a malformed one
    as before.
    """
    if _answer_logprobs is None:
        return None
    cut = _answer_logprobs(raw, vllm_stream.PACK_PROMPT_IDS)
    if cut is None:
        return None
    body, n, packed = cut
    values = None
    try:
        data = orjson.loads(body)
        if n:
            values = data["choices"][0]["logprobs"].pop("content")
        if packed is not None and data["prompt_token_ids"] != []:
            return None
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
    if n and (type(values) is not list or len(values) != n):
        return None
    return data, values, None if packed is None else TokenIds.from_checked(packed)  # every id checked in C
