# SPDX-License-Identifier: Apache-2.0
"""The `shell` adapter: any command line (`HarnessContext.command_line`) as a harness.

The command runs under `bash -c` with `{instruction}` replaced by the shell-quoted instruction.
Provider variables for the common SDKs point at the proxy: `OPENAI_BASE_URL`
(…/v1), `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`, `GOOGLE_GEMINI_BASE_URL`, `GEMINI_API_KEY`,
plus `POLAR_BASE_URL`, `POLAR_API_KEY`, `POLAR_MODEL` and `POLAR_IDLE_TIMEOUT_S` (how long a call may stay silent
before the client gives up: docs/harnesses.md, "Silent calls"). No files are written.

Native tool names are constructor arguments (defaults: `bash` {command}, `edit` {path, old, new},
`write` {path, content}); every request is the main agent.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from .base import HarnessAdapter, HarnessContext, Role


class ShellAdapter(HarnessAdapter):
    name = "shell"
    package = None
    package_kind = "none"
    version = None
    executable = "bash"
    dialect = "openai_chat"
    role_hints: ClassVar[Mapping[str, Role]] = {}

    def __init__(self, shell_tool: str = "bash", edit_tool: str = "edit", write_tool: str = "write") -> None:
        # instance attributes shadow the class-level names
        self.shell_tool = shell_tool  # type: ignore[misc]
        self.edit_tool = edit_tool  # type: ignore[misc]
        self.write_tool = write_tool  # type: ignore[misc]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        env = super().env(ctx)
        root = ctx.base_url.rstrip("/")
        env.update(
            {
                "POLAR_BASE_URL": root,
                "POLAR_API_KEY": ctx.api_key,
                "POLAR_MODEL": ctx.model,
                # how long a call may send nothing before the client gives up (set the SDK's timeout to it: the
                # OpenAI and Anthropic Python SDKs give up after 600 s, shorter than the proxy may hold a call)
                "POLAR_IDLE_TIMEOUT_S": str(ctx.idle_timeout_s),
                "OPENAI_BASE_URL": root + "/v1",
                "OPENAI_API_KEY": ctx.api_key,
                "ANTHROPIC_BASE_URL": root,
                "ANTHROPIC_API_KEY": ctx.api_key,
                "GOOGLE_GEMINI_BASE_URL": root,
                "GEMINI_API_KEY": ctx.api_key,
            }
        )
        return env

    def command(self, ctx: HarnessContext, instruction: str) -> list[str]:
        if not ctx.command_line:
            raise ValueError("the shell adapter needs HarnessContext.command_line")
        line = ctx.command_line.replace("{instruction}", shlex.quote(instruction))
        return ["bash", "-c", line]

    def edit_arguments(self, ctx: HarnessContext, path: str, old: str, new: str) -> dict[str, Any]:
        return {"path": ctx.path(path), "old": old, "new": new}

    def write_arguments(self, ctx: HarnessContext, path: str, content: str) -> dict[str, Any]:
        return {"path": ctx.path(path), "content": content}
