# SPDX-License-Identifier: Apache-2.0
"""Golden-file tests: the settings / MCP / skill files each adapter writes into the session HOME.

Regenerate after an intended change with `POLAR_UPDATE_GOLDEN=1 pytest tests/harness/test_golden.py`, then
review the diff like code.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
from nemo_polar.harness_adapters import BUILTIN, HarnessContext, McpServer, get_adapter

GOLDEN = Path(__file__).parent / "golden"
MCP = (
    McpServer(name="files", command="npx", args=("-y", "mcp-files", "--root", "/work"), env={"LOG": "0"}),
    McpServer(name="remote", url="http://127.0.0.1:7777/mcp"),
)
SKILLS = {"polar-test": "---\nname: polar-test\ndescription: a test skill\n---\nSay hello.\n"}


def _ctx(name: str) -> HarnessContext:
    full = name not in ("pi", "mini_swe_agent")  # neither has an MCP client
    return HarnessContext(
        base_url="http://127.0.0.1:18080",
        api_key="sk-polar-session-secret",
        model="tiny-qwen3",
        workdir="/sandbox/workdir",
        home="/sandbox/home",
        mcp_servers=MCP if full else (),
        skills=SKILLS if name != "mini_swe_agent" else {},
        command_line="python3 agent.py {instruction}",
    )


@pytest.mark.parametrize("name", list(BUILTIN))
def test_prepared_files_match_golden(name: str) -> None:
    files = get_adapter(name).prepare(_ctx(name))
    root = GOLDEN / name
    if os.environ.get("POLAR_UPDATE_GOLDEN"):
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        (root / "FILES").parent.mkdir(parents=True, exist_ok=True)
        (root / "FILES").write_text("".join(f"{rel}\n" for rel in sorted(files)))
    listed = (root / "FILES").read_text().split()
    assert sorted(files) == listed, "the set of written files changed"
    for rel, text in files.items():
        assert text == (root / rel).read_text(), f"{name}: {rel} differs from its golden file"


@pytest.mark.parametrize("name", list(BUILTIN))
def test_prepared_files_parse_and_point_at_the_proxy(name: str) -> None:
    """Every config file parses in its own format and names the proxy and the session key (none the real APIs)."""
    ctx = _ctx(name)
    files = get_adapter(name).prepare(ctx)
    for rel, text in files.items():
        if rel.endswith(".json") or rel.endswith(".yaml"):
            json.loads(text)
        elif rel.endswith(".toml"):
            tomllib.loads(text)
    blob = "\n".join(files.values()) + "\n" + json.dumps(get_adapter(name).env(ctx))
    if name != "shell":
        assert "127.0.0.1:18080" in blob
        assert ctx.api_key in blob
    for host in ("api.anthropic.com", "api.openai.com", "googleapis.com", "dashscope", "opencode.ai/zen"):
        assert host not in blob


def test_mcp_servers_use_each_cli_schema() -> None:
    claude = json.loads(get_adapter("claude_code").prepare(_ctx("claude_code"))[".claude.json"])
    assert claude["mcpServers"]["files"] == {
        "type": "stdio",
        "command": "npx",
        "args": ["-y", "mcp-files", "--root", "/work"],
        "env": {"LOG": "0"},
    }
    assert claude["mcpServers"]["remote"] == {"type": "http", "url": "http://127.0.0.1:7777/mcp"}
    codex = tomllib.loads(get_adapter("codex").prepare(_ctx("codex"))[".codex/config.toml"])
    assert codex["mcp_servers"]["files"]["args"] == ["-y", "mcp-files", "--root", "/work"]
    assert codex["mcp_servers"]["remote"]["url"] == "http://127.0.0.1:7777/mcp"
    assert codex["model_providers"]["polar"]["base_url"] == "http://127.0.0.1:18080/v1"
    gemini = json.loads(get_adapter("gemini_cli").prepare(_ctx("gemini_cli"))[".gemini/settings.json"])
    assert gemini["mcpServers"]["remote"] == {"httpUrl": "http://127.0.0.1:7777/mcp"}
    assert gemini["security"]["auth"]["selectedType"] == "gemini-api-key"
    opencode = json.loads(get_adapter("opencode").prepare(_ctx("opencode"))[".config/opencode/opencode.json"])
    assert opencode["mcp"]["files"]["command"] == ["npx", "-y", "mcp-files", "--root", "/work"]
    assert opencode["mcp"]["remote"]["type"] == "remote"


def test_harnesses_without_mcp_refuse_servers() -> None:
    ctx = _ctx("claude_code")
    for name in ("pi", "mini_swe_agent"):
        with pytest.raises(ValueError, match="MCP"):
            get_adapter(name).prepare(ctx)
