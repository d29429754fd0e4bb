# SPDX-License-Identifier: Apache-2.0
"""Claude Code (`@anthropic-ai/claude-code`): Anthropic Messages, `claude -p … --output-format json`.

Writes `~/.claude/settings.json` (permissions bypassed, no co-author line), `~/.claude.json` (onboarding done,
MCP servers in Claude's user-scope `mcpServers` schema) and `~/.claude/skills/<name>/SKILL.md`. Every model
alias (opus/sonnet/haiku and the subagent model) is pointed at the session's model so all calls hit the proxy.

Classification: requests without tools are side calls (titles, topic checks, summaries); a built-in subagent's
system prompt ("You are an agent for Claude Code…", "…specialist for Claude Code") marks a subagent; the main
agent's prompt ("You are an interactive agent…") or a tool list with the subagent spawner (`Agent`, formerly
`Task`) marks the main agent; any other tool-using request is a subagent. (Claude Code also sends an
`x-claude-code-parent-agent-id` header on subagent requests; the proxy hands classifiers the body only.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from nemo_polar.types import CallKind

from .base import HarnessAdapter, HarnessContext, Role, system_text, tool_names

SUBAGENT_TOOLS = frozenset({"Agent", "Task"})
# opening lines of the built-in subagents' system prompts (general-purpose, Explore, Plan)
SUBAGENT_MARKERS = ("You are an agent for Claude Code", "specialist for Claude Code")
MAIN_MARKER = "You are an interactive agent that helps users"


class ClaudeCodeAdapter(HarnessAdapter):
    name = "claude_code"
    package = "@anthropic-ai/claude-code"
    package_kind = "npm"
    version = "2.1.197"  # newest whose engines accept Node 20
    executable = "claude"
    dialect = "anthropic_messages"
    shell_tool = "Bash"
    edit_tool = "Edit"
    write_tool = "Write"
    read_tool = "Read"
    read_before_edit = True  # Edit refuses a file this session has not Read
    role_hints: ClassVar[Mapping[str, Role]] = {
        "Read": "IG",
        "Grep": "IG",
        "Glob": "IG",
        "LS": "IG",
        "WebFetch": "IG",
        "WebSearch": "IG",
        "Edit": "AE",
        "MultiEdit": "AE",
        "Write": "AE",
        "NotebookEdit": "AE",
    }

    def prepare(self, ctx: HarnessContext) -> dict[str, str]:
        mcp: dict[str, Any] = {}
        for s in ctx.mcp_servers:
            if s.url is not None:
                mcp[s.name] = {"type": "http", "url": s.url}
            else:
                mcp[s.name] = {"type": "stdio", "command": s.command, "args": list(s.args), "env": dict(s.env)}
        settings = {
            "permissions": {"defaultMode": "bypassPermissions"},
            "includeCoAuthoredBy": False,
            "autoUpdates": False,
        }
        user_config = {
            "hasCompletedOnboarding": True,
            "autoUpdates": False,
            "mcpServers": mcp,
        }
        files = {".claude/settings.json": self.dump_json(settings), ".claude.json": self.dump_json(user_config)}
        files.update(self.skill_files(".claude/skills", ctx.skills))
        return files

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        env = super().env(ctx)
        env.update(
            {
                "ANTHROPIC_BASE_URL": ctx.base_url,
                "ANTHROPIC_API_KEY": ctx.api_key,
                "ANTHROPIC_MODEL": ctx.model,
                "ANTHROPIC_DEFAULT_OPUS_MODEL": ctx.model,
                "ANTHROPIC_DEFAULT_SONNET_MODEL": ctx.model,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
                "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
                "CLAUDE_CODE_SUBAGENT_MODEL": ctx.model,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "CLAUDE_CODE_IDE_SKIP_AUTO_INSTALL": "1",
                "IS_SANDBOX": "1",  # allows --dangerously-skip-permissions as root
                # its stream watchdog aborts a call with no event for this long (default and floor 300 s)
                "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(ctx.idle_timeout_s * 1000),
                # "0": no 300 s timeout on its fetch (otherwise off only for Anthropic's own API)
                "API_FORCE_IDLE_TIMEOUT": "0",
                # its SDK's wait for a response's headers (600 s; 300 s for its non-streamed fallback call)
                "API_TIMEOUT_MS": str(ctx.idle_timeout_s * 1000),
            }
        )
        return env

    def command(self, ctx: HarnessContext, instruction: str) -> list[str]:
        argv = [self.executable_path(ctx), "-p", instruction, "--output-format", "json"]
        argv += ["--dangerously-skip-permissions", "--model", ctx.model]
        if ctx.max_turns is not None:
            argv += ["--max-turns", str(ctx.max_turns)]
        return argv

    def classify_request(self, request: Mapping[str, Any], original: Mapping[str, Any] | None = None) -> CallKind:
        tools = tool_names(request)
        if not tools:
            return CallKind.SIDE
        system = system_text(request)
        if any(m in system for m in SUBAGENT_MARKERS):
            return CallKind.SUBAGENT
        if MAIN_MARKER in system:
            return CallKind.MAIN
        return CallKind.MAIN if tools & SUBAGENT_TOOLS else CallKind.SUBAGENT

    def shell_arguments(self, command: str) -> dict[str, Any]:
        return {"command": command, "description": "Run a shell command"}

    def edit_arguments(self, ctx: HarnessContext, path: str, old: str, new: str) -> dict[str, Any]:
        return {"file_path": ctx.path(path), "old_string": old, "new_string": new}

    def write_arguments(self, ctx: HarnessContext, path: str, content: str) -> dict[str, Any]:
        return {"file_path": ctx.path(path), "content": content}
