# SPDX-License-Identifier: Apache-2.0
"""Codex CLI (`@openai/codex`): OpenAI Responses, `codex exec … --dangerously-bypass-approvals-and-sandbox`.

Writes `$CODEX_HOME/config.toml` (`CODEX_HOME` = `~/.codex`): a custom `polar` model provider with
`wire_api = "responses"` (a custom provider also avoids Codex's WebSocket attempt), the key read from
`POLAR_API_KEY` and sent as Bearer, update checks and analytics off, MCP servers as `[mcp_servers.<name>]`
tables; skills in `$CODEX_HOME/skills/<name>/SKILL.md`.

Codex offers no `apply_patch` tool for model names outside its catalog; edits and writes are resolved into
`exec_command` running Codex's own `apply_patch` command (a heredoc), which Codex intercepts and applies itself.

Classification: Codex states the kind in its turn metadata (`client_metadata["x-codex-turn-metadata"]`:
`request_kind`, and `agent_name`, "/root" for the main agent, a longer path for spawned agents); without the
original body, a request offering tools is the main agent and a tool-less one (compaction, memory) is side.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from nemo_polar.types import CallKind

from .base import HarnessAdapter, HarnessContext, Role, tool_names

API_KEY_VAR = "POLAR_API_KEY"


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


def _toml_inline(table: Mapping[str, str]) -> str:
    return "{ " + ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in table.items()) + " }"


def _apply_patch_command(patch: str) -> str:
    return f"apply_patch <<'PATCH'\n{patch}PATCH"


def _turn_metadata(original: Mapping[str, Any] | None) -> dict[str, Any]:
    meta = (original or {}).get("client_metadata")
    raw = meta.get("x-codex-turn-metadata") if isinstance(meta, Mapping) else None
    if not isinstance(raw, str):
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


MAIN_AGENT = "/root"  # Codex names agents by their place in its agent tree; this is the main agent


class CodexAdapter(HarnessAdapter):
    name = "codex"
    package = "@openai/codex"
    package_kind = "npm"
    version = "0.171.0"
    executable = "codex"
    dialect = "openai_responses"
    shell_tool = "exec_command"  # the shell tool Codex offers for model names outside its catalog
    edit_tool = "exec_command"
    write_tool = "exec_command"
    role_hints: ClassVar[Mapping[str, Role]] = {"apply_patch": "AE", "view_image": "IG", "web_search": "IG"}

    def prepare(self, ctx: HarnessContext) -> dict[str, str]:
        lines = [
            f"model = {_toml_str(ctx.model)}",
            'model_provider = "polar"',
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "check_for_update_on_startup = false",
            "",
            "[model_providers.polar]",
            'name = "polar"',
            f"base_url = {_toml_str(ctx.base_url.rstrip('/') + '/v1')}",
            f'env_key = "{API_KEY_VAR}"',
            'wire_api = "responses"',
            "request_max_retries = 4",
            "stream_max_retries = 2",
            f"stream_idle_timeout_ms = {ctx.idle_timeout_s * 1000}",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[feedback]",
            "enabled = false",
            "",
            "[otel]",
            "log_user_prompt = false",
            'exporter = "none"',
        ]
        for s in ctx.mcp_servers:
            lines += ["", f"[mcp_servers.{_toml_str(s.name)}]"]
            if s.url is not None:
                lines.append(f"url = {_toml_str(s.url)}")
            else:
                lines.append(f"command = {_toml_str(s.command or '')}")
                lines.append("args = [" + ", ".join(_toml_str(a) for a in s.args) + "]")
                if s.env:
                    lines.append(f"env = {_toml_inline(s.env)}")
        files = {".codex/config.toml": "\n".join(lines) + "\n"}
        files.update(self.skill_files(".codex/skills", ctx.skills))
        return files

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        env = super().env(ctx)
        env.update({"CODEX_HOME": f"{ctx.home.rstrip('/')}/.codex", API_KEY_VAR: ctx.api_key})
        return env

    def command(self, ctx: HarnessContext, instruction: str) -> list[str]:
        argv = [
            self.executable_path(ctx),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
        ]
        return [*argv, "--json", "-C", ctx.workdir, "-m", ctx.model, instruction]

    def classify_request(self, request: Mapping[str, Any], original: Mapping[str, Any] | None = None) -> CallKind:
        meta = _turn_metadata(original)
        if meta:
            if meta.get("request_kind", "turn") != "turn":
                return CallKind.SIDE
            agent = meta.get("agent_name")
            if isinstance(agent, str) and agent not in ("", MAIN_AGENT):
                return CallKind.SUBAGENT
        return CallKind.MAIN if tool_names(request) else CallKind.SIDE

    def shell_arguments(self, command: str) -> dict[str, Any]:
        return {"cmd": command}

    def edit_arguments(self, ctx: HarnessContext, path: str, old: str, new: str) -> dict[str, Any]:
        minus = "".join(f"-{line}\n" for line in old.splitlines())
        plus = "".join(f"+{line}\n" for line in new.splitlines())
        patch = f"*** Begin Patch\n*** Update File: {ctx.path(path)}\n@@\n{minus}{plus}*** End Patch\n"
        return {"cmd": _apply_patch_command(patch)}

    def write_arguments(self, ctx: HarnessContext, path: str, content: str) -> dict[str, Any]:
        body = "".join(f"+{line}\n" for line in content.splitlines())
        return {"cmd": _apply_patch_command(f"*** Begin Patch\n*** Add File: {ctx.path(path)}\n{body}*** End Patch\n")}
