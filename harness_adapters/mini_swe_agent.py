# SPDX-License-Identifier: Apache-2.0
"""mini-swe-agent (PyPI `mini-swe-agent`, in its own cached venv): OpenAI Chat through LiteLLM, `mini -y`.

Writes `~/.config/mini-swe-agent/polar.yaml`, merged over the packaged `mini.yaml`: the model as LiteLLM's
`openai/<model>` with `api_base` at the proxy, cost tracking errors ignored (the served model has no price),
yolo mode, exit without confirmation, the workdir as the environment's cwd. LiteLLM's remote price map is not
fetched (`LITELLM_LOCAL_MODEL_COST_MAP`). No MCP, no skills.

mini-swe-agent has one tool, `bash`; edits and writes are shell commands (it has no other edit tool), and the
agent ends when a command prints `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`. Every request is the main agent.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from .base import HarnessAdapter, HarnessContext, Role

CONFIG_PATH = ".config/mini-swe-agent/polar.yaml"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _python_edit(path: str, old: str, new: str) -> str:
    prog = (
        "import sys,pathlib;p=pathlib.Path(sys.argv[1]);t=p.read_text();"
        "assert t.count(sys.argv[2])==1,'old text must occur exactly once';"
        "p.write_text(t.replace(sys.argv[2],sys.argv[3]))"
    )
    return shlex.join(["python3", "-c", prog, path, old, new])


class MiniSweAgentAdapter(HarnessAdapter):
    name = "mini_swe_agent"
    package = "mini-swe-agent"
    package_kind = "pypi"
    version = "2.4.6"
    executable = "mini"
    dialect = "openai_chat"
    shell_tool = "bash"
    edit_tool = "bash"
    write_tool = "bash"
    role_hints: ClassVar[Mapping[str, Role]] = {}
    submit_command = SUBMIT

    def prepare(self, ctx: HarnessContext) -> dict[str, str]:
        if ctx.mcp_servers or ctx.skills:
            raise ValueError("mini_swe_agent supports neither MCP servers nor skills")
        agent: dict[str, Any] = {"mode": "yolo", "confirm_exit": False, "cost_limit": 0}
        if ctx.max_turns is not None:
            agent["step_limit"] = ctx.max_turns
        config = {
            "agent": agent,
            "environment": {"cwd": ctx.workdir, "timeout": 120},
            "model": {
                "model_name": f"openai/{ctx.model}",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {
                    "api_base": ctx.base_url.rstrip("/") + "/v1",
                    "api_key": ctx.api_key,
                    "drop_params": True,
                    # LiteLLM gives a chat call 600 s unless told (its `completion_timeout.py`): shorter than the
                    # proxy may keep a call silent (docs/harnesses.md, "Silent calls")
                    "timeout": ctx.idle_timeout_s,
                },
            },
        }
        return {CONFIG_PATH: json.dumps(config, indent=2) + "\n"}  # JSON is YAML

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        env = super().env(ctx)
        env.update(
            {
                "MSWEA_CONFIGURED": "true",
                "MSWEA_SILENT_STARTUP": "1",
                "MSWEA_GLOBAL_CONFIG_DIR": f"{ctx.home.rstrip('/')}/.config/mini-swe-agent",
                "MSWEA_COST_TRACKING": "ignore_errors",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_TELEMETRY": "False",
            }
        )
        return env

    def command(self, ctx: HarnessContext, instruction: str) -> list[str]:
        config = f"{ctx.home.rstrip('/')}/{CONFIG_PATH}"
        argv = [self.executable_path(ctx), "-y", "--exit-immediately", "-c", "mini.yaml", "-c", config]
        return [*argv, "-o", f"{ctx.home.rstrip('/')}/trajectory.json", "-t", instruction]

    def edit_arguments(self, ctx: HarnessContext, path: str, old: str, new: str) -> dict[str, Any]:
        return {"command": _python_edit(ctx.path(path), old, new)}

    def write_arguments(self, ctx: HarnessContext, path: str, content: str) -> dict[str, Any]:
        return {"command": f"cat > {shlex.quote(ctx.path(path))} <<'POLAR_EOF'\n{content}POLAR_EOF"}
