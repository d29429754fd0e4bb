# SPDX-License-Identifier: Apache-2.0
"""The shipped SmolLM2 chat template renders tools, tool calls and tool results in the Hermes format.

Rendered with transformers' own chat-template renderer (what vLLM uses); the parsing side (vLLM's `hermes`
tool parser reading back what the model emits) is tested against the real server in test_vllm_server.py.
"""

from __future__ import annotations

import json

import pytest

from nemo_polar.backend import config

render_jinja_template = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template

TEMPLATE = config.MODELS["smollm2"].chat_template_path
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _render(messages: list[dict[str, object]], tools: list[dict[str, object]] | None = None, gen: bool = True) -> str:
    assert TEMPLATE is not None
    return render_jinja_template(
        conversations=[messages], tools=tools, chat_template=TEMPLATE.read_text(), add_generation_prompt=gen
    )[0][0]


def test_plain_chat_matches_smollm2_chatml() -> None:
    text = _render([{"role": "user", "content": "hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_tool_calls_and_tool_results() -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "snow"},
    ]
    text = _render(messages, tools=[WEATHER])
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    tools_json = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(tools_json) == WEATHER
    assert rest == (
        "<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nsnow\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_generated_turn_rerenders_as_a_prefix_extension() -> None:
    # What the model emits after the generation prompt, re-rendered as history, extends the same prefix.
    messages: list[dict[str, object]] = [{"role": "user", "content": "hi"}]
    prompt = _render(messages)
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    history = [*messages, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]}]
    rerendered = _render(history, tools=None, gen=False)
    assert rerendered.startswith(prompt)
    assert rerendered[len(prompt) :] == f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>\n"
