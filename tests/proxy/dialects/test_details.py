# SPDX-License-Identifier: Apache-2.0
"""Normalisation details per dialect: system merging, billing header, sampling fields, tool_choice forms,
thinking flags, response formats, part arrays, tool errors, images."""

from __future__ import annotations

from typing import Any

import pytest

from nemo_polar.proxy.dialects import anthropic_messages, google_genai, openai_chat, openai_responses
from nemo_polar.proxy.normalized import RouteMatch, Sampling

A_ROUTE = RouteMatch("messages")
C_ROUTE = RouteMatch("chat_completions")
R_ROUTE = RouteMatch("responses")
G_ROUTE = RouteMatch("generate_content", {"model": "gemini-2.5-pro"})
HI = [{"role": "user", "content": "hi"}]


def anth(**kw: Any) -> Any:
    return anthropic_messages.parse_request({"model": "claude", "max_tokens": 100, "messages": HI, **kw}, A_ROUTE)


def chat(**kw: Any) -> Any:
    return openai_chat.parse_request({"model": "q", "messages": HI, **kw}, C_ROUTE)


def goog(**kw: Any) -> Any:
    return google_genai.parse_request({"contents": [{"parts": [{"text": "hi"}]}], **kw}, G_ROUTE)


# ------------------------------------------------------------------------------------------------- Anthropic


