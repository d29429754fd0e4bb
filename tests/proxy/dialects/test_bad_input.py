# SPDX-License-Identifier: Apache-2.0
"""Table-driven bad input per dialect: every malformed request is a 400 `invalid_request` ProviderError, and
`render_error` turns it into the provider's own error JSON (checked against the official SDK's error handling)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from nemo_polar.proxy.dialects import anthropic_messages, google_genai, openai_chat, openai_responses
from nemo_polar.proxy.normalized import ProviderError, RouteMatch

from ._sdk import anthropic_client, genai_client, json_client, openai_client

A_OK = {"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
C_OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
R_OK = {"model": "m", "input": [{"role": "user", "content": "hi"}]}
G_OK = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def w(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """`base` with top-level keys replaced (a value of ... deletes the key)."""
    out = copy.deepcopy(base)
    for k, v in changes.items():
        if v is ...:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def am(*content: Any, role: str = "user") -> dict[str, Any]:
    return w(A_OK, messages=[{"role": role, "content": list(content)}])


ANTHROPIC_BAD: dict[str, Any] = {
    "malformed json": b'{"model": "claude",',
    "empty body": b"",
    "array body": b"[1, 2]",
    "missing model": w(A_OK, model=...),
    "model not a string": w(A_OK, model=123),
    "missing max_tokens": w(A_OK, max_tokens=...),
    "negative max_tokens": w(A_OK, max_tokens=-5),
    "max_tokens as string": w(A_OK, max_tokens="100"),
    "max_tokens as boolean": w(A_OK, max_tokens=True),
    "max_tokens beyond int32": w(A_OK, max_tokens=2**40),
    "missing messages": w(A_OK, messages=...),
    "messages not an array": w(A_OK, messages={"role": "user"}),
    "empty messages": w(A_OK, messages=[]),
    "tool role in messages": w(A_OK, messages=[{"role": "tool", "content": "x"}]),
    "only a system message": w(A_OK, messages=[{"role": "system", "content": "x"}]),
    "system message with an image": w(
        A_OK, messages=[{"role": "system", "content": [{"type": "image"}]}, *A_OK["messages"]]
    ),
    "message not an object": w(A_OK, messages=["hi"]),
    "content a number": w(A_OK, messages=[{"role": "user", "content": 7}]),
    "unknown block type": am({"type": "video", "url": "x"}),
    "text block without text": am({"type": "text"}),
    "image with bad source": am({"type": "image", "source": {"type": "ftp", "data": "x"}}),
    "tool_use without id": am({"type": "tool_use", "name": "bash", "input": {}}, role="assistant"),
    "tool_use input not an object": am(
        {"type": "tool_use", "id": "t", "name": "bash", "input": "ls"}, role="assistant"
    ),
    "tool_result without tool_use_id": am({"type": "tool_result", "content": "x"}),
    "tool_result content a number": am({"type": "tool_result", "tool_use_id": "t", "content": 3}),
    "system not text blocks": w(A_OK, system=[{"type": "image"}]),
    "system a number": w(A_OK, system=5),
    "tools not an array": w(A_OK, tools={"name": "x"}),
    "tool without name": w(A_OK, tools=[{"input_schema": {"type": "object"}}]),
    "tool schema not an object": w(A_OK, tools=[{"name": "x", "input_schema": "object"}]),
    "duplicate tool names": w(A_OK, tools=[{"name": "x", "input_schema": {}}, {"name": "x", "input_schema": {}}]),
    "bad tool_choice": w(A_OK, tool_choice={"type": "sometimes"}),
    "tool_choice tool without name": w(A_OK, tool_choice={"type": "tool"}),
    "temperature above 1": w(A_OK, temperature=1.5),
    "temperature a string": w(A_OK, temperature="hot"),
    "negative top_k": w(A_OK, top_k=-1),
    "stop_sequences with numbers": w(A_OK, stop_sequences=[1, 2]),
    "bad thinking type": w(A_OK, thinking={"type": "maybe"}),
    "stream not a boolean": w(A_OK, stream="yes"),
    "metadata.user_id not a string": w(A_OK, metadata={"user_id": 5}),
}

CHAT_BAD: dict[str, Any] = {
    "malformed json": b"{'model': 'm'}",
    "string body": b'"hello"',
    "invalid utf-8": b'{"model": "\xff"}',
    "missing model": w(C_OK, model=...),
    "empty model": w(C_OK, model=""),
    "missing messages": w(C_OK, messages=...),
    "empty messages": w(C_OK, messages=[]),
    "message not an object": w(C_OK, messages=[["user", "hi"]]),
    "function role": w(C_OK, messages=[{"role": "function", "content": "x", "name": "f"}]),
    "missing role": w(C_OK, messages=[{"content": "x"}]),
    "user content a number": w(C_OK, messages=[{"role": "user", "content": 1}]),
    "unknown part type": w(C_OK, messages=[{"role": "user", "content": [{"type": "video_url"}]}]),
    "image_url without url": w(C_OK, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
    "tool message without tool_call_id": w(C_OK, messages=[{"role": "tool", "content": "x"}]),
    "tool_calls not an array": w(C_OK, messages=[{"role": "assistant", "tool_calls": {"id": "x"}}]),
    "tool call without function": w(
        C_OK, messages=[{"role": "assistant", "tool_calls": [{"id": "a", "type": "function"}]}]
    ),
    "tool call arguments an object": w(
        C_OK,
        messages=[
            {
                "role": "assistant",
                "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}}],
            }
        ],
    ),
    "only a system message": w(C_OK, messages=[{"role": "system", "content": "x"}]),
    "image in a system message": w(
        C_OK, messages=[{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]
    ),
    "tool of unknown type": w(C_OK, tools=[{"type": "retrieval"}]),
    "tool without name": w(C_OK, tools=[{"type": "function", "function": {"parameters": {}}}]),
    "tool_choice unknown string": w(C_OK, tool_choice="maybe"),
    "negative max_tokens": w(C_OK, max_tokens=-1),
    "zero max_completion_tokens": w(C_OK, max_completion_tokens=0),
    "temperature above 2": w(C_OK, temperature=3),
    "n zero": w(C_OK, n=0),
    "stop with numbers": w(C_OK, stop=[1, 2]),
    "seed a float": w(C_OK, seed=1.5),
    "seed beyond int64": w(C_OK, seed=2**70),
    "presence_penalty out of range": w(C_OK, presence_penalty=5),
    "response_format unknown type": w(C_OK, response_format={"type": "xml"}),
    "json_schema without name": w(C_OK, response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
    "include_usage not a boolean": w(C_OK, stream=True, stream_options={"include_usage": "yes"}),
}

RESPONSES_BAD: dict[str, Any] = {
    "malformed json": b"{",
    "number body": b"42",
    "missing model": w(R_OK, model=...),
    "missing input": w(R_OK, input=...),
    "input a number": w(R_OK, input=3),
    "item not an object": w(R_OK, input=["hi"]),
    "unknown item type": w(R_OK, input=[{"type": "teleport"}]),
    "item_reference unsupported": w(R_OK, input=[{"type": "item_reference", "id": "msg_1"}]),
    "message with tool role": w(R_OK, input=[{"role": "tool", "content": "x"}]),
    "unknown content part": w(R_OK, input=[{"role": "user", "content": [{"type": "input_audio"}]}]),
    "input_image without url": w(R_OK, input=[{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]),
    "function_call without call_id": w(R_OK, input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
    "function_call arguments an object": w(
        R_OK, input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]
    ),
    "function_call_output without call_id": w(R_OK, input=[{"type": "function_call_output", "output": "x"}]),
    "custom_tool_call input not a string": w(
        R_OK, input=[{"type": "custom_tool_call", "call_id": "c", "name": "f", "input": 5}]
    ),
    "only developer messages": w(R_OK, input=[{"role": "developer", "content": "x"}]),
    "image in a developer message": w(
        R_OK, input=[{"role": "developer", "content": [{"type": "input_image", "image_url": "u"}]}, *R_OK["input"]]
    ),
    "tool of unknown type": w(R_OK, tools=[{"type": "hologram"}]),
    "namespace without tools": w(R_OK, tools=[{"type": "namespace", "name": "ns"}]),
    "custom tool without name": w(R_OK, tools=[{"type": "custom"}]),
    "duplicate flattened names": w(
        R_OK,
        tools=[
            {"type": "function", "name": "ns__f"},
            {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]},
        ],
    ),
    "tool_choice unknown string": w(R_OK, tool_choice="sometimes"),
    "negative max_output_tokens": w(R_OK, max_output_tokens=-3),
    "temperature a string": w(R_OK, temperature="2"),
    "previous_response_id": w(R_OK, previous_response_id="resp_1"),
    "text.format unknown": w(R_OK, text={"format": {"type": "yaml"}}),
    "reasoning not an object": w(R_OK, reasoning="high"),
    "include not an array": w(R_OK, include="reasoning.encrypted_content"),
}

GOOGLE_BAD: dict[str, Any] = {
    "malformed json": b"{contents: []}",
    "null body": b"null",
    "missing contents": {},
    "empty contents": w(G_OK, contents=[]),
    "content not an object": w(G_OK, contents=["hi"]),
    "assistant role": w(G_OK, contents=[{"role": "assistant", "parts": [{"text": "x"}]}]),
    "missing parts": w(G_OK, contents=[{"role": "user"}]),
    "empty parts": w(G_OK, contents=[{"role": "user", "parts": []}]),
    "unknown part": w(G_OK, contents=[{"role": "user", "parts": [{"video": {}}]}]),
    "text not a string": w(G_OK, contents=[{"role": "user", "parts": [{"text": 5}]}]),
    "functionCall without name": w(G_OK, contents=[{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]),
    "functionCall args a string": w(
        G_OK, contents=[{"role": "model", "parts": [{"functionCall": {"name": "f", "args": "x"}}]}]
    ),
    "functionResponse without response": w(
        G_OK, contents=[{"role": "user", "parts": [{"functionResponse": {"name": "f"}}]}]
    ),
    "non-image inline data": w(
        G_OK, contents=[{"role": "user", "parts": [{"inlineData": {"mimeType": "audio/wav", "data": "AA=="}}]}]
    ),
    "tools not an array": w(G_OK, tools={"functionDeclarations": []}),
    "declaration without name": w(G_OK, tools=[{"functionDeclarations": [{"description": "x"}]}]),
    "bad function calling mode": w(G_OK, toolConfig={"functionCallingConfig": {"mode": "SOMETIMES"}}),
    "negative maxOutputTokens": w(G_OK, generationConfig={"maxOutputTokens": -1}),
    "temperature a string": w(G_OK, generationConfig={"temperature": "hot"}),
    "fractional topK": w(G_OK, generationConfig={"topK": 1.5}),
    "stopSequences a number": w(G_OK, generationConfig={"stopSequences": 3}),
    "responseSchema not an object": w(G_OK, generationConfig={"responseSchema": "object"}),
    "schema with text mime type": w(
        G_OK, generationConfig={"responseMimeType": "text/plain", "responseJsonSchema": {"type": "object"}}
    ),
    "systemInstruction text a number": w(G_OK, systemInstruction={"parts": [{"text": 1}]}),
    "thinkingBudget below -1": w(G_OK, generationConfig={"thinkingConfig": {"thinkingBudget": -5}}),
}

TABLES = {
    "anthropic_messages": (anthropic_messages, ANTHROPIC_BAD, RouteMatch("messages")),
    "openai_chat": (openai_chat, CHAT_BAD, RouteMatch("chat_completions")),
    "openai_responses": (openai_responses, RESPONSES_BAD, RouteMatch("responses")),
    "google_genai": (google_genai, GOOGLE_BAD, RouteMatch("generate_content", {"model": "gemini-2.5-flash"})),
}
CASES = [(d, name) for d, (_, table, _) in TABLES.items() for name in table]


def check_error_shape(dialect: str, status: int, body: dict[str, Any], message: str) -> None:
    if dialect == "anthropic_messages":
        assert body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}
        assert body["error"]["message"] == message
    elif dialect in ("openai_chat", "openai_responses"):
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["message"] == message
    else:
        assert set(body) == {"error"}
        assert body["error"] == {"code": status, "message": message, "status": body["error"]["status"]}


@pytest.mark.parametrize("dialect,name", CASES, ids=[f"{d}:{n}" for d, n in CASES])
def test_bad_input_is_a_provider_shaped_400(dialect: str, name: str) -> None:
    module, table, route = TABLES[dialect]
    body = table[name]
    with pytest.raises(ProviderError) as info:
        module.parse_request(body if isinstance(body, bytes) else json.dumps(body).encode(), route)
    err = info.value
    assert (err.status, err.kind) == (400, "invalid_request")
    assert err.message
    status, shaped, headers = module.render_error(err)
    assert status == 400 and headers == {}
    check_error_shape(dialect, status, shaped, err.message)
    if dialect == "anthropic_messages":
        assert shaped["error"]["type"] == "invalid_request_error"
    elif dialect == "google_genai":
        assert shaped["error"]["status"] == "INVALID_ARGUMENT"
    else:
        assert shaped["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("dialect", sorted(TABLES))
def test_tables_are_large_enough_and_the_good_request_parses(dialect: str) -> None:
    module, table, route = TABLES[dialect]
    assert len(table) >= 15
    good = {"anthropic_messages": A_OK, "openai_chat": C_OK, "openai_responses": R_OK, "google_genai": G_OK}[dialect]
    module.parse_request(json.dumps(good).encode(), route)


def test_google_model_comes_from_the_path() -> None:
    with pytest.raises(ProviderError) as info:
        google_genai.parse_request(G_OK, RouteMatch("generate_content", {}))
    assert info.value.status == 400


def test_anthropic_count_tokens_needs_no_max_tokens() -> None:
    req = anthropic_messages.parse_request(w(A_OK, max_tokens=...), RouteMatch("count_tokens"))
    assert req.sampling.max_tokens is None


# ------------------------------------------------------------------- error JSON through the official SDKs

KINDS = [
    (400, "invalid_request"),
    (400, "context_length_exceeded"),
    (401, "authentication"),
    (403, "permission"),
    (404, "not_found"),
    (413, "request_too_large"),
    (429, "rate_limit"),
    (500, "api_error"),
    (502, "api_error"),
    (503, "overloaded"),
    (504, "timeout"),
]


@pytest.mark.parametrize("status,kind", KINDS)
def test_errors_reach_the_anthropic_sdk_as_its_own_exceptions(status: int, kind: str) -> None:
    import anthropic

    err = ProviderError(status, kind, f"boom {kind}", retry_after_s=2.2 if status >= 429 else None)
    code, body, headers = anthropic_messages.render_error(err)
    assert ("retry-after" in headers) == (status >= 429)
    if headers:
        assert headers["retry-after"] == "3"
    client = anthropic_client(json_client(body, code, headers))
    with pytest.raises(anthropic.APIStatusError) as info:
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == status
    assert info.value.body == body
    if kind != "request_too_large":  # documented by Anthropic for 413, but absent from the SDK's error union
        parsed = anthropic.types.ErrorResponse.model_validate(body)
        assert parsed.error.message == f"boom {kind}"


@pytest.mark.parametrize("status,kind", KINDS)
def test_errors_reach_the_openai_sdk_as_its_own_exceptions(status: int, kind: str) -> None:
    import openai

    for module in (openai_chat, openai_responses):
        err = ProviderError(status, kind, f"boom {kind}", param="messages" if status == 400 else None)
        code, body, headers = module.render_error(err)
        client = openai_client(json_client(body, code, headers))
        with pytest.raises(openai.APIStatusError) as info:
            if module is openai_chat:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            else:
                client.responses.create(model="m", input="x")
        assert info.value.status_code == status
        assert info.value.message.endswith(f"boom {kind}") or f"boom {kind}" in str(info.value)
        assert info.value.code == body["error"]["code"]
        assert info.value.param == err.param


@pytest.mark.parametrize("status,kind", KINDS)
def test_errors_reach_the_google_sdk_as_its_own_exceptions(status: int, kind: str) -> None:
    from google.genai import errors

    err = ProviderError(status, kind, f"boom {kind}")
    code, body, headers = google_genai.render_error(err)
    client = genai_client(json_client(body, code, headers))
    with pytest.raises(errors.APIError) as info:
        client.models.generate_content(model="gemini-2.5-flash", contents="x")
    assert info.value.code == status
    assert info.value.message == f"boom {kind}"
    assert info.value.status == body["error"]["status"]
