# SPDX-License-Identifier: Apache-2.0
"""Round trips: what we render, sent back by the client as history (the way each real client does), normalises to
the assistant turn the engine produced, with its tool results paired to the right calls."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from nemo_polar.proxy.dialects import anthropic_messages, google_genai, openai_chat, openai_responses
from nemo_polar.proxy.dialects._common import canonical_arguments
from nemo_polar.proxy.normalized import ChatResult, RouteMatch, ToolCall

from ._cases import results

USER = {"role": "user", "content": "do it"}


def expected_turn(result: ChatResult) -> list[dict[str, Any]]:
    """The normal form of the engine's answer followed by one tool message per call ("out-<name>")."""
    msg: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        msg["tool_calls"] = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": t.name, "arguments": canonical_arguments(t.arguments)},
            }
            for i, t in enumerate(result.tool_calls)
        ]
    if result.reasoning:
        msg["reasoning_content"] = result.reasoning
    tools = [
        {"role": "tool", "tool_call_id": f"call_{i}", "name": t.name, "content": f"out-{t.name}"}
        for i, t in enumerate(result.tool_calls)
    ]
    return [msg, *tools]


def anthropic_next(result: ChatResult) -> list[dict[str, Any]]:
    req = anthropic_messages.parse_request({"model": "c", "max_tokens": 9, "messages": [USER]}, RouteMatch("messages"))
    body = anthropic_messages.render_response(result, req)
    results_ = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": f"out-{b['name']}"}
        for b in body["content"]
        if b["type"] == "tool_use"
    ]
    history = [USER, {"role": "assistant", "content": body["content"]}]
    if results_:
        history.append({"role": "user", "content": results_})
    return anthropic_messages.parse_request(
        {"model": "c", "max_tokens": 9, "messages": history}, RouteMatch("messages")
    ).messages


def chat_next(result: ChatResult) -> list[dict[str, Any]]:
    req = openai_chat.parse_request({"model": "q", "messages": [USER]}, RouteMatch("chat_completions"))
    msg = openai_chat.render_response(result, req)["choices"][0]["message"]
    history = [USER, msg] + [
        {
            "role": "tool",
            "tool_call_id": t["id"],
            "content": [{"type": "text", "text": f"out-{t['function']['name']}"}],
        }
        for t in msg.get("tool_calls", [])
    ]
    return openai_chat.parse_request({"model": "q", "messages": history}, RouteMatch("chat_completions")).messages


def responses_next(result: ChatResult) -> list[dict[str, Any]]:
    req = openai_responses.parse_request({"model": "g", "input": [USER]}, RouteMatch("responses"))
    output = openai_responses.render_response(result, req)["output"]
    history = [USER, *output] + [
        {"type": "function_call_output", "call_id": o["call_id"], "output": f"out-{o['name']}"}
        for o in output
        if o["type"] == "function_call"
    ]
    return openai_responses.parse_request({"model": "g", "input": history}, RouteMatch("responses")).messages


def google_next(result: ChatResult, with_ids: bool) -> list[dict[str, Any]]:
    route = RouteMatch("generate_content", {"model": "gemini"})
    user = {"role": "user", "parts": [{"text": "do it"}]}
    req = google_genai.parse_request({"contents": [user]}, route)
    content = google_genai.render_response(result, req)["candidates"][0]["content"]
    content = copy.deepcopy(content)
    responses = []
    for p in content["parts"]:
        if "functionCall" in p:
            fr = {"name": p["functionCall"]["name"], "response": {"output": f"out-{p['functionCall']['name']}"}}
            if with_ids:
                fr["id"] = p["functionCall"]["id"]
            else:
                p["functionCall"].pop("id")
            responses.append({"functionResponse": fr})
    history = [user, content] + ([{"role": "user", "parts": responses}] if responses else [])
    return google_genai.parse_request({"contents": history}, route).messages


NEXT = {
    "anthropic_messages": anthropic_next,
    "openai_chat": chat_next,
    "openai_responses": responses_next,
    "google_genai": lambda r: google_next(r, True),
    "google_genai_pi": lambda r: google_next(r, False),
}
RESULTS = {k: v for k, v in results().items() if k != "length"}
CASES = [(d, k) for d in NEXT for k in RESULTS]


@pytest.mark.parametrize("dialect,case", CASES, ids=[f"{d}:{k}" for d, k in CASES])
def test_rendered_answer_comes_back_as_the_same_turn(dialect: str, case: str) -> None:
    result = RESULTS[case]
    messages = NEXT[dialect](result)
    assert messages[0] == {"role": "user", "content": "do it"}
    assert messages[1:] == expected_turn(result)


