# SPDX-License-Identifier: Apache-2.0
"""Harness adapters (imported as `nemo_polar.harness_adapters`): one module per coding CLI, and the registry.

`get_adapter(name)` returns an adapter by its registry key (the YAML value: `claude_code`, `codex`,
`gemini_cli`, `qwen_code`, `opencode`, `pi`, `mini_swe_agent`, `shell`) or by a dotted path
(`my_pkg.my_module:MyAdapter` or `my_pkg.my_module.MyAdapter`) to a user's own `HarnessAdapter` subclass.
Paths are resolved by `nemo_polar.loading.load_object`; a name that cannot be resolved raises
`nemo_polar.errors.LoadError` (a `KeyError`). This module imports adapters lazily; it never imports the proxy, the
rollout service or credit.
"""

from __future__ import annotations

from nemo_polar.errors import LoadError
from nemo_polar.loading import is_dotted_path, load_object

from .base import HarnessAdapter, HarnessContext, McpServer, PlanError, cli_idle_limit_s, resolve_plan

__all__ = [
    "BUILTIN",
    "HarnessAdapter",
    "HarnessContext",
    "McpServer",
    "PlanError",
    "cli_idle_limit_s",
    "get_adapter",
    "resolve_plan",
]

# registry key -> "module:Class" (relative to this package)
BUILTIN: dict[str, str] = {
    "claude_code": "claude_code:ClaudeCodeAdapter",
    "codex": "codex:CodexAdapter",
    "gemini_cli": "gemini_cli:GeminiCliAdapter",
    "qwen_code": "qwen_code:QwenCodeAdapter",
    "opencode": "opencode:OpenCodeAdapter",
    "pi": "pi:PiAdapter",
    "mini_swe_agent": "mini_swe_agent:MiniSweAgentAdapter",
    "shell": "shell:ShellAdapter",
}


def _load(path: str) -> HarnessAdapter:
    obj = load_object(path, what="harness adapter")
    adapter = obj() if isinstance(obj, type) else obj
    if not isinstance(adapter, HarnessAdapter):
        raise TypeError(f"{path} is not a HarnessAdapter")
    return adapter


def get_adapter(name: str) -> HarnessAdapter:
    """An adapter instance by registry key or dotted path; `LoadError` (a `KeyError`) names the known keys or the
    path that failed."""
    if name in BUILTIN:
        return _load(f"{__name__}.{BUILTIN[name]}")
    if not is_dotted_path(name):
        raise LoadError(f"unknown harness {name!r}; built-in: {', '.join(BUILTIN)}; or give a dotted path")
    return _load(name)
