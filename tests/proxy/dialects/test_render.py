# SPDX-License-Identifier: Apache-2.0
"""Rendering checked by the official SDKs: each dialect's non-streaming body and SSE stream, read back by the
`anthropic`, `openai` (Chat, Responses) and `google-genai` clients, carries exactly what the engine produced.

For every engine result: SDK(render_response) == SDK(stream fed event by event) == SDK(stream rendered only at
finish, the catch-up path used for replayed/forced answers) == the result itself. Token ids and logprobs never
appear in anything rendered.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from nemo_polar.proxy.dialects import anthropic_messages, google_genai, openai_chat, openai_responses
from nemo_polar.proxy.normalized import ChatRequest, ChatResult, RouteMatch

from ._cases import results
from ._sdk import (
    anthropic_client,
    genai_client,
    json_client,
    openai_client,
    render_stream,
    sse_client,
)

Summary = tuple[str, str, list[tuple[str, Any]], str]
RESULTS = results()
FINISH = {
    "anthropic_messages": {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"},
    "openai_chat": {"stop": "stop", "length": "length", "tool_calls": "tool_calls"},
    "openai_responses": {"stop": "completed", "length": "incomplete", "tool_calls": "completed"},
    "google_genai": {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP"},
}
TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}},
]


def expected(dialect: str, r: ChatResult) -> Summary:
    calls = [(t.name, json.loads(t.arguments)) for t in r.tool_calls]
    return r.content, r.reasoning or "", calls, FINISH[dialect][r.finish_reason]


def request(dialect: str, stream: bool) -> tuple[Any, ChatRequest]:
    if dialect == "anthropic_messages":
        body = {
            "model": "claude-x",
            "max_tokens": 99,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
        }
        return anthropic_messages, anthropic_messages.parse_request(body, RouteMatch("messages"))
    if dialect == "openai_chat":
        body = {"model": "qwen-x", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return openai_chat, openai_chat.parse_request(body, RouteMatch("chat_completions"))
    if dialect == "openai_responses":
        return openai_responses, openai_responses.parse_request(
            {"model": "gpt-x", "input": "hi", "stream": stream}, RouteMatch("responses")
        )
    route = "stream_generate_content" if stream else "generate_content"
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    return google_genai, google_genai.parse_request(body, RouteMatch(route, {"model": "gemini-x"}, {"alt": "sse"}))


# ------------------------------------------------------------------------------ SDK readers, one per dialect


def anthropic_summary(msg: Any) -> Summary:
    text = "".join(b.text for b in msg.content if b.type == "text")
    thinking = "".join(b.thinking for b in msg.content if b.type == "thinking")
    calls = [(b.name, b.input) for b in msg.content if b.type == "tool_use"]
    return text, thinking, calls, msg.stop_reason


def chat_summary(completion: Any) -> Summary:
    choice = completion.choices[0]
    msg = choice.message
    calls = [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls or []]
    reasoning = (msg.model_extra or {}).get("reasoning_content") or ""
    return msg.content or "", reasoning, calls, choice.finish_reason


def responses_summary(resp: Any) -> Summary:
    text = "".join(c.text for o in resp.output if o.type == "message" for c in o.content if c.type == "output_text")
    reasoning = "".join(s.text for o in resp.output if o.type == "reasoning" for s in o.summary)
    calls = [(o.name, json.loads(o.arguments)) for o in resp.output if o.type == "function_call"]
    return text, reasoning, calls, resp.status


def google_summary(chunks: list[Any]) -> Summary:
    parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]
    text = "".join(p.text for p in parts if p.text is not None and not p.thought)
    thought = "".join(p.text for p in parts if p.text is not None and p.thought)
    calls = [(p.function_call.name, p.function_call.args) for p in parts if p.function_call]
    return text, thought, calls, chunks[-1].candidates[0].finish_reason.value


def sdk_nonstream(dialect: str, body: dict[str, Any]) -> Summary:
    if dialect == "anthropic_messages":
        client = anthropic_client(json_client(body))
        return anthropic_summary(client.messages.create(model="claude-x", max_tokens=99, messages=[]))
    if dialect == "openai_chat":
        client = openai_client(json_client(body))
        return chat_summary(client.chat.completions.create(model="qwen-x", messages=[]))
    if dialect == "openai_responses":
        return responses_summary(openai_client(json_client(body)).responses.create(model="gpt-x", input="hi"))
    resp = genai_client(json_client(body)).models.generate_content(model="gemini-x", contents="hi")
    return google_summary([resp])


def sdk_stream(dialect: str, sse: bytes) -> Summary:
    if dialect == "anthropic_messages":
        client = anthropic_client(sse_client(sse))
        with client.messages.stream(model="claude-x", max_tokens=99, messages=[]) as s:
            for _ in s:
                pass
            return anthropic_summary(s.get_final_message())
    if dialect == "openai_chat":
        from openai.lib.streaming.chat import ChatCompletionStreamState

        state = ChatCompletionStreamState()
        stream = openai_client(sse_client(sse)).chat.completions.create(model="qwen-x", messages=[], stream=True)
        chunks = list(stream)
        for chunk in chunks:
            state.handle_chunk(chunk)
        assert chunks[-1].choices == [] and chunks[-1].usage is not None  # include_usage: the usage chunk last
        return chat_summary(state.current_completion_snapshot)
    if dialect == "openai_responses":
        client = openai_client(sse_client(sse))
        events = list(client.responses.create(model="gpt-x", input="hi", stream=True))
        final = events[-1]
        assert final.type in ("response.completed", "response.incomplete")
        if final.type == "response.completed":  # the SDK's own accumulator must agree with the final snapshot
            with openai_client(sse_client(sse)).responses.stream(model="gpt-x", input="hi") as s:
                for _ in s:
                    pass
                assert responses_summary(s.get_final_response()) == responses_summary(final.response)
        return responses_summary(final.response)
    chunks = list(genai_client(sse_client(sse)).models.generate_content_stream(model="gemini-x", contents="hi"))
    return google_summary(chunks)


DIALECTS = ["anthropic_messages", "openai_chat", "openai_responses", "google_genai"]
CASES = [(d, k) for d in DIALECTS for k in RESULTS]


def no_token_data(blob: bytes) -> None:
    for word in (b"token_ids", b"log_prob", b"987654321", b"876543210", b"0.123456789"):
        assert word not in blob


@pytest.mark.parametrize("dialect,case", CASES, ids=[f"{d}:{k}" for d, k in CASES])
def test_sdk_reads_back_what_the_engine_produced(dialect: str, case: str) -> None:
    result = RESULTS[case]
    result.prompt_token_ids = [987654321, 987654322]
    result.generation_token_ids = [876543210]
    result.generation_log_probs = [-0.123456789]
    want = expected(dialect, result)
    module, req = request(dialect, stream=False)
    body = module.render_response(result, req)
    no_token_data(json.dumps(body).encode())
    assert sdk_nonstream(dialect, body) == want
    module, sreq = request(dialect, stream=True)
    fed = render_stream(module, sreq, result)
    no_token_data(fed)
    assert sdk_stream(dialect, fed) == want
    caught_up = render_stream(module, sreq, result, feed=lambda r: [])
    assert sdk_stream(dialect, caught_up) == want


@pytest.mark.parametrize("dialect", DIALECTS)
def test_partially_streamed_answer_is_completed_at_finish(dialect: str) -> None:
    """Engine streamed only part of the answer (e.g. cut before the last tool call): finish emits the rest."""
    from ._sdk import events_for

    result = RESULTS["reasoning_tools"]
    module, req = request(dialect, stream=True)
    body = render_stream(module, req, result, feed=lambda r: events_for(r)[: len(events_for(r)) // 2])
    assert sdk_stream(dialect, body) == expected(dialect, result)


def test_usage_objects() -> None:
    r = RESULTS["reasoning_tools"]
    _, req = request("anthropic_messages", False)
    assert anthropic_messages.render_response(r, req)["usage"] == {
        "input_tokens": 40,
        "output_tokens": 30,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    _, req = request("openai_chat", False)
    assert openai_chat.render_response(r, req)["usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 30,
        "total_tokens": 70,
    }
    _, req = request("openai_responses", False)
    u = openai_responses.render_response(r, req)["usage"]
    assert (u["input_tokens"], u["output_tokens"], u["total_tokens"]) == (40, 30, 70)
    _, req = request("google_genai", False)
    assert google_genai.render_response(r, req)["usageMetadata"] == {
        "promptTokenCount": 40,
        "candidatesTokenCount": 30,
        "totalTokenCount": 70,
    }


def test_non_streaming_bodies_validate_against_sdk_models() -> None:
    """Strict pydantic validation (not the SDKs' lenient construct) of every non-streaming body."""
    import anthropic
    import openai
    from google.genai import types as gtypes

    for r in RESULTS.values():
        _, req = request("anthropic_messages", False)
        anthropic.types.Message.model_validate(anthropic_messages.render_response(r, req))
        _, req = request("openai_chat", False)
        openai.types.chat.ChatCompletion.model_validate(openai_chat.render_response(r, req))
        _, req = request("openai_responses", False)
        openai.types.responses.Response.model_validate(openai_responses.render_response(r, req))
        _, req = request("google_genai", False)
        gtypes.GenerateContentResponse.model_validate(google_genai.render_response(r, req))
