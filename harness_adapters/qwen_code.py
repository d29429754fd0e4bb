# SPDX-License-Identifier: Apache-2.0
"""Qwen Code (`@qwen-code/qwen-code`): OpenAI Chat, `qwen --auth-type openai --yolo -p … -o json`.

Writes `~/.qwen/settings.json` (telemetry, usage statistics and update checks off; MCP servers in Qwen's
`mcpServers` schema) and `~/.qwen/skills/<name>/SKILL.md`. Qwen Code ignores NO_PROXY, so every proxy
variable is cleared (`env_unset`).

Classification: the managed auto-memory passes (extraction after each turn, "dream" consolidation, memory
selection) are side calls, recognised by their system prompts; JSON helper calls (`response_format`) and
requests without tools are side too. A subagent (spawned through the `agent` tool) is not offered `agent`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from nemo_polar.types import CallKind

from .base import HarnessAdapter, HarnessContext, Role, system_text, tool_names
from .gemini_cli import mcp_servers_setting

SIDE_MARKERS = (
    "managed memory extraction subagent",
    "You are performing a managed memory dream",
    "You are selecting memories that will be useful",
)
# Qwen Code's JSON helper (its next-speaker check and other structured side queries) declares this one tool
JSON_HELPER_TOOL = "respond_in_schema"


class QwenCodeAdapter(HarnessAdapter):
    name = "qwen_code"
    package = "@qwen-code/qwen-code"
    package_kind = "npm"
    version = "0.15.10"  # newest whose engines accept Node 20
    executable = "qwen"
    dialect = "openai_chat"
    shell_tool = "run_shell_command"
    edit_tool = "edit"
    write_tool = "write_file"
    read_tool = "read_file"
    read_before_edit = True  # edit refuses a file this session has not read
    role_hints: ClassVar[Mapping[str, Role]] = {
        "read_file": "IG",
        "list_directory": "IG",
        "glob": "IG",
        "grep_search": "IG",
        "web_fetch": "IG",
        "lsp": "IG",
        "edit": "AE",
        "write_file": "AE",
    }

    def prepare(self, ctx: HarnessContext) -> dict[str, str]:
        mcp = mcp_servers_setting(ctx)
        settings = {
            "general": {"enableAutoUpdate": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "mcpServers": mcp,
        }
        files = {".qwen/settings.json": self.dump_json(settings)}
        files.update(self.skill_files(".qwen/skills", ctx.skills))
        return files

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        env = super().env(ctx)
        del env["NO_PROXY"], env["no_proxy"]  # ignored by Qwen Code; the proxy variables are unset instead
        env.update(
            {
                "OPENAI_BASE_URL": ctx.base_url.rstrip("/") + "/v1",
                "OPENAI_API_KEY": ctx.api_key,
                "OPENAI_MODEL": ctx.model,
                "QWEN_CODE_NO_RELAUNCH": "true",
                "QWEN_TELEMETRY_ENABLED": "false",
                # its OpenAI client's wait for a response's headers (default 120 s): a non-streamed call's come with
                # its answer
                "QWEN_CODE_API_TIMEOUT_MS": str(ctx.idle_timeout_s * 1000),
            }
        )
        return env

    def command(self, ctx: HarnessContext, instruction: str) -> list[str]:
        argv = [self.executable_path(ctx), "--auth-type", "openai", "--yolo", "-p", instruction, "-o", "json"]
        return [*argv, "-m", ctx.model]

    def classify_request(self, request: Mapping[str, Any], original: Mapping[str, Any] | None = None) -> CallKind:
        if request.get("response_format"):
            return CallKind.SIDE
        system = system_text(request)
        if any(m in system for m in SIDE_MARKERS):
            return CallKind.SIDE
        tools = tool_names(request)
        if not tools or tools == {JSON_HELPER_TOOL}:
            return CallKind.SIDE
        return CallKind.MAIN if "agent" in tools else CallKind.SUBAGENT

    def shell_arguments(self, command: str) -> dict[str, Any]:
        return {"command": command, "is_background": False}

    def edit_arguments(self, ctx: HarnessContext, path: str, old: str, new: str) -> dict[str, Any]:
        return {"file_path": ctx.path(path), "old_string": old, "new_string": new}

    def write_arguments(self, ctx: HarnessContext, path: str, content: str) -> dict[str, Any]:
        return {"file_path": ctx.path(path), "content": content}
