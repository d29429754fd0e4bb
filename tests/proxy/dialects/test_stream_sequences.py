# SPDX-License-Identifier: Apache-2.0
"""Exact SSE event sequences per provider, each event validated strictly against the official SDK's event model."""

from __future__ import annotations

import json
from itertools import groupby
from typing import Any

import pytest
from pydantic import TypeAdapter

from nemo_polar.proxy.dialects import anthropic_messages, google_genai, openai_chat, openai_responses
from nemo_polar.proxy.normalized import ProviderError, RouteMatch, StreamEvent

from ._cases import results
from ._sdk import events_for, render_stream, sse_events

R = results()


def squash(names: list[str]) -> list[str]:
    """Consecutive repeats collapsed (delta runs become one entry)."""
    return [k for k, _ in groupby(names)]


def anthropic_req(**kw: Any) -> Any:
    body = {
        "model": "claude-x",
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        **kw,
    }
    return anthropic_messages.parse_request(body, RouteMatch("messages", query={"beta": "true"}))


def test_anthropic_sequence_and_event_models() -> None:
    import anthropic

    adapter: TypeAdapter[Any] = TypeAdapter(anthropic.types.RawMessageStreamEvent)
    body = render_stream(anthropic_messages, anthropic_req(), R["reasoning_tools"])
    frames = sse_events(body)
    names = []
    for event, data in frames:
        obj = json.loads(data)
        assert obj["type"] == event
        if event != "ping":
            adapter.validate_python(obj)
        delta = obj.get("delta", {}).get("type") if event == "content_block_delta" else None
        block = obj["content_block"]["type"] if event == "content_block_start" else None
        names.append(f"{event}:{delta or block}" if (delta or block) else event)
    assert squash(names) == [
        "message_start",
        "ping",
        "content_block_start:thinking",
        "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta",
        "content_block_stop",
        "content_block_start:text",
        "content_block_delta:text_delta",
        "content_block_stop",
        "content_block_start:tool_use",
        "content_block_delta:input_json_delta",
        "content_block_stop",
        "content_block_start:tool_use",
        "content_block_delta:input_json_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    indices = [json.loads(d)["index"] for e, d in frames if e == "content_block_start"]
    assert indices == [0, 1, 2, 3]
    start = json.loads(frames[0][1])["message"]
    assert start["usage"]["cache_read_input_tokens"] == 0 and start["content"] == []
    delta = json.loads(frames[-2][1])
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] == 30
    tool_start = [json.loads(d)["content_block"] for e, d in frames if e == "content_block_start"][2]
    assert tool_start["id"] == "toolu_chatcmpl-tool-a1" and tool_start["name"] == "bash"


def test_anthropic_error_event_mid_stream() -> None:
    r = anthropic_messages.StreamRenderer(anthropic_req(), "x")
    frames = r.feed(StreamEvent("text", "partial"))
    frames += r.error(ProviderError(503, "overloaded", "upstream went away"))
    event, data = sse_events(b"".join(frames))[-1]
    assert event == "error"
    assert json.loads(data) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "upstream went away"},
    }


