# SPDX-License-Identifier: Apache-2.0
"""Pi (`@mariozechner/pi-coding-agent`): any of four provider APIs, `pi -p --mode json --no-session`.

Writes `~/.pi/agent/models.json` (`PI_CODING_AGENT_DIR`) with one `polar` provider whose `api` is the context's
`provider_api`: `openai-completions` (default), `openai-responses`, `anthropic-messages` or
`google-generative-ai`; skills in `~/.pi/agent/skills/<name>/SKILL.md`. Pi has no MCP client (by design), so
MCP servers are refused rather than silently dropped. `PI_OFFLINE=1` keeps it off the network.

Classification: Pi has no subagents; a tool-less request (a compaction summary) is side, the rest main.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from nemo_polar.types import CallKind

from .base import HarnessAdapter, HarnessContext, Role, tool_names

# provider API -> (path the SDK wants appended to the proxy root, CompletionRecord dialect)
PROVIDER_APIS: dict[str, tuple[str, str]] = {
    "openai-completions": ("/v1", "openai_chat"),
    "openai-responses": ("/v1", "openai_responses"),
    "anthropic-messages": ("", "anthropic_messages"),  # the Anthropic SDK appends /v1/messages
    "google-generative-ai": ("/v1beta", "google_genai"),  # Pi passes the version inside baseUrl
}


class PiAdapter(HarnessAdapter):
    name = "pi"
    package = "@mariozechner/pi-coding-agent"
    package_kind = "npm"
    version = "0.73.1"
    executable = "pi"
    dialect = "openai_chat"
    shell_tool = "bash"
    edit_tool = "edit"
    write_tool = "write"
    read_tool = "read"
    role_hints: ClassVar[Mapping[str, Role]] = {
        "read": "IG",
        "grep": "IG",
        "find": "IG",
        "ls": "IG",
        "edit": "AE",
        "write": "AE",
    }

    @staticmethod
    def api(ctx: HarnessContext) -> str:
        api = ctx.provider_api or "openai-completions"
        if api not in PROVIDER_APIS:
            raise ValueError(f"pi provider_api must be one of {sorted(PROVIDER_APIS)}, got {api!r}")
        return api

    def prepare(self, ctx: HarnessContext) -> dict[str, str]:
        if ctx.mcp_servers:
            raise ValueError("pi has no MCP client; remove mcp_servers for this harness")
        api = self.api(ctx)
        suffix, _ = PROVIDER_APIS[api]
        model = {
            "id": ctx.model,
            "name": ctx.model,
            "reasoning": False,
            "input": ["text"],
            "contextWindow": 32768,
            "maxTokens": 4096,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
        }
        models = {
            "providers": {
                "polar": {
                    "baseUrl": ctx.base_url.rstrip("/") + suffix,
                    "api": api,
                    "apiKey": ctx.api_key,
                    "models": [model],
                }
            }
        }
        files = {".pi/agent/models.json": self.dump_json(models)}
        files.update(self.skill_files(".pi/agent/skills", ctx.skills))
        return files

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        env = super().env(ctx)
        env.update({"PI_CODING_AGENT_DIR": f"{ctx.home.rstrip('/')}/.pi/agent", "PI_OFFLINE": "1"})
        return env

    def command(self, ctx: HarnessContext, instruction: str) -> list[str]:
        argv = [self.executable_path(ctx), "-p", "--mode", "json", "--no-session"]
        return [*argv, "--model", f"polar/{ctx.model}", instruction]

    def classify_request(self, request: Mapping[str, Any], original: Mapping[str, Any] | None = None) -> CallKind:
        return CallKind.MAIN if tool_names(request) else CallKind.SIDE

    def read_arguments(self, ctx: HarnessContext, path: str) -> dict[str, Any]:
        return {"path": ctx.path(path)}

    def edit_arguments(self, ctx: HarnessContext, path: str, old: str, new: str) -> dict[str, Any]:
        return {"path": ctx.path(path), "edits": [{"oldText": old, "newText": new}]}

    def write_arguments(self, ctx: HarnessContext, path: str, content: str) -> dict[str, Any]:
        return {"path": ctx.path(path), "content": content}