def test_anthropic_billing_header_removed_from_string_and_blocks() -> None:
    header = "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=cli; cch=9f8e7;"
    assert anth(system=f"{header}\nYou are Claude Code.").messages[0] == {
        "role": "system",
        "content": "You are Claude Code.",
    }
    blocks = [
        {"type": "text", "text": header},
        {
            "type": "text",
            "text": "You are Claude Code, Anthropic's official CLI for Claude.",
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "text", "text": "Main prompt.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ]
    req = anth(system=blocks)
    assert req.messages[0] == {
        "role": "system",
        "content": "You are Claude Code, Anthropic's official CLI for Claude.\nMain prompt.",
    }
    # the header changes per request; the normal form must not
    other = [{"type": "text", "text": header.replace("a1b", "c2d").replace("9f8e7", "00000")}, *blocks[1:]]
    assert anth(system=other).messages == req.messages
    assert anth(system=[{"type": "text", "text": header}]).messages == [{"role": "user", "content": "hi"}]


def test_anthropic_claude_code_wire_details_are_accepted() -> None:
    req = anth(
        metadata={"user_id": '{"device_id":"d","session_id":"s"}'},
        thinking={"type": "adaptive"},
        output_config={"effort": "high"},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        tools=[
            {
                "name": "Bash",
                "input_schema": {"type": "object"},
                "eager_input_streaming": True,
                "cache_control": {"type": "ephemeral"},
            }
        ],
        stream=True,
    )
    assert req.reasoning is True and req.stream and req.include_usage
    assert req.extra["output_config"] == {"effort": "high"}
    assert req.tools == [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]
    assert anth(thinking={"type": "enabled", "budget_tokens": 1024}).reasoning is True
    assert anth(thinking={"type": "disabled"}).reasoning is False
    assert anth().reasoning is None


def test_anthropic_sampling_and_tool_choice() -> None:
    req = anth(
        temperature=0.5,
        top_p=0.9,
        top_k=20,
        stop_sequences=["END"],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    assert req.sampling == Sampling(max_tokens=100, temperature=0.5, top_p=0.9, top_k=20, stop=["END"])
    assert req.tool_choice == "required" and req.extra["parallel_tool_calls"] is False
    assert anth(tool_choice={"type": "auto"}).tool_choice == "auto"
    assert anth(tool_choice={"type": "none"}).tool_choice == "none"
    assert anth(tool_choice={"type": "tool", "name": "Bash"}).tool_choice == {
        "type": "function",
        "function": {"name": "Bash"},
    }


def test_anthropic_tool_results_errors_images_and_trailing_text() -> None:
    msgs = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": 1}},
                {"type": "tool_use", "id": "t2", "name": "Bash", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [
                        {"type": "text", "text": "line"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                    ],
                },
                {"type": "tool_result", "tool_use_id": "t2", "is_error": True, "content": "Exit code 1"},
                {"type": "text", "text": "also this", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]
    req = anth(messages=msgs)
    assert req.messages[2] == {
        "role": "tool",
        "tool_call_id": "call_0",
        "name": "Read",
        "content": [
            {"type": "text", "text": "line"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        ],
    }
    assert req.messages[3] == {"role": "tool", "tool_call_id": "call_1", "name": "Bash", "content": "Exit code 1"}
    assert req.messages[4] == {"role": "user", "content": "also this"}
    assert req.extra["tool_errors"] == ["call_1"]
    assert req.extra["tool_call_ids"] == {"call_0": "t1", "call_1": "t2"}


def test_anthropic_server_tools_and_redacted_thinking_are_dropped() -> None:
    msgs = [
        *HI,
        {
            "role": "assistant",
            "content": [{"type": "redacted_thinking", "data": "xx"}, {"type": "text", "text": "ok"}],
        },
        {"role": "user", "content": "more"},
    ]
    req = anth(messages=msgs, tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert req.tools == [] and req.extra["dropped_tools"] == ["web_search_20250305"]
    assert req.messages[1] == {"role": "assistant", "content": "ok"} and req.extra["redacted_thinking"] == 1


# ---------------------------------------------------------------------------------------------- OpenAI Chat


def test_chat_system_and_developer_merge_in_order() -> None:
    req = chat(
        messages=[
            {"role": "system", "content": "A"},
            {"role": "developer", "content": [{"type": "text", "text": "B1"}, {"type": "text", "text": "B2"}]},
            *HI,
            {"role": "developer", "content": "C"},
        ]
    )
    assert req.messages == [{"role": "system", "content": "A\n\nB1\nB2\n\nC"}, {"role": "user", "content": "hi"}]


def test_chat_sampling_fields() -> None:
    req = chat(
        max_tokens=50,
        max_completion_tokens=70,
        temperature=0.2,
        top_p=0.8,
        top_k=-1,
        seed=7,
        stop="###",
        presence_penalty=0.1,
        frequency_penalty=-0.1,
        n=1,
        chat_template_kwargs={"enable_thinking": False},
        reasoning_effort="low",
        parallel_tool_calls=False,
    )
    assert req.sampling == Sampling(
        max_tokens=70,
        temperature=0.2,
        top_p=0.8,
        top_k=-1,
        seed=7,
        stop=["###"],
        presence_penalty=0.1,
        frequency_penalty=-0.1,
        n=1,
        chat_template_kwargs={"enable_thinking": False},
    )
    assert (
        req.reasoning is True and req.extra["reasoning_effort"] == "low" and req.extra["parallel_tool_calls"] is False
    )
    assert chat(max_tokens=50).sampling.max_tokens == 50
    assert chat(reasoning_effort="none").reasoning is False
    assert chat(stream=True).include_usage is False


def test_chat_part_arrays_reasoning_alias_and_images() -> None:
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "seen"}], "reasoning": "hmm"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    req = chat(messages=msgs)
    assert req.messages[0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA", "detail": "low"},
    }
    assert req.messages[1] == {"role": "assistant", "content": "seen", "reasoning_content": "hmm"}
    assert req.messages[2] == {"role": "user", "content": "a\nb"}


def test_chat_tool_choice_and_response_format() -> None:
    assert chat(tool_choice={"type": "function", "function": {"name": "f"}}).tool_choice == {
        "type": "function",
        "function": {"name": "f"},
    }
    assert chat(tool_choice="none").tool_choice == "none"
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}, "strict": True}}
    assert chat(response_format=fmt).response_format == fmt
    assert chat(response_format={"type": "text"}).response_format is None
    assert chat(response_format={"type": "json_object"}).response_format == {"type": "json_object"}


# ------------------------------------------------------------------------------------------------ Responses


def test_responses_instructions_then_developer_messages() -> None:
    body = {
        "model": "gpt-5",
        "instructions": "Base instructions.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "<env>"}, {"type": "input_text", "text": "task"}],
            },
        ],
        "max_output_tokens": 300,
        "temperature": 1.0,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "text": {
            "format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True},
            "verbosity": "low",
        },
        "client_metadata": {"x": "y"},
        "prompt_cache_key": "k",
        "store": False,
        "parallel_tool_calls": True,
    }
    req = openai_responses.parse_request(body, R_ROUTE)
    assert req.messages == [
        {"role": "system", "content": "Base instructions.\n\n<permissions>"},
        {"role": "user", "content": "<env>\ntask"},
    ]
    assert req.sampling == Sampling(max_tokens=300, temperature=1.0)
    assert req.reasoning is True and req.include_usage
    assert req.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
    }
    assert openai_responses.parse_request({"model": "m", "input": "plain"}, R_ROUTE).messages == [
        {"role": "user", "content": "plain"}
    ]


# --------------------------------------------------------------------------------------------------- Google


def test_google_generation_config_and_snake_case() -> None:
    req = goog(
        generation_config={
            "max_output_tokens": 64,
            "temperature": 0.3,
            "top_p": 0.5,
            "top_k": 4,
            "seed": 1,
            "stop_sequences": ["x"],
            "candidate_count": 1,
            "presence_penalty": 0.5,
            "frequency_penalty": 0.25,
        },
        system_instruction={"parts": [{"text": "S1"}, {"text": "S2"}]},
    )
    assert req.sampling == Sampling(
        max_tokens=64,
        temperature=0.3,
        top_p=0.5,
        top_k=4,
        seed=1,
        stop=["x"],
        presence_penalty=0.5,
        frequency_penalty=0.25,
        n=1,
    )
    assert req.messages[0] == {"role": "system", "content": "S1\nS2"}


@pytest.mark.parametrize(
    "config,want",
    [
        ({"mode": "AUTO"}, "auto"),
        ({"mode": "NONE"}, "none"),
        ({"mode": "ANY"}, "required"),
        ({"mode": "ANY", "allowedFunctionNames": ["f"]}, {"type": "function", "function": {"name": "f"}}),
        ({"mode": "VALIDATED"}, "auto"),
    ],
)
def test_google_function_calling_modes(config: dict[str, Any], want: Any) -> None:
    assert goog(toolConfig={"functionCallingConfig": config}).tool_choice == want