def test_openai_chat_chunks_with_usage_then_done() -> None:
    from openai.types.chat import ChatCompletionChunk

    body = {
        "model": "q",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
    }
    req = openai_chat.parse_request(body, RouteMatch("chat_completions"))
    assert req.include_usage
    frames = sse_events(render_stream(openai_chat, req, R["reasoning_tools"]))
    assert frames[-1] == (None, "[DONE]")
    chunks = [ChatCompletionChunk.model_validate(json.loads(d)) for _, d in frames[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 70
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1
    starts = [tc for c in chunks[:-1] for tc in c.choices[0].delta.tool_calls or [] if tc.id]
    assert [(t.index, t.id, t.function.name) for t in starts] == [
        (0, "chatcmpl-tool-a1", "bash"),
        (1, "chatcmpl-tool-b2", "read"),
    ]


def test_openai_chat_without_include_usage_has_no_usage_chunk() -> None:
    req = openai_chat.parse_request(
        {"model": "q", "stream": True, "messages": [{"role": "user", "content": "hi"}]}, RouteMatch("chat_completions")
    )
    frames = sse_events(render_stream(openai_chat, req, R["text"]))
    assert frames[-1] == (None, "[DONE]")
    last = json.loads(frames[-2][1])
    assert last["choices"][0]["finish_reason"] == "stop" and "usage" not in last


def test_responses_sequence_and_event_models() -> None:
    import openai

    adapter: TypeAdapter[Any] = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    req = openai_responses.parse_request({"model": "gpt-x", "input": "hi", "stream": True}, RouteMatch("responses"))
    frames = sse_events(render_stream(openai_responses, req, R["reasoning_tools"]))
    objs = [json.loads(d) for _, d in frames]
    for (event, _), obj in zip(frames, objs, strict=True):
        assert obj["type"] == event
        adapter.validate_python(obj)
    assert [o["sequence_number"] for o in objs] == list(range(len(objs)))
    assert squash([o["type"].removeprefix("response.") for o in objs]) == [
        "created",
        "in_progress",
        "output_item.added",
        "reasoning_summary_part.added",
        "reasoning_summary_text.delta",
        "reasoning_summary_text.done",
        "reasoning_summary_part.done",
        "output_item.done",
        "output_item.added",
        "content_part.added",
        "output_text.delta",
        "output_text.done",
        "content_part.done",
        "output_item.done",
        "output_item.added",
        "function_call_arguments.delta",
        "output_item.added",
        "function_call_arguments.delta",
        "function_call_arguments.done",
        "output_item.done",
        "function_call_arguments.done",
        "output_item.done",
        "completed",
    ]
    done = [o["item"] for o in objs if o["type"] == "response.output_item.done"]
    final = objs[-1]["response"]
    assert final["output"] == done  # Codex builds its state from output_item.done; completed agrees with it
    assert final["usage"]["total_tokens"] == 70 and final["status"] == "completed"
    assert [o["output_index"] for o in objs if o["type"] == "response.output_item.added"] == [0, 1, 2, 3]


def test_responses_length_ends_with_incomplete() -> None:
    req = openai_responses.parse_request({"model": "gpt-x", "input": "hi", "stream": True}, RouteMatch("responses"))
    objs = [json.loads(d) for _, d in sse_events(render_stream(openai_responses, req, R["length"]))]
    assert objs[-1]["type"] == "response.incomplete"
    assert objs[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_responses_failed_event_mid_stream() -> None:
    import openai

    req = openai_responses.parse_request({"model": "gpt-x", "input": "hi", "stream": True}, RouteMatch("responses"))
    r = openai_responses.StreamRenderer(req, "")
    frames = r.feed(StreamEvent("text", "par")) + r.error(ProviderError(504, "timeout", "engine timed out"))
    last = json.loads(sse_events(b"".join(frames))[-1][1])
    openai.types.responses.ResponseFailedEvent.model_validate(last)
    assert last["response"]["status"] == "failed" and last["response"]["error"]["message"] == "engine timed out"


@pytest.mark.parametrize("alt", ["sse", None])
def test_google_chunks(alt: str | None) -> None:
    from google.genai import types as gtypes

    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    query = {"alt": alt} if alt else {}
    req = google_genai.parse_request(body, RouteMatch("stream_generate_content", {"model": "gemini-x"}, query))
    raw = render_stream(google_genai, req, R["reasoning_tools"])
    if alt == "sse":
        assert raw.startswith(b"data: {") and raw.endswith(b"\r\n\r\n")
        docs = [json.loads(d) for _, d in sse_events(raw)]
    else:
        docs = json.loads(raw)  # without alt=sse the stream is one JSON array
    chunks = [gtypes.GenerateContentResponse.model_validate(d) for d in docs]
    finishes = [c.candidates[0].finish_reason for c in chunks]
    assert finishes[-1] == gtypes.FinishReason.STOP and all(f is None for f in finishes[:-1])
    assert docs[-1]["usageMetadata"]["totalTokenCount"] == 70
    assert all("usageMetadata" not in d for d in docs[:-1])
    calls = [p["functionCall"] for d in docs for p in d["candidates"][0]["content"]["parts"] if "functionCall" in p]
    assert calls == [
        {"name": "bash", "args": {"command": "ls -la"}, "id": "chatcmpl-tool-a1"},
        {"name": "read", "args": {"path": "a.txt", "limit": 10}, "id": "chatcmpl-tool-b2"},
    ]
    thoughts = "".join(p["text"] for d in docs for p in d["candidates"][0]["content"]["parts"] if p.get("thought"))
    assert thoughts == R["reasoning_tools"].reasoning


def test_google_first_call_is_sent_when_the_second_starts() -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    req = google_genai.parse_request(body, RouteMatch("stream_generate_content", {"model": "g"}, {"alt": "sse"}))
    r = google_genai.StreamRenderer(req, "rid")
    assert r.feed(StreamEvent("tool_call", index=0, id="a", name="f")) == []
    assert r.feed(StreamEvent("tool_args", '{"x": 1}', index=0)) == []
    out = r.feed(StreamEvent("tool_call", index=1, id="b", name="g"))
    assert len(out) == 1 and b'"functionCall":{"name":"f","args":{"x":1},"id":"a"}' in out[0]


def test_events_for_covers_every_kind() -> None:
    kinds = {e.kind for e in events_for(R["reasoning_tools"])}
    assert kinds == {"reasoning", "text", "tool_call", "tool_args"}