def test_pi_results_without_ids_pair_by_name_then_position() -> None:
    """Two calls of the same tool and one of another, answered out of order without ids."""
    route = RouteMatch("generate_content", {"model": "g"})
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "bash", "args": {"command": "a"}}},
                    {"functionCall": {"name": "read", "args": {"path": "p"}}},
                    {"functionCall": {"name": "bash", "args": {"command": "b"}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "read", "response": {"output": "R"}}},
                    {"functionResponse": {"name": "bash", "response": {"output": "A"}}},
                    {"functionResponse": {"name": "bash", "response": {"output": "B"}}},
                ],
            },
        ]
    }
    msgs = google_genai.parse_request(body, route).messages
    calls = {c["id"]: json.loads(c["function"]["arguments"]) for c in msgs[1]["tool_calls"]}
    answers = {m["tool_call_id"]: m["content"] for m in msgs[2:]}
    assert calls == {"call_0": {"command": "a"}, "call_1": {"path": "p"}, "call_2": {"command": "b"}}
    assert answers == {"call_1": "R", "call_0": "A", "call_2": "B"}


def test_canonical_ids_are_stable_as_history_grows() -> None:
    """Turn n+1's normal form extends turn n's (ids by position), the property prefix merging relies on."""
    r1 = ChatResult(tool_calls=[ToolCall("x1", "bash", '{"command":"ls"}')], finish_reason="tool_calls")
    m1 = anthropic_next(r1)
    req = anthropic_messages.parse_request({"model": "c", "max_tokens": 9, "messages": [USER]}, RouteMatch("messages"))
    b1 = anthropic_messages.render_response(r1, req)
    r2 = ChatResult(tool_calls=[ToolCall("x2", "bash", '{"command":"pwd"}')], finish_reason="tool_calls")
    b2 = anthropic_messages.render_response(r2, req)
    history = [
        USER,
        {"role": "assistant", "content": b1["content"]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": b1["content"][0]["id"], "content": "out-bash"}],
        },
        {"role": "assistant", "content": b2["content"]},
    ]
    m2 = anthropic_messages.parse_request(
        {"model": "c", "max_tokens": 9, "messages": history}, RouteMatch("messages")
    ).messages
    assert m2[: len(m1)] == m1
    assert m2[-1]["tool_calls"][0]["id"] == "call_1"


def test_gemini_cli_history_of_a_streamed_turn_rebuilds_the_generated_text() -> None:
    """Gemini CLI keeps each streamed thought chunk as its own part and merges adjacent text parts: the normal
    form must still be exactly what the model generated (no separators inserted between chunks)."""
    from ._sdk import render_stream, sse_events

    result = ChatResult(
        content="Line one.\nLine two.",
        reasoning="First I think. Then I act.",
        tool_calls=[ToolCall("c", "bash", '{"command": "ls"}')],
        finish_reason="tool_calls",
    )
    route = RouteMatch("stream_generate_content", {"model": "g"}, {"alt": "sse"})
    user = {"role": "user", "parts": [{"text": "go"}]}
    req = google_genai.parse_request({"contents": [user]}, route)
    chunks = [json.loads(d) for _, d in sse_events(render_stream(google_genai, req, result))]
    parts: list[dict[str, Any]] = []
    for chunk in chunks:  # what Gemini CLI's history keeps (consolidation of adjacent non-thought text parts)
        for p in chunk["candidates"][0]["content"]["parts"]:
            last = parts[-1] if parts else None
            plain = "text" in p and not p.get("thought")
            if last is not None and plain and "text" in last and not last.get("thought"):
                last["text"] += p["text"]
            elif p != {"text": ""}:
                parts.append(dict(p))
    assert sum(1 for p in parts if p.get("thought")) > 1  # thoughts stayed split
    history = [user, {"role": "model", "parts": parts}]
    history.append(
        {"role": "user", "parts": [{"functionResponse": {"id": "c", "name": "bash", "response": {"output": "x"}}}]}
    )
    msgs = google_genai.parse_request({"contents": history}, route).messages
    assert msgs[1]["content"] == result.content
    assert msgs[1]["reasoning_content"] == result.reasoning
    assert msgs[2] == {"role": "tool", "tool_call_id": "call_0", "name": "bash", "content": "x"}