def test_google_response_schema_and_thinking() -> None:
    schema = {
        "type": "object",
        "properties": {"reasoning": {"type": "string"}, "model_choice": {"type": "string", "enum": ["flash", "pro"]}},
    }
    req = goog(
        generationConfig={
            "responseMimeType": "application/json",
            "responseJsonSchema": schema,
            "thinkingConfig": {"thinkingBudget": 0},
        }
    )
    assert req.response_format == {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    assert req.reasoning is False
    legacy = goog(
        generationConfig={
            "responseMimeType": "application/json",
            "responseSchema": {"type": "OBJECT", "properties": {"a": {"type": "STRING"}}},
        }
    )
    assert legacy.response_format["json_schema"]["schema"] == {
        "type": "object",
        "properties": {"a": {"type": "string"}},
    }
    router = goog(  # Gemini CLI's model router: OpenAPI-style upper-case types inside `responseJsonSchema`
        generationConfig={
            "responseMimeType": "application/json",
            "responseJsonSchema": {"type": "OBJECT", "properties": {"score": {"type": "INTEGER"}}},
        }
    )
    assert router.response_format["json_schema"]["schema"] == {
        "type": "object",
        "properties": {"score": {"type": "integer"}},
    }
    assert goog(generationConfig={"responseMimeType": "application/json"}).response_format == {"type": "json_object"}
    assert goog(generationConfig={"thinkingConfig": {"thinkingBudget": -1, "includeThoughts": True}}).reasoning is True


def test_google_function_responses_error_and_structured() -> None:
    contents = [
        {"role": "user", "parts": [{"text": "go"}]},
        {
            "role": "model",
            "parts": [
                {"functionCall": {"id": "a", "name": "f", "args": {}}},
                {"functionCall": {"id": "b", "name": "g", "args": {"k": [1, 2]}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"id": "a", "name": "f", "response": {"error": "boom"}}},
                {"functionResponse": {"id": "b", "name": "g", "response": {"rows": [1, 2], "ok": True}}},
                {"text": "continue"},
            ],
        },
    ]
    req = goog(contents=contents)
    assert req.messages[1]["tool_calls"][1]["function"]["arguments"] == '{"k": [1, 2]}'
    assert req.messages[2] == {"role": "tool", "tool_call_id": "call_0", "name": "f", "content": "boom"}
    assert req.messages[3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "name": "g",
        "content": '{"rows": [1, 2], "ok": true}',
    }
    assert req.messages[4] == {"role": "user", "content": "continue"}
    assert req.extra["tool_errors"] == ["call_0"]


def test_google_count_tokens_and_stream_format() -> None:
    wrapped = {
        "generateContentRequest": {
            "model": "models/g",
            "contents": [{"role": "user", "parts": [{"text": "count me"}]}],
        }
    }
    req = google_genai.parse_request(wrapped, RouteMatch("count_tokens", {"model": "g"}))
    assert req.messages == [{"role": "user", "content": "count me"}]
    s = google_genai.parse_request(
        {"contents": [{"parts": [{"text": "x"}]}]},
        RouteMatch("stream_generate_content", {"model": "models/g"}, {"alt": "sse"}),
    )
    assert s.stream and s.model == "g" and s.extra["stream_format"] == "sse"
    assert (
        google_genai.parse_request(
            {"contents": [{"parts": [{"text": "x"}]}]}, RouteMatch("stream_generate_content", {"model": "g"})
        ).extra["stream_format"]
        == "json_array"
    )


def test_normalized_dict_is_the_record_request() -> None:
    req = chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="auto", temperature=0.1)
    d = req.normalized_dict()
    assert d["tools"][0]["function"] == {"name": "f", "parameters": {"type": "object", "properties": {}}}
    assert d["sampling"] == {"temperature": 0.1} and d["tool_choice"] == "auto"


def test_canonical_arguments() -> None:
    from nemo_polar.proxy.dialects import _common

    cases = [
        ('{"b":1,"a":"é"}', '{"b": 1, "a": "é"}'),  # key order kept, unicode unescaped, spaced like tojson
        ({"b": 1, "a": "é"}, '{"b": 1, "a": "é"}'),
        ("not json", "not json"),
        ("[1,2]", "[1,2]"),  # not an object: kept as produced
        ("", ""),
        ({"big": 2**70}, '{"big": 1180591620717411303424}'),  # orjson cannot key it: computed without the memo
    ]
    for _ in range(2):  # second round answers from the memo
        for given, want in cases:
            assert _common.canonical_arguments(given) == want
    _common._CANONICAL.clear()
    _common._canonical_size = 0
    big = {"content": "x" * (_common._CANONICAL_BUDGET // 32)}
    assert _common.canonical_arguments(big).startswith('{"content": "xxx')
    assert _common._CANONICAL == {}  # too large to keep
