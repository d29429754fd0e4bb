# SPDX-License-Identifier: Apache-2.0
"""A minimal agent of your own, run by the `shell` harness: the reference for bringing a harness that is not one of
the CLIs (docs/harnesses.md). A real program, not a fake: OpenAI Chat through the official SDK (the `openai` package,
in the `test` extra), three tools (`bash` {command}, `edit` {path, old, new}, `write` {path, content}: the `shell`
adapter's default native tool names); it stops at the first answer without tool calls (at most 20 calls).

    python tiny_agent.py "instruction"      (OPENAI_BASE_URL, OPENAI_API_KEY, POLAR_MODEL from the adapter)

As a task's agent: `{"harness": "shell", "options": {"command_line": nemo_polar.examples.tiny_agent_command()}}`.
The end-to-end tests, the replay benchmarks and `benchmarks/session_budget.py` run it so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from openai import OpenAI

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Replace old text with new text in a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                "required": ["path", "old", "new"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]


def run_tool(name: str, args: dict[str, str]) -> str:
    if name == "bash":
        p = subprocess.run(["bash", "-c", args["command"]], capture_output=True, text=True, timeout=120, check=False)
        return f"exit {p.returncode}\n{p.stdout}{p.stderr}"
    path = Path(args["path"])
    if name == "edit":
        text = path.read_text()
        if text.count(args["old"]) != 1:
            return "error: old text must occur exactly once"
        path.write_text(text.replace(args["old"], args["new"]))
        return "edited"
    if name == "write":
        path.write_text(args["content"])
        return "written"
    return f"error: unknown tool {name}"


def main() -> int:
    client = OpenAI(timeout=600, max_retries=3)
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": sys.argv[1]},
    ]
    for _ in range(20):
        reply = client.chat.completions.create(model=os.environ["POLAR_MODEL"], messages=messages, tools=TOOLS)
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            print(msg.content)
            return 0
        for call in msg.tool_calls:
            if call.type != "function":  # a free-form (custom) tool call: this agent declares no such tool
                result = f"error: unknown tool call type {call.type}"
            else:
                result = run_tool(call.function.name, json.loads(call.function.arguments or "{}"))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 1


if __name__ == "__main__":
    sys.exit(main())
