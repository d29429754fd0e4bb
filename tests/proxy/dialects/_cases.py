# SPDX-License-Identifier: Apache-2.0
"""Engine results the render tests replay through every dialect (hand-written, as an engine would produce)."""

from __future__ import annotations

from nemo_polar.proxy.normalized import ChatResult, ToolCall


def results() -> dict[str, ChatResult]:
    return {
        "text": ChatResult(content="Hello there, général! ✓", prompt_tokens=12, completion_tokens=7),
        "reasoning_tools": ChatResult(
            content="Let me look.",
            reasoning="The user wants files listed.",
            tool_calls=[
                ToolCall(id="chatcmpl-tool-a1", name="bash", arguments='{"command": "ls -la"}'),
                ToolCall(id="chatcmpl-tool-b2", name="read", arguments='{"path": "a.txt", "limit": 10}'),
            ],
            finish_reason="tool_calls",
            prompt_tokens=40,
            completion_tokens=30,
        ),
        "tool_only": ChatResult(
            tool_calls=[ToolCall(id="chatcmpl-tool-c3", name="bash", arguments='{"command": "pwd"}')],
            finish_reason="tool_calls",
            prompt_tokens=5,
            completion_tokens=9,
        ),
        "length": ChatResult(content="cut sho", finish_reason="length", prompt_tokens=3, completion_tokens=4),
        "empty": ChatResult(content="", prompt_tokens=3, completion_tokens=1),
    }
