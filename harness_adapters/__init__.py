# SPDX-License-Identifier: Apache-2.0
"""Harness adapters (imported as `nemo_polar.harness_adapters`): one module per coding CLI, and the registry.

`get_adapter(name)` returns an adapter by its registry key (the YAML value: `claude_code`, `codex`,
`gemini_cli`, `qwen_code`, `opencode`, `pi`, `mini_swe_agent`, `shell`) or by a dotted path
(`my_pkg.my_module:MyAdapter` or `my_pkg.my_module.MyAdapter`) to a user's own `HarnessAdapter` subclass.
This module imports adapters lazily; it never imports the proxy, the rollout service or credit.
"""

from __future__ import annotations

import importlib

from .base import HarnessAdapter, HarnessContext, McpServer, PlanError, resolve_plan

__all__ = [
    "BUILTIN",
    "HarnessAdapter",
    "HarnessContext",
    "McpServer",
    "PlanError",
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


def _load(module: str, attr: str) -> HarnessAdapter:
    obj = getattr(importlib.import_module(module), attr)
    adapter = obj() if isinstance(obj, type) else obj
    if not isinstance(adapter, HarnessAdapter):
        raise TypeError(f"{module}.{attr} is not a HarnessAdapter")
    return adapter


def get_adapter(name: str) -> HarnessAdapter:
    """An adapter instance by registry key or dotted path; `KeyError` names the known keys when not found."""
    if name in BUILTIN:
        module, attr = BUILTIN[name].split(":")
        return _load(f"{__name__}.{module}", attr)
    if ":" in name:
        module, attr = name.split(":", 1)
    elif "." in name:
        module, attr = name.rsplit(".", 1)
    else:
        raise KeyError(f"unknown harness {name!r}; built-in: {', '.join(BUILTIN)}; or give a dotted path")
    try:
        return _load(module, attr)
    except (ImportError, AttributeError) as exc:
        raise KeyError(f"cannot load harness adapter {name!r}: {exc}") from exc
