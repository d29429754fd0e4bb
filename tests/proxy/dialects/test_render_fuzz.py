# SPDX-License-Identifier: Apache-2.0
"""Hypothesis fuzzing of the stream renderers: any engine event sequence (odd orders, repeated or unknown tool
indices, empty pieces, unicode) followed by any result renders without raising, and every frame still validates
against the official SDK's event models."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from nemo_polar.proxy.dialects import anthropic_messages, google_genai, openai_chat, openai_responses
from nemo_polar.proxy.normalized import ChatResult, RouteMatch, StreamEvent, ToolCall

from ._sdk import Replay, anthropic_client, openai_client, sse_events

TEXT = st.text(max_size=8)
EVENTS = st.lists(
    st.builds(
        StreamEvent,
        kind=st.sampled_from(["text", "reasoning", "tool_call", "tool_args"]),
        text=TEXT,
        index=st.integers(min_value=0, max_value=2),
        id=st.none() | st.sampled_from(["", "a", "chatcmpl-tool-1"]),
        name=st.none() | st.sampled_from(["bash", "apply_patch", "ns__f"]),
    ),
    max_size=25,
)
RESULTS = st.builds(
    ChatResult,
    content=TEXT,
    reasoning=st.none() | TEXT,
    tool_calls=st.lists(
        st.builds(
            ToolCall,
            id=st.sampled_from(["", "x"]),
            name=st.sampled_from(["bash", "apply_patch"]),
            arguments=TEXT | st.just('{"input": "p"}'),
        ),
        max_size=3,
    ),
    finish_reason=st.sampled_from(["stop", "length", "tool_calls", "content_filter", "error"]),
    prompt_tokens=st.integers(min_value=0, max_value=10**6),
    completion_tokens=st.integers(min_value=0, max_value=10**6),
)
TOOLS = [
    {"type": "function", "name": "bash"},
    {"type": "custom", "name": "apply_patch"},
    {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]},
]


def _adapters() -> dict[str, Any]:
    import anthropic
    import openai
    from google.genai import types as gtypes

    return {
        "anthropic": TypeAdapter(anthropic.types.RawMessageStreamEvent),
        "chat": TypeAdapter(openai.types.chat.ChatCompletionChunk),
        "responses": TypeAdapter(openai.types.responses.ResponseStreamEvent),
        "google": TypeAdapter(gtypes.GenerateContentResponse),
    }


ADAPTERS = _adapters()
REPLAY = Replay()
CLIENTS = {"anthropic": anthropic_client(REPLAY.http), "openai": openai_client(REPLAY.http)}
REQS = {
    "anthropic": (
        anthropic_messages,
        anthropic_messages.parse_request(
            {"model": "c", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "x"}]},
            RouteMatch("messages"),
        ),
    ),
    "chat": (
        openai_chat,
        openai_chat.parse_request(
            {
                "model": "q",
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "x"}],
            },
            RouteMatch("chat_completions"),
        ),
    ),
    "responses": (
        openai_responses,
        openai_responses.parse_request(
            {"model": "g", "stream": True, "input": "x", "tools": TOOLS}, RouteMatch("responses")
        ),
    ),
    "google": (
        google_genai,
        google_genai.parse_request(
            {"contents": [{"parts": [{"text": "x"}]}]},
            RouteMatch("stream_generate_content", {"model": "g"}, {"alt": "sse"}),
        ),
    ),
}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(sorted(REQS)), events=EVENTS, result=RESULTS)
def test_any_event_sequence_renders_valid_frames(which: str, events: list[StreamEvent], result: ChatResult) -> None:
    module, req = REQS[which]
    r = module.StreamRenderer(req, "rid")
    frames: list[bytes] = []
    for ev in events:
        frames += r.feed(ev)
    frames += r.finish(result)
    parsed = sse_events(b"".join(frames))
    if which == "chat":
        assert parsed[-1] == (None, "[DONE]")
        parsed = parsed[:-1]
    for _, data in parsed:
        obj = json.loads(data)
        if obj.get("type") != "ping":
            ADAPTERS[which].validate_python(obj)
    REPLAY.body = b"".join(frames)
    if which == "anthropic":  # the SDK's own accumulator must accept the sequence
        with CLIENTS["anthropic"].messages.stream(model="c", max_tokens=5, messages=[]) as s:
            for _ in s:
                pass
            s.get_final_message()
    if which == "chat":
        from openai.lib.streaming.chat import ChatCompletionStreamState

        state = ChatCompletionStreamState()
        for chunk in CLIENTS["openai"].chat.completions.create(model="q", messages=[], stream=True):
            state.handle_chunk(chunk)
    if which == "responses":
        with CLIENTS["openai"].responses.stream(model="g", input="x") as rs:
            for _ in rs:
                pass
        seqs = [json.loads(d)["sequence_number"] for _, d in parsed]
        assert seqs == list(range(len(seqs)))
        added = [
            json.loads(d)["output_index"] for _, d in parsed if json.loads(d)["type"] == "response.output_item.added"
        ]
        assert added == list(range(len(added)))


BODY_MODELS = {
    "anthropic": "anthropic.types.Message",
    "chat": "openai.types.chat.ChatCompletion",
    "responses": "openai.types.responses.Response",
    "google": "google.genai.types.GenerateContentResponse",
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(sorted(REQS)), result=RESULTS)
def test_any_result_renders_a_valid_body(which: str, result: ChatResult) -> None:
    import importlib

    module, req = REQS[which]
    body = module.render_response(result, req)
    mod_name, _, cls = BODY_MODELS[which].rpartition(".")
    getattr(importlib.import_module(mod_name), cls).model_validate(json.loads(json.dumps(body)))
