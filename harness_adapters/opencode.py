# SPDX-License-Identifier: Apache-2.0
"""OpenCode (`opencode-ai`): OpenAI Chat (or Anthropic Messages), `opencode run --format json -m polar/<model>`.

Writes `~/.config/opencode/opencode.json`: a `polar` provider through the bundled `@ai-sdk/openai-compatible`
package (`provider_api="anthropic"` selects `@ai-sdk/anthropic`), every permission allowed, autoupdate and
sharing off, MCP servers in OpenCode's `mcp` schema (`type: local|remote`); skills in
`~/.config/opencode/skills/<name>/SKILL.md`. XDG directories point into the private HOME.

Classification: the title generator ("You are a title generator") and other tool-less helper calls (session
summaries, compaction) are side; a request offering tools without `task` is a subagent (subagents may not spawn
subagents); the rest is the main agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from nemo_polar.types import CallKind

from .base import HarnessAdapter, HarnessContext, Role, system_text, tool_names

TITLE_MARKER = "You are a title generator"
PROVIDER_PACKAGES = {"openai-compatible": "@ai-sdk/openai-compatible", "anthropic": "@ai-sdk/anthropic"}


class OpenCodeAdapter(HarnessAdapter):
    name = "opencode"
    package = "opencode-ai"
    package_kind = "npm"
    version = "1.18.33"
    executable = "opencode"
    dialect = "openai_chat"
    shell_tool = "bash"
    edit_tool = "edit"
    write_tool = "write"
    read_tool = "read"
    read_before_edit = True  # edit refuses a file the session has not read
    role_hints: ClassVar[Mapping[str, Role]] = {
        "read": "IG",
        "grep": "IG",
        "glob": "IG",
        "list": "IG",
        "webfetch": "IG",
        "edit": "AE",
        "write": "AE",
        "patch": "AE",
        "multiedit": "AE",
    }

    def _api(self, ctx: HarnessContext) -> str:
        api = ctx.provider_api or "openai-compatible"
        if api not in PROVIDER_PACKAGES:
            raise ValueError(f"opencode provider_api must be one of {sorted(PROVIDER_PACKAGES)}, got {api!r}")
        return api

    def prepare(self, ctx: HarnessContext) -> dict[str, str]:
        mcp: dict[str, Any] = {}
        for s in ctx.mcp_servers:
            if s.url is not None:
                mcp[s.name] = {"type": "remote", "url": s.url, "enabled": True}
            else:
                cmd = [s.command or "", *s.args]
                mcp[s.name] = {"type": "local", "command": cmd, "environment": dict(s.env), "enabled": True}
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"polar/{ctx.model}",
            "small_model": f"polar/{ctx.model}",
            "provider": {
                "polar": {
                    "npm": PROVIDER_PACKAGES[self._api(ctx)],
                    "name": "polar",
                    "options": {
                        "baseURL": ctx.base_url.rstrip("/") + "/v1",
                        "apiKey": ctx.api_key,
                        # its fetch wrapper's limits on the wait for headers and between SSE reads (300 s each)
                        "headerTimeout": ctx.idle_timeout_s * 1000,
                        "chunkTimeout": ctx.idle_timeout_s * 1000,
                    },
                    "models": {ctx.model: {"name": ctx.model, "tool_call": True}},
                }
            },
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "allow", "external_directory": "allow"},
            "mcp": mcp,
        }
        files = {".config/opencode/opencode.json": self.dump_json(config)}
        files.update(self.skill_files(".config/opencode/skills", ctx.skills))
        return files

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        env = super().env(ctx)
        home = ctx.home.rstrip("/")
        env.update(
            {
                "XDG_CONFIG_HOME": f"{home}/.config",
                "XDG_DATA_HOME": f"{home}/.local/share",
                "XDG_CACHE_HOME": f"{home}/.cache",
                "XDG_STATE_HOME": f"{home}/.local/state",
                "OPENCODE_DISABLE_AUTOUPDATE": "1",
                "OPENCODE_DISABLE_MODELS_FETCH": "1",
                "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
                "OPENCODE_DISABLE_SHARE": "1",
                "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
                "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            }
        )
        return env

    def command(self, ctx: HarnessContext, instruction: str) -> list[str]:
        return [self.executable_path(ctx), "run", "--format", "json", "-m", f"polar/{ctx.model}", instruction]

    def classify_request(self, request: Mapping[str, Any], original: Mapping[str, Any] | None = None) -> CallKind:
        if TITLE_MARKER in system_text(request):
            return CallKind.SIDE
        tools = tool_names(request)
        if not tools:
            return CallKind.SIDE
        return CallKind.MAIN if "task" in tools else CallKind.SUBAGENT

    def shell_arguments(self, command: str) -> dict[str, Any]:
        return {"command": command, "description": "Run a shell command"}

    def read_arguments(self, ctx: HarnessContext, path: str) -> dict[str, Any]:
        return {"filePath": ctx.path(path)}

    def edit_arguments(self, ctx: HarnessContext, path: str, old: str, new: str) -> dict[str, Any]:
        return {"filePath": ctx.path(path), "oldString": old, "newString": new}

    def write_arguments(self, ctx: HarnessContext, path: str, content: str) -> dict[str, Any]:
        return {"filePath": ctx.path(path), "content": content}
