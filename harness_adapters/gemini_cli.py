# SPDX-License-Identifier: Apache-2.0
"""Gemini CLI (`@google/gemini-cli`): Google GenAI, `gemini -p … -o json --yolo`.

Writes `~/.gemini/settings.json` (API-key auth — without it the CLI exits 41 —, usage statistics, telemetry
and update checks off, MCP servers in Gemini's `mcpServers` schema) and `~/.gemini/skills/<name>/SKILL.md`.

Classification: Gemini's JSON helper calls (the model router before each turn, next-speaker and loop checks)
are non-streaming `generateContent` with a `responseJsonSchema`, which the proxy normalises to
`response_format`: side. Requests without tools (history compression) are side too. A subagent (invoked
through `invoke_agent`) is offered `complete_task`, which the main agent never is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from nemo_polar.types import CallKind

from .base import HarnessAdapter, HarnessContext, Role, tool_names


def _json_schema_requested(original: Mapping[str, Any] | None) -> bool:
    if not original:
        return False
    cfg = original.get("generationConfig") or original.get("generation_config") or {}
    if not isinstance(cfg, Mapping):
        return False
    return bool(
        cfg.get("responseJsonSchema") or cfg.get("responseSchema") or cfg.get("responseMimeType") == "application/json"
    )


def mcp_servers_setting(ctx: HarnessContext) -> dict[str, Any]:
    """`mcpServers` of a Gemini-CLI-style settings.json (Gemini CLI and its fork Qwen Code)."""
    return {
        s.name: {"httpUrl": s.url}
        if s.url is not None
        else {"command": s.command, "args": list(s.args), "env": dict(s.env)}
        for s in ctx.mcp_servers
    }


class GeminiCliAdapter(HarnessAdapter):
    name = "gemini_cli"
    package = "@google/gemini-cli"
    package_kind = "npm"
    version = "0.61.0"
    executable = "gemini"
    dialect = "google_genai"
    shell_tool = "run_shell_command"
    edit_tool = "replace"
    write_tool = "write_file"
    read_tool = "read_file"
    role_hints: ClassVar[Mapping[str, Role]] = {
        "read_file": "IG",
        "read_many_files": "IG",
        "list_directory": "IG",
        "glob": "IG",
        "grep_search": "IG",
        "web_fetch": "IG",
        "google_web_search": "IG",
        "replace": "AE",
        "write_file": "AE",
    }

    def prepare(self, ctx: HarnessContext) -> dict[str, str]:
        mcp = mcp_servers_setting(ctx)
        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "mcpServers": mcp,
        }
        files = {".gemini/settings.json": self.dump_json(settings)}
        files.update(self.skill_files(".gemini/skills", ctx.skills))
        return files

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        env = super().env(ctx)
        env.update(
            {
                "GOOGLE_GEMINI_BASE_URL": ctx.base_url,
                "GEMINI_API_KEY": ctx.api_key,
                "GEMINI_MODEL": ctx.model,
                "GEMINI_CLI_TRUST_WORKSPACE": "true",
                "GEMINI_CLI_NO_RELAUNCH": "true",  # no child process re-spawned with a bigger heap
                "GEMINI_TELEMETRY_ENABLED": "false",
            }
        )
        return env

    def command(self, ctx: HarnessContext, instruction: str) -> list[str]:
        return [self.executable_path(ctx), "-p", instruction, "-o", "json", "--yolo", "-m", ctx.model]

    def classify_request(self, request: Mapping[str, Any], original: Mapping[str, Any] | None = None) -> CallKind:
        if request.get("response_format") or _json_schema_requested(original):
            return CallKind.SIDE
        tools = tool_names(request)
        if not tools:
            return CallKind.SIDE
        return CallKind.SUBAGENT if "complete_task" in tools else CallKind.MAIN

    def edit_arguments(self, ctx: HarnessContext, path: str, old: str, new: str) -> dict[str, Any]:
        return {
            "file_path": ctx.path(path),
            "old_string": old,
            "new_string": new,
            "instruction": f"Replace the given text in {path}.",
        }

    def write_arguments(self, ctx: HarnessContext, path: str, content: str) -> dict[str, Any]:
        return {"file_path": ctx.path(path), "content": content}
