# SPDX-License-Identifier: Apache-2.0
"""Codex's Responses tool kinds: namespace (flattened and split back), custom (freeform ↔ one string argument),
hosted tools dropped, additional_tools input items; rendered items validated by the openai SDK models."""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from nemo_polar.proxy.dialects import openai_responses
from nemo_polar.proxy.normalized import ChatResult, RouteMatch, ToolCall

from ._sdk import events_for, render_stream, sse_events

GRAMMAR = 'start: "*** Begin Patch" LF body "*** End Patch"'
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
    },
    {"type": "web_search", "external_web_access": False},
]
NAMESPACE = {
    "type": "namespace",
    "name": "collaboration",
    "description": "Agent collaboration",
    "tools": [
        {
            "type": "function",
            "name": "send_message",
            "parameters": {"type": "object", "properties": {"target": {"type": "string"}}},
        }
    ],
}
ROUTE = RouteMatch("responses")


def parse(**kw: Any) -> Any:
    body = {
        "model": "gpt-5-codex",
        "tools": TOOLS,
        "input": [
            {"type": "additional_tools", "role": "developer", "tools": [NAMESPACE]},
            {"role": "user", "content": "hi"},
        ],
    }
    body.update(kw)
    return openai_responses.parse_request(body, ROUTE)


def test_tools_are_flattened_and_hosted_ones_dropped() -> None:
    req = parse()
    names = [t["function"]["name"] for t in req.tools]
    assert names == ["exec_command", "apply_patch", "collaboration__send_message"]
    patch = req.tools[1]["function"]
    assert patch["description"] == "Edit files."
    assert patch["parameters"]["required"] == ["input"]
    assert GRAMMAR in patch["parameters"]["properties"]["input"]["description"]
    assert req.extra["dropped_tools"] == ["web_search"]
    assert req.extra["tool_map"] == {
        "apply_patch": {"kind": "custom", "name": "apply_patch"},
        "collaboration__send_message": {"kind": "function", "name": "send_message", "namespace": "collaboration"},
    }
    mcp = openai_responses.parse_request(
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "namespace", "name": "mcp__fs__", "tools": [{"type": "function", "name": "read"}]}],
        },
        ROUTE,
    )
    assert mcp.tools[0]["function"]["name"] == "mcp__fs__read"


RESULT = ChatResult(
    tool_calls=[
        ToolCall("c1", "apply_patch", json.dumps({"input": "*** Begin Patch\n*** End Patch"})),
        ToolCall("c2", "collaboration__send_message", '{"target": "/root"}'),
        ToolCall("c3", "exec_command", '{"cmd": "ls"}'),
    ],
    finish_reason="tool_calls",
    prompt_tokens=10,
    completion_tokens=20,
)


def test_custom_and_namespaced_calls_render_back_in_codex_shapes() -> None:
    import openai

    body = openai_responses.render_response(RESULT, parse())
    openai.types.responses.Response.model_validate(body)
    custom, namespaced, plain = body["output"]
    assert custom["type"] == "custom_tool_call" and custom["name"] == "apply_patch"
    assert custom["input"] == "*** Begin Patch\n*** End Patch" and custom["call_id"] == "c1"
    assert (namespaced["type"], namespaced["namespace"], namespaced["name"]) == (
        "function_call",
        "collaboration",
        "send_message",
    )
    assert plain["name"] == "exec_command" and "namespace" not in plain


def test_custom_and_namespaced_calls_stream() -> None:
    import openai

    adapter: TypeAdapter[Any] = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    objs = [json.loads(d) for _, d in sse_events(render_stream(openai_responses, parse(stream=True), RESULT))]
    for o in objs:
        adapter.validate_python(o)
    types = [o["type"] for o in objs]
    assert "response.custom_tool_call_input.delta" in types and "response.custom_tool_call_input.done" in types
    custom_deltas = [
        o for o in objs if o["type"] == "response.function_call_arguments.delta" and o["output_index"] == 0
    ]
    assert custom_deltas == []  # the freeform input is sent decoded, not as JSON fragments
    done = {o["item"]["call_id"]: o["item"] for o in objs if o["type"] == "response.output_item.done"}
    assert done["c1"]["input"] == "*** Begin Patch\n*** End Patch"
    assert done["c2"]["namespace"] == "collaboration" and done["c2"]["arguments"] == '{"target": "/root"}'
    assert objs[-1]["response"]["output"] == [done["c1"], done["c2"], done["c3"]]
    assert len(events_for(RESULT)) > 3


def test_codex_history_with_custom_and_namespaced_calls_round_trips() -> None:
    out = openai_responses.render_response(RESULT, parse())["output"]
    history = [
        {"type": "additional_tools", "role": "developer", "tools": [NAMESPACE]},
        {"role": "user", "content": "hi"},
        *out,
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
        {"type": "function_call_output", "call_id": "c2", "output": "sent"},
        {"type": "function_call_output", "call_id": "c3", "output": [{"type": "input_text", "text": "a\nb"}]},
    ]
    msgs = parse(input=history).messages
    calls = msgs[1]["tool_calls"]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [
        ("call_0", "apply_patch"),
        ("call_1", "collaboration__send_message"),
        ("call_2", "exec_command"),
    ]
    assert json.loads(calls[0]["function"]["arguments"]) == {"input": "*** Begin Patch\n*** End Patch"}
    assert [(m["tool_call_id"], m["content"]) for m in msgs[2:]] == [
        ("call_0", "Done!"),
        ("call_1", "sent"),
        ("call_2", "a\nb"),
    ]


def test_tool_choice_forms() -> None:
    cases = [
        ("auto", "auto"),
        ("required", "required"),
        ({"type": "function", "name": "exec_command"}, {"type": "function", "function": {"name": "exec_command"}}),
        ({"type": "custom", "name": "apply_patch"}, {"type": "function", "function": {"name": "apply_patch"}}),
        (
            {"type": "function", "namespace": "collaboration", "name": "send_message"},
            {"type": "function", "function": {"name": "collaboration__send_message"}},
        ),
        ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "x"}]}, "required"),
        ({"type": "web_search"}, "auto"),
    ]
    for given, want in cases:
        assert parse(tool_choice=given).tool_choice == want


def test_reasoning_items_prefer_full_content_over_summary() -> None:
    items = [
        {"role": "user", "content": "q"},
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "short"}],
            "content": [{"type": "reasoning_text", "text": "long thought"}],
        },
        {"type": "function_call", "call_id": "a", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "ok"},
        {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]
    msgs = parse(input=items).messages
    assert msgs[1]["reasoning_content"] == "long thought"
    assert msgs[3] == {"role": "assistant", "content": "done"}
