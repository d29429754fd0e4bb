# SPDX-License-Identifier: Apache-2.0
"""Streaming in batches: the vLLM engine folds every network read into one list of events, whatever the byte
boundaries (a line cut mid-way, several chunks in one read, no newline after the last line), and the proxy merges
adjacent deltas of one batch without changing the text a client assembles.

The upstream is a loopback aiohttp server that writes a vLLM-shaped SSE stream in awkward byte pieces.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from nemo_polar.proxy.engines.base import EngineCall, Generation, UpstreamError, Upstreams
from nemo_polar.proxy.engines.vllm import VLLMEngine
from nemo_polar.proxy.normalized import ChatRequest, Sampling, StreamEvent
from nemo_polar.proxy.streaming import coalesce as _coalesce


def _sse(n: int, *, crlf: bool = False, final_newline: bool = True) -> bytes:
    end = b"\r\n\r\n" if crlf else b"\n\n"
    chunks: list[dict[str, Any]] = [
        {"id": "c", "model": "m", "prompt_token_ids": [1, 2, 3], "choices": [{"index": 0, "delta": {"role": "x"}}]}
    ]
    for k in range(n):
        chunks.append(
            {
                "id": "c",
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": f"w{k} "},
                        "token_ids": [100 + k],
                        "logprobs": {"content": [{"token": "t", "logprob": -0.5 * k}]},
                        "finish_reason": "stop" if k == n - 1 else None,
                    }
                ],
            }
        )
    chunks.append({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}})
    body = b"".join(b"data: " + json.dumps(c).encode() + end for c in chunks) + b"data: [DONE]"
    return body + (end if final_newline else b"")


async def _run(pieces: list[bytes]) -> tuple[list[list[StreamEvent]], Generation]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for p in pieces:
            await resp.write(p)
            await asyncio.sleep(0.005)  # separate reads
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    ups = Upstreams([f"http://127.0.0.1:{port}"])
    engine = VLLMEngine(ups)
    req = ChatRequest(
        dialect="openai_chat", model="m", messages=[{"role": "user", "content": "hi"}], sampling=Sampling()
    )
    gen = Generation()
    batches: list[list[StreamEvent]] = []
    try:
        async for batch in engine.stream_batches(EngineCall(req, "m", {}, "s"), gen):
            batches.append(batch)
    finally:
        await ups.close()
        await runner.cleanup()
    return batches, gen


@pytest.mark.parametrize(
    ("split", "crlf", "final_newline"),
    [(7, False, True), (61, True, True), (10_000, False, True), (13, False, False)],
    ids=["7-byte-pieces", "crlf-61", "all-at-once", "no-final-newline"],
)
def test_any_byte_split_gives_the_same_result(split: int, crlf: bool, final_newline: bool) -> None:
    n = 40
    data = _sse(n, crlf=crlf, final_newline=final_newline)
    pieces = [data[i : i + split] for i in range(0, len(data), split)]
    batches, gen = asyncio.run(_run(pieces))
    res = gen.result
    assert res is not None
    assert res.content == "".join(f"w{k} " for k in range(n))
    assert res.generation_token_ids == [100 + k for k in range(n)]
    assert res.generation_log_probs == [-0.5 * k for k in range(n)]
    assert res.prompt_token_ids == [1, 2, 3]
    assert "".join(ev.text for b in batches for ev in b if ev.kind == "text") == res.content
    if split >= len(data):
        assert len(batches) == 1  # everything that arrived together is one batch


def test_a_stream_cut_before_done_is_an_upstream_error() -> None:
    data = _sse(5).split(b"data: [DONE]")[0]
    with pytest.raises(UpstreamError, match="without \\[DONE\\]"):
        asyncio.run(_run([data]))


def test_coalesce_merges_only_adjacent_pieces_of_the_same_text() -> None:
    batch = [
        StreamEvent("reasoning", text="a"),
        StreamEvent("reasoning", text="b"),
        StreamEvent("text", text="c"),
        StreamEvent("text", text="d"),
        StreamEvent("tool_call", index=0, id="x", name="f"),
        StreamEvent("tool_args", index=0, text="{"),
        StreamEvent("tool_args", index=0, text="}"),
        StreamEvent("tool_call", index=1, id="y", name="g"),
        StreamEvent("tool_args", index=1, text="{}"),
        StreamEvent("text", text="e"),
    ]
    out = _coalesce(batch)
    assert [(e.kind, e.index, e.text, e.name) for e in out] == [
        ("reasoning", 0, "ab", None),
        ("text", 0, "cd", None),
        ("tool_call", 0, "", "f"),
        ("tool_args", 0, "{}", None),
        ("tool_call", 1, "", "g"),
        ("tool_args", 1, "{}", None),
        ("text", 0, "e", None),
    ]
