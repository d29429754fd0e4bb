# SPDX-License-Identifier: Apache-2.0
"""The harness adapter protocol: what nemo-polar needs to know to run one coding CLI, unmodified.

An adapter says which package (npm or PyPI) and pinned version it installs, which files to write into the
session's private HOME (provider settings pointing at the proxy, MCP servers in the CLI's own schema, skills),
which environment variables to set or clear, the argv of a headless auto-approved run, how to classify a
request the proxy received (`main` / `subagent` / `side`), how to turn harness-neutral plan steps into the
CLI's native tool calls, and a tool-name -> role hint table for CALL-CREDIT.

Adapters see a small frozen `HarnessContext` (base URL, key, model, workdir, home); they never import the
proxy, the rollout service or credit. This module does no I/O and runs nothing: `nemo_polar.runtime` runs
the argv, `nemo_polar.harness_adapters.install` installs the package.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_polar.errors import PlanError
from nemo_polar.types import CallKind, check_think, mixed_thinking

__all__ = [
    "IDLE_MARGIN_S",
    "PROXY_ENV_VARS",
    "STREAM_IDLE_TIMEOUT_S",
    "AgentOptions",
    "HarnessAdapter",
    "HarnessContext",
    "McpServer",
    "PlanError",
    "Role",
    "cli_idle_limit_s",
    "resolve_plan",
    "system_text",
    "tool_names",
]

Role = Literal["IG", "AE", "RV"]
PackageKind = Literal["npm", "pypi", "none"]

# Proxy variables: cleared for every harness (only loopback is reachable in the sandbox anyway, and some CLIs,
# Qwen Code among them, ignore NO_PROXY and would send loopback traffic to a proxy).
PROXY_ENV_VARS = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
)

# How long a CLI may wait on a call that sends nothing (no event, or no byte) before it gives up on it and retries:
# longer than the proxy can keep a call silent (a call held by a paused admission, `pause_wait_s`, then a silent
# upstream, `read_timeout_s`: 600 s each by default), so the proxy, which records why, is the one that ends a stalled
# call. The CLIs' own limits (300 s: Claude Code's stream watchdog and fetch, Codex's stream idle timeout, OpenCode's
# header and SSE read timeouts; Claude Code's and Qwen Code's SDK wait for a non-streamed call's headers) would abandon
# a call held by a long weight update or queued behind long prefills, and send it again (docs/harnesses.md, "Silent
# calls"). Gemini CLI's idle body gets keep-alive bytes from the proxy. This is the least an adapter sets
# (`HarnessContext.idle_timeout_s`); a proxy whose limits are raised past it gets more (`cli_idle_limit_s`).
STREAM_IDLE_TIMEOUT_S = 1800
# how much longer than the proxy's longest silence a CLI waits: the proxy's 504 or 503 and its record come first
IDLE_MARGIN_S = 600


def cli_idle_limit_s(pause_wait_s: float, read_timeout_s: float) -> int:
    """The idle limit to give the CLIs of sessions behind a proxy with these limits (`ProxyConfig.pause_wait_s`,
    `read_timeout_s`): their sum plus `IDLE_MARGIN_S`, and never less than `STREAM_IDLE_TIMEOUT_S`."""
    if pause_wait_s < 0 or read_timeout_s < 0:
        raise ValueError(
            f"proxy limits must be >= 0 s, got pause_wait_s={pause_wait_s}, read_timeout_s={read_timeout_s}"
        )
    return max(STREAM_IDLE_TIMEOUT_S, math.ceil(pause_wait_s + read_timeout_s) + IDLE_MARGIN_S)


@dataclass(frozen=True, slots=True)
class McpServer:
    """One MCP server to configure: a local stdio command (`command` + `args`) or a remote `url` (HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: set exactly one of command or url")


@dataclass(frozen=True, slots=True)
class HarnessContext:
    """What an adapter may know about its session.

    base_url: the proxy's root as the CLI reaches it (`http://127.0.0.1:PORT`, no `/v1`); adapters append the
        path prefix their provider SDK wants.
    api_key: the per-session secret the CLI sends as its provider key.
    model: the model name the CLI asks for (the proxy maps it to the served model).
    workdir / home: absolute paths as the CLI sees them (inside the sandbox when there is one).
    provider_api: for harnesses that speak several dialects (pi: openai-completions, openai-responses,
        anthropic-messages, google-generative-ai; opencode: openai-compatible or anthropic); None = default.
    install_dir: where the pinned package is installed (None: use the executable on PATH).
    mcp_servers / skills: MCP servers and skills (name -> SKILL.md text) to configure.
    command_line: for the `shell` adapter, the command to run (`{instruction}` is substituted).
    idle_timeout_s: how long the CLI may wait on a call that sends nothing before it gives up on it (adapters raise
        the CLIs' own shorter limits to it; `cli_idle_limit_s` gives it for a proxy's limits).
    """

    base_url: str
    api_key: str
    model: str
    workdir: str
    home: str
    provider_api: str | None = None
    install_dir: str | None = None
    mcp_servers: tuple[McpServer, ...] = ()
    skills: Mapping[str, str] = field(default_factory=dict)
    command_line: str | None = None
    max_turns: int | None = None
    idle_timeout_s: int = STREAM_IDLE_TIMEOUT_S

    def path(self, rel: str) -> str:
        """A plan path (relative to the workdir, or absolute) as an absolute path."""
        p = PurePosixPath(rel)
        return str(p if p.is_absolute() else PurePosixPath(self.workdir) / p)


def system_text(request: Mapping[str, Any]) -> str:
    """The text of the leading system message(s) of a normalised OpenAI-Chat request."""
    out: list[str] = []
    for msg in request.get("messages") or ():
        if not isinstance(msg, Mapping) or msg.get("role") not in ("system", "developer"):
            break
        content = msg.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return "\n".join(out)


def tool_names(request: Mapping[str, Any]) -> set[str]:
    """Names of the tools offered in a normalised request (OpenAI function tools, or bare `{"name"}` dicts)."""
    names: set[str] = set()
    for tool in request.get("tools") or ():
        if not isinstance(tool, Mapping):
            continue
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else tool.get("name")
        if isinstance(name, str):
            names.add(name)
    return names


def _step_field(step: Mapping[str, Any], kind: str, key: str) -> str:
    body = step[kind]
    if not isinstance(body, Mapping) or not isinstance(body.get(key), str):
        raise PlanError(f"{kind} step needs a string {key!r}: {json.dumps(step)[:200]}")
    return str(body[key])


class AgentOptions(BaseModel):
    """`TaskSpec.agent.options` for a harness adapter (checked when a task is submitted; unknown keys are refused).
    Each key feeds the `HarnessContext` field of the same name. An adapter with other options sets its own
    `options_model`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command_line: str | None = Field(default=None, description="`shell` adapter: the command (`{instruction}`)")
    max_turns: int | None = Field(default=None, ge=1, description="the CLI's own turn limit, where it has one")
    provider_api: str | None = Field(default=None, description="the dialect, for CLIs that speak several")


class HarnessAdapter:
    """Base of all adapters. Subclasses set the class attributes and override what differs.

    The defaults describe a CLI with no side calls and no subagents: every request is `main`.
    """

    name: ClassVar[str] = ""
    package: ClassVar[str | None] = None  # npm or PyPI package name; None for `shell`
    package_kind: ClassVar[PackageKind] = "none"
    version: ClassVar[str | None] = None  # pinned
    executable: ClassVar[str] = ""  # the command the package installs
    dialect: ClassVar[str] = "openai_chat"  # the provider API it speaks by default (CompletionRecord.dialect)
    # native tool names for the three neutral plan steps
    shell_tool: ClassVar[str] = "bash"
    edit_tool: ClassVar[str | None] = None
    write_tool: ClassVar[str | None] = None
    read_tool: ClassVar[str | None] = None  # used when the CLI insists on a read before an edit
    read_before_edit: ClassVar[bool] = False
    # CALL-CREDIT hints: tool name -> role; shell tools are listed separately (their command decides the role)
    role_hints: ClassVar[Mapping[str, Role]] = {}
    env_unset: ClassVar[tuple[str, ...]] = PROXY_ENV_VARS
    # the model `TaskSpec.agent.options` must fit (validated at submit)
    options_model: ClassVar[type[BaseModel]] = AgentOptions

    # --- files and environment ------------------------------------------------------------------------------

    def prepare(self, ctx: HarnessContext) -> dict[str, str]:
        """Files to write for the session, as {path relative to ctx.home: text}."""
        return {}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        """Variables to set for the CLI (on top of a minimal base; `env_unset` lists what must be cleared)."""
        return {"HOME": ctx.home, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}

    def command(self, ctx: HarnessContext, instruction: str) -> list[str]:
        """argv of one headless, auto-approved run of the CLI on `instruction` in `ctx.workdir`."""
        raise NotImplementedError

    def executable_path(self, ctx: HarnessContext) -> str:
        """The CLI's executable: from the install dir when there is one, else by name on PATH."""
        if ctx.install_dir and self.package_kind == "npm":
            return str(PurePosixPath(ctx.install_dir) / "node_modules" / ".bin" / self.executable)
        if ctx.install_dir and self.package_kind == "pypi":
            return str(PurePosixPath(ctx.install_dir) / "venv" / "bin" / self.executable)
        return self.executable

    # --- request classification (called by the proxy at request time) ---------------------------------------

    def classify_request(self, request: Mapping[str, Any], original: Mapping[str, Any] | None = None) -> CallKind:
        """`main`, `subagent` or `side` for one request.

        Args:
            request: the proxy's normalised OpenAI-Chat form (`model`, `messages`, `tools`, `tool_choice`,
                `response_format`, …) — `ChatRequest.normalized_dict()`.
            original: the body as received (provider shape), for fingerprints that normalisation hides.
        """
        return CallKind.MAIN

    # --- plans ----------------------------------------------------------------------------------------------

    def shell_arguments(self, command: str) -> dict[str, Any]:
        return {"command": command}

    def edit_arguments(self, ctx: HarnessContext, path: str, old: str, new: str) -> dict[str, Any]:
        raise PlanError(f"{self.name} has no edit tool")

    def write_arguments(self, ctx: HarnessContext, path: str, content: str) -> dict[str, Any]:
        raise PlanError(f"{self.name} has no write tool")

    def read_arguments(self, ctx: HarnessContext, path: str) -> dict[str, Any]:
        return {"file_path": ctx.path(path)}

    def resolve_step(self, step: Mapping[str, Any], ctx: HarnessContext) -> list[dict[str, Any]]:
        """Turn one plan step into native steps (a list: some CLIs need a read before an edit).

        `{"shell": cmd}`, `{"edit": {path, old, new}}` and `{"write": {path, content}}` become
        `{"tool": <native name>, "arguments": {...}}`; a `{"choose": [...]}` step gets each option resolved (one
        native step each); every other step kind passes through unchanged. A step's `think` text (the reasoning a
        thinking model writes before acting) goes with the first native step it resolves to.
        """
        steps = self._resolve(step, ctx)
        if "think" not in step:
            return steps
        try:
            check_think(step["think"])
        except ValueError as exc:
            raise PlanError(f"{exc}: {step!r}") from None
        if "choose" in step or not any(k in steps[0] for k in ("tool", "text")):
            raise PlanError(f"only tool, text and harness-neutral steps (and choose options) think: {step!r}")
        steps[0] = {**steps[0], "think": step["think"]}
        return steps

    def _resolve(self, step: Mapping[str, Any], ctx: HarnessContext) -> list[dict[str, Any]]:
        if "choose" in step and isinstance(step["choose"], list):
            options = [self.resolve_step(o, ctx) if isinstance(o, Mapping) else [o] for o in step["choose"]]
            if any(len(o) != 1 for o in options):
                raise PlanError(f"{self.name}: a choose option must resolve to exactly one step: {step!r}")
            if mixed_thinking([o[0] for o in options]):
                raise PlanError(f"{self.name}: a choose step's options must all think or all not: {step!r}")
            return [{**step, "choose": [o[0] for o in options]}]
        if "shell" in step:
            if not isinstance(step["shell"], str):
                raise PlanError(f"shell step needs a command string: {step!r}")
            return [{"tool": self.shell_tool, "arguments": self.shell_arguments(step["shell"])}]
        if "edit" in step:
            path = _step_field(step, "edit", "path")
            old, new = _step_field(step, "edit", "old"), _step_field(step, "edit", "new")
            out: list[dict[str, Any]] = []
            if self.read_before_edit and self.read_tool:
                out.append({"tool": self.read_tool, "arguments": self.read_arguments(ctx, path)})
            if self.edit_tool is None:
                raise PlanError(f"{self.name} has no edit tool")
            out.append({"tool": self.edit_tool, "arguments": self.edit_arguments(ctx, path, old, new)})
            return out
        if "write" in step:
            path, content = _step_field(step, "write", "path"), _step_field(step, "write", "content")
            if self.write_tool is None:
                raise PlanError(f"{self.name} has no write tool")
            out = []
            # overwriting a file this session has not read is refused like an edit; the check runs where the plan is
            # resolved (the host, before the run), so it sees the workdir the CLI will see
            if self.read_before_edit and self.read_tool and Path(ctx.path(path)).exists():
                out.append({"tool": self.read_tool, "arguments": self.read_arguments(ctx, path)})
            out.append({"tool": self.write_tool, "arguments": self.write_arguments(ctx, path, content)})
            return out
        if any(k in step for k in ("tool", "text", "live", "replay", "next_best")):
            return [dict(step)]
        raise PlanError(f"unknown plan step kind: {sorted(step)}")

    # --- helpers for subclasses -----------------------------------------------------------------------------

    @staticmethod
    def skill_files(prefix: str, skills: Mapping[str, str]) -> dict[str, str]:
        """`<prefix>/<name>/SKILL.md` for each skill (the layout every CLI with skills reads)."""
        return {f"{prefix}/{name}/SKILL.md": text for name, text in sorted(skills.items())}

    @staticmethod
    def dump_json(obj: Any) -> str:
        return json.dumps(obj, indent=2, sort_keys=False) + "\n"


def resolve_plan(plan: Mapping[str, Any], adapter: HarnessAdapter, ctx: HarnessContext) -> dict[str, Any]:
    """A plan with every harness-neutral step resolved into this adapter's native tool steps."""
    steps: Sequence[Any] = plan.get("steps") or ()
    out: list[dict[str, Any]] = []
    for step in steps:
        if not isinstance(step, Mapping):
            raise PlanError(f"plan step must be an object, got {step!r}")
        out.extend(adapter.resolve_step(step, ctx))
    return {**plan, "steps": out}
