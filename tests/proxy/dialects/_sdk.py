# SPDX-License-Identifier: Apache-2.0
"""Official SDK clients wired to an in-process httpx2 MockTransport that answers with bytes we rendered.

This fakes only the network hop (no socket is opened); parsing, SSE decoding, event models and stream accumulation
are the SDKs' own code, so a shape they reject fails the test. Also builds a fake engine stream (`events_for`)
from a ChatResult, chunked the way vLLM streams deltas.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2

from nemo_polar.proxy.normalized import ChatResult, StreamEvent

BASE = "http://127.0.0.1:9"


def transport(status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> httpx2.Client:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(status, headers={"content-type": content_type, **(headers or {})}, content=body)

    client = httpx2.Client(transport=httpx2.MockTransport(handler))
    client.seen = seen  # type: ignore[attr-defined]
    return client


class Replay:
    """One reusable transport whose next answer is set with `.body = …` (SDK clients are costly to build)."""

    def __init__(self) -> None:
        self.body = b""
        self.http = httpx2.Client(transport=httpx2.MockTransport(self._handle))

    def _handle(self, request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=self.body)


def sse_client(body: bytes) -> httpx2.Client:
    return transport(200, body, "text/event-stream")


def json_client(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> httpx2.Client:
    return transport(status, json.dumps(obj).encode(), "application/json", headers)


def anthropic_client(http: httpx2.Client) -> Any:
    import anthropic

    return anthropic.Anthropic(api_key="test-key", base_url=BASE, http_client=http, max_retries=0)


def openai_client(http: httpx2.Client) -> Any:
    import openai

    return openai.OpenAI(api_key="test-key", base_url=BASE + "/v1", http_client=http, max_retries=0)


def genai_client(http: httpx2.Client) -> Any:
    from google import genai
    from google.genai import types

    opts = types.HttpOptions(base_url=BASE, httpx_client=http, retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key="test-key", http_options=opts)


def chunks(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def events_for(result: ChatResult, size: int = 3) -> list[StreamEvent]:
    """The StreamEvents an engine would emit for `result`: reasoning, text, then each call with chunked args."""
    evs: list[StreamEvent] = []
    evs += [StreamEvent("reasoning", t) for t in chunks(result.reasoning or "", size)]
    evs += [StreamEvent("text", t) for t in chunks(result.content, size)]
    for i, tc in enumerate(result.tool_calls):
        evs.append(StreamEvent("tool_call", index=i, id=tc.id, name=tc.name))
        evs += [StreamEvent("tool_args", t, index=i) for t in chunks(tc.arguments, size)]
    return evs


def render_stream(
    module: Any, req: Any, result: ChatResult, feed: Callable[[ChatResult], list[StreamEvent]] = events_for
) -> bytes:
    r = module.StreamRenderer(req, "engine-id-1")
    frames: list[bytes] = []
    for ev in feed(result):
        frames += r.feed(ev)
    frames += r.finish(result)
    return b"".join(frames)


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) per SSE frame (our own small reader, to check ordering independently of an SDK)."""
    out: list[tuple[str | None, str]] = []
    for frame in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not frame.strip():
            continue
        name = None
        data = []
        for line in frame.decode().split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        out.append((name, "\n".join(data)))
    return out
