# SPDX-License-Identifier: Apache-2.0
"""Unit tests of the adapter protocol: registry, argv, environment, plan resolution, request classification."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from nemo_polar.harness_adapters import BUILTIN, HarnessAdapter, HarnessContext, PlanError, get_adapter, resolve_plan
from nemo_polar.harness_adapters.base import IDLE_MARGIN_S, PROXY_ENV_VARS, STREAM_IDLE_TIMEOUT_S, cli_idle_limit_s
from nemo_polar.harness_adapters.codex import MAIN_AGENT

from nemo_polar.proxy.config import ProxyConfig
from nemo_polar.runtime.harness import make_context
from nemo_polar.types import CallKind

CTX = HarnessContext(
    base_url="http://127.0.0.1:18080",
    api_key="sk-session",
    model="tiny-qwen3",
    workdir="/sandbox/workdir",
    home="/sandbox/home",
    command_line="python3 agent.py {instruction}",
)
PLAN = {
    "version": 1,
    "steps": [
        {"shell": "printf 'hello\\n' > notes.txt"},
        {"edit": {"path": "notes.txt", "old": "hello", "new": "hello polar"}},
        {"text": "done"},
    ],
    "side": "live",
}


def _req(system: str = "", tools: tuple[str, ...] = (), **extra: object) -> dict[str, object]:
    messages: list[dict[str, object]] = [{"role": "user", "content": "hi"}]
    if system:
        messages.insert(0, {"role": "system", "content": [{"type": "text", "text": system}]})
    fn = [{"type": "function", "function": {"name": t, "parameters": {"type": "object"}}} for t in tools]
    return {"model": "m", "messages": messages, "tools": fn, **extra}


def test_registry_knows_the_eight_adapters_by_their_name() -> None:
    assert set(BUILTIN) == {
        "claude_code",
        "codex",
        "gemini_cli",
        "qwen_code",
        "opencode",
        "pi",
        "mini_swe_agent",
        "shell",
    }
    for name in BUILTIN:
        adapter = get_adapter(name)
        assert adapter.name == name
        if name != "shell":
            assert adapter.package and adapter.version and adapter.package_kind in ("npm", "pypi")


def test_registry_loads_a_dotted_path_and_rejects_unknown_names() -> None:
    assert get_adapter("nemo_polar.harness_adapters.pi:PiAdapter").name == "pi"
    assert get_adapter("nemo_polar.harness_adapters.codex.CodexAdapter").name == "codex"
    with pytest.raises(KeyError, match="built-in"):
        get_adapter("vim")
    with pytest.raises(KeyError, match="cannot load"):
        get_adapter("nemo_polar.harness_adapters.nope:Adapter")
    with pytest.raises(TypeError):
        get_adapter("nemo_polar.harness_adapters.base:PlanError")


@pytest.mark.parametrize("name", list(BUILTIN))
def test_command_is_headless_and_carries_the_instruction(name: str) -> None:
    argv = get_adapter(name).command(CTX, "fix the bug")
    assert argv and all(isinstance(a, str) for a in argv)
    assert any("fix the bug" in a for a in argv)


@pytest.mark.parametrize("name", list(BUILTIN))
def test_env_sets_home_and_clears_proxies(name: str) -> None:
    adapter = get_adapter(name)
    env = adapter.env(CTX)
    assert env["HOME"] == CTX.home
    assert set(PROXY_ENV_VARS) - {"NO_PROXY", "no_proxy"} <= set(adapter.env_unset)
    assert not {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} & set(env)
    if name == "qwen_code":  # it ignores NO_PROXY: nothing proxy-related may reach it
        assert not set(PROXY_ENV_VARS) & set(env)


def test_telemetry_and_update_checks_are_off() -> None:
    claude = get_adapter("claude_code").env(CTX)
    assert claude["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and claude["DISABLE_AUTOUPDATER"] == "1"
    opencode = get_adapter("opencode").env(CTX)
    assert opencode["OPENCODE_DISABLE_AUTOUPDATE"] == "1" and opencode["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    assert get_adapter("pi").env(CTX)["PI_OFFLINE"] == "1"
    assert get_adapter("mini_swe_agent").env(CTX)["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"


def _cli_idle_limits_ms(ctx: HarnessContext) -> dict[str, int]:
    """Every idle limit the adapters set, in ms, by where it is set."""
    claude = get_adapter("claude_code").env(ctx)
    assert claude["API_FORCE_IDLE_TIMEOUT"] == "0"
    codex = tomllib.loads(get_adapter("codex").prepare(ctx)[".codex/config.toml"])
    opencode = json.loads(get_adapter("opencode").prepare(ctx)[".config/opencode/opencode.json"])
    options = opencode["provider"]["polar"]["options"]
    mini = json.loads(get_adapter("mini_swe_agent").prepare(ctx)[".config/mini-swe-agent/polar.yaml"])
    return {
        "claude_code CLAUDE_STREAM_IDLE_TIMEOUT_MS": int(claude["CLAUDE_STREAM_IDLE_TIMEOUT_MS"]),
        "claude_code API_TIMEOUT_MS": int(claude["API_TIMEOUT_MS"]),
        "qwen_code QWEN_CODE_API_TIMEOUT_MS": int(get_adapter("qwen_code").env(ctx)["QWEN_CODE_API_TIMEOUT_MS"]),
        "codex stream_idle_timeout_ms": codex["model_providers"]["polar"]["stream_idle_timeout_ms"],
        "opencode headerTimeout": options["headerTimeout"],
        "opencode chunkTimeout": options["chunkTimeout"],
        "mini_swe_agent timeout": int(mini["model"]["model_kwargs"]["timeout"] * 1000),
    }


def test_cli_idle_limits_outlast_the_longest_silence_the_proxy_allows() -> None:
    """A call held by a paused admission, then by a silent upstream, stays silent up to the proxy's two limits; the
    CLIs whose own limit is shorter (300 s; LiteLLM's 600 s) get it raised, so they do not abandon and resend a held
    call. The default context gives `STREAM_IDLE_TIMEOUT_S`, which outlasts the proxy's default limits."""
    proxy = ProxyConfig(upstreams=["http://127.0.0.1:1"], store_dir="unused")
    assert STREAM_IDLE_TIMEOUT_S > proxy.pause_wait_s + proxy.read_timeout_s
    assert cli_idle_limit_s(proxy.pause_wait_s, proxy.read_timeout_s) == STREAM_IDLE_TIMEOUT_S == CTX.idle_timeout_s
    limits = _cli_idle_limits_ms(CTX)
    assert limits == dict.fromkeys(limits, STREAM_IDLE_TIMEOUT_S * 1000)


def test_a_proxy_with_longer_limits_gives_the_clis_longer_ones() -> None:
    """Limits raised on the proxy (a long weight update, a slow engine) raise the CLIs' past them, by the margin."""
    limit = cli_idle_limit_s(pause_wait_s=1800, read_timeout_s=2400.5)
    assert limit == 4201 + IDLE_MARGIN_S
    ctx = HarnessContext(**{**{f: getattr(CTX, f) for f in CTX.__dataclass_fields__}, "idle_timeout_s": limit})
    limits = _cli_idle_limits_ms(ctx)
    assert limits == dict.fromkeys(limits, limit * 1000)
    with pytest.raises(ValueError, match="pause_wait_s=-1"):
        cli_idle_limit_s(pause_wait_s=-1, read_timeout_s=600)


# native shapes: (shell tool, shell args, edit tool, key holding the path in the edit args)
NATIVE = {
    "claude_code": ("Bash", "command", "Edit", "file_path"),
    "codex": ("exec_command", "cmd", "exec_command", None),
    "gemini_cli": ("run_shell_command", "command", "replace", "file_path"),
    "qwen_code": ("run_shell_command", "command", "edit", "file_path"),
    "opencode": ("bash", "command", "edit", "filePath"),
    "pi": ("bash", "command", "edit", "path"),
    "mini_swe_agent": ("bash", "command", "bash", None),
    "shell": ("bash", "command", "edit", "path"),
}


@pytest.mark.parametrize("name", list(BUILTIN))
def test_plan_steps_resolve_to_native_tool_calls(name: str) -> None:
    shell_tool, shell_key, edit_tool, path_key = NATIVE[name]
    steps = resolve_plan(PLAN, get_adapter(name), CTX)["steps"]
    assert steps[0] == {"tool": shell_tool, "arguments": steps[0]["arguments"]}
    assert steps[0]["arguments"][shell_key] == "printf 'hello\\n' > notes.txt"
    assert steps[-1] == {"text": "done"}
    edit = steps[-2]
    assert edit["tool"] == edit_tool
    if path_key is not None:
        assert edit["arguments"][path_key] == "/sandbox/workdir/notes.txt"
    else:
        assert "/sandbox/workdir/notes.txt" in next(iter(edit["arguments"].values()))
    if name in ("claude_code", "opencode", "qwen_code"):  # these refuse to edit a file the session has not read
        assert len(steps) == 4 and steps[1]["tool"] in ("Read", "read", "read_file")


@pytest.mark.parametrize("name", ["claude_code", "opencode", "qwen_code", "pi"])
def test_write_onto_an_existing_file_reads_it_first_where_the_cli_requires(name: str, tmp_path: Path) -> None:
    adapter = get_adapter(name)
    ctx = make_context(adapter, base_url="http://127.0.0.1:1", api_key="-", model="m", workdir=tmp_path, home=tmp_path)
    (tmp_path / "old.txt").write_text("x\n")
    over = adapter.resolve_step({"write": {"path": "old.txt", "content": "y\n"}}, ctx)
    fresh = adapter.resolve_step({"write": {"path": "new.txt", "content": "y\n"}}, ctx)
    assert [s["tool"] for s in fresh] == [adapter.write_tool]
    want = [adapter.read_tool, adapter.write_tool] if adapter.read_before_edit else [adapter.write_tool]
    assert [s["tool"] for s in over] == want


def test_codex_patch_grammar() -> None:
    step = get_adapter("codex").resolve_step({"edit": {"path": "a.py", "old": "x = 1\ny = 2", "new": "x = 3"}}, CTX)
    assert step[0]["tool"] == "exec_command"
    assert step[0]["arguments"]["cmd"] == (
        "apply_patch <<'PATCH'\n*** Begin Patch\n*** Update File: /sandbox/workdir/a.py\n@@\n-x = 1\n-y = 2\n+x = 3\n"
        "*** End Patch\nPATCH"
    )
    write = get_adapter("codex").resolve_step({"write": {"path": "/abs/b.txt", "content": "one\ntwo\n"}}, CTX)
    assert write[0]["arguments"]["cmd"] == (
        "apply_patch <<'PATCH'\n*** Begin Patch\n*** Add File: /abs/b.txt\n+one\n+two\n*** End Patch\nPATCH"
    )


def test_codex_classification_reads_its_turn_metadata() -> None:
    import json

    c = get_adapter("codex").classify_request

    def original(**meta: str) -> dict[str, object]:
        return {"client_metadata": {"x-codex-turn-metadata": json.dumps(meta)}}

    tools = _req("dev", ("exec_command",))
    # Codex names agents by their place in its agent tree (MAIN_AGENT is the main agent), not by a file path
    assert c(tools, original(agent_name=MAIN_AGENT, request_kind="turn")) == CallKind.MAIN
    assert c(tools, original(agent_name=f"{MAIN_AGENT}/worker_1", request_kind="turn")) == CallKind.SUBAGENT
    assert c(tools, original(agent_name=MAIN_AGENT, request_kind="compact")) == CallKind.SIDE
    assert c(tools, {"client_metadata": {"x-codex-turn-metadata": "not json"}}) == CallKind.MAIN


def test_mini_swe_agent_edit_is_a_working_shell_command(tmp_path: object) -> None:
    import subprocess
    from pathlib import Path

    work = Path(str(tmp_path))
    (work / "f.txt").write_text("it's a 'quoted' line\n")
    ctx = HarnessContext(base_url="http://127.0.0.1:1", api_key="k", model="m", workdir=str(work), home=str(work))
    adapter = get_adapter("mini_swe_agent")
    (edit,) = adapter.resolve_step({"edit": {"path": "f.txt", "old": "'quoted'", "new": '"$HOME" `x`'}}, ctx)
    subprocess.run(["bash", "-c", edit["arguments"]["command"]], check=True, timeout=30)
    assert (work / "f.txt").read_text() == 'it\'s a "$HOME" `x` line\n'
    (write,) = adapter.resolve_step({"write": {"path": "g.txt", "content": "a $b\n"}}, ctx)
    subprocess.run(["bash", "-c", write["arguments"]["command"]], check=True, timeout=30)
    assert (work / "g.txt").read_text() == "a $b\n"


def test_bad_plan_steps_are_rejected() -> None:
    adapter = get_adapter("pi")
    with pytest.raises(PlanError):
        adapter.resolve_step({"edit": {"path": "a"}}, CTX)
    with pytest.raises(PlanError):
        adapter.resolve_step({"dance": 1}, CTX)
    with pytest.raises(PlanError):
        resolve_plan({"steps": ["echo"]}, adapter, CTX)
    assert adapter.resolve_step({"replay": "rec-1"}, CTX) == [{"replay": "rec-1"}]


def test_claude_code_classification() -> None:
    c = get_adapter("claude_code").classify_request
    main_sys = "You are Claude Code, Anthropic's official CLI for Claude."
    assert c(_req(main_sys, ("Bash", "Read", "Edit", "Agent"))) == CallKind.MAIN
    assert c(_req(main_sys, ("Bash", "Task"))) == CallKind.MAIN
    assert c(_req(main_sys)) == CallKind.SIDE  # title / topic helpers carry no tools
    sub_sys = "You are an agent for Claude Code, Anthropic's official CLI for Claude. Given the user's message"
    assert c(_req(sub_sys, ("Bash", "Read"))) == CallKind.SUBAGENT
    assert c(_req("You are a file search specialist for Claude Code", ("Read", "Agent"))) == CallKind.SUBAGENT
    assert c(_req(main_sys, ("Bash", "Read"))) == CallKind.SUBAGENT
    sdk = (
        "You are a Claude agent, built on Anthropic's Claude Agent SDK.\nYou are an interactive agent that helps users"
    )
    assert c(_req(sdk, ("Bash", "Read"))) == CallKind.MAIN  # what 2.1.197 sends in -p mode


def test_gemini_classification() -> None:
    c = get_adapter("gemini_cli").classify_request
    router = _req("You are a router", (), response_format={"type": "json_schema", "json_schema": {"schema": {}}})
    assert c(router) == CallKind.SIDE
    original = {"contents": [], "generationConfig": {"responseJsonSchema": {"type": "object"}}}
    assert c(_req("x", ("run_shell_command",)), original) == CallKind.SIDE
    assert c(_req("x", ("run_shell_command", "replace", "invoke_agent"))) == CallKind.MAIN
    assert c(_req("x", ("read_file", "complete_task"))) == CallKind.SUBAGENT


def test_qwen_classification() -> None:
    c = get_adapter("qwen_code").classify_request
    tools = ("run_shell_command", "edit", "agent")
    assert c(_req("You are Qwen Code", tools)) == CallKind.MAIN
    memory = "You are now acting as the managed memory extraction subagent for an AI coding assistant."
    assert c(_req(memory, ("read_file", "write_file", "edit"))) == CallKind.SIDE
    assert c(_req("You are Qwen Code", ("read_file", "grep_search"))) == CallKind.SUBAGENT
    assert c(_req("You are Qwen Code")) == CallKind.SIDE
    # the next-speaker check goes through Qwen Code's JSON helper: one `respond_in_schema` tool, a side call
    assert c(_req("You are Qwen Code", ("respond_in_schema",))) == CallKind.SIDE


def test_opencode_classification() -> None:
    c = get_adapter("opencode").classify_request
    assert c(_req("You are a title generator. You output ONLY a thread title.")) == CallKind.SIDE
    assert c(_req("You are opencode", ("bash", "edit", "task"))) == CallKind.MAIN
    assert c(_req("You are opencode", ("bash", "read"))) == CallKind.SUBAGENT


@pytest.mark.parametrize("name", ["codex", "pi"])
def test_tool_less_requests_are_side_calls(name: str) -> None:
    c = get_adapter(name).classify_request
    assert c(_req("sys", ("a",))) == CallKind.MAIN
    assert c(_req("summarize")) == CallKind.SIDE


def test_pi_selects_each_of_its_four_provider_apis() -> None:
    import json
    from dataclasses import replace

    adapter = get_adapter("pi")
    urls = {}
    for api in ("openai-completions", "openai-responses", "anthropic-messages", "google-generative-ai"):
        models = json.loads(adapter.prepare(replace(CTX, provider_api=api))[".pi/agent/models.json"])
        urls[api] = models["providers"]["polar"]["baseUrl"]
        assert models["providers"]["polar"]["api"] == api
    assert urls["anthropic-messages"] == "http://127.0.0.1:18080"
    assert urls["google-generative-ai"] == "http://127.0.0.1:18080/v1beta"
    with pytest.raises(ValueError, match="provider_api"):
        adapter.prepare(replace(CTX, provider_api="bedrock"))


def test_role_hints_use_only_call_credit_roles() -> None:
    for name in BUILTIN:
        adapter = get_adapter(name)
        assert set(adapter.role_hints.values()) <= {"IG", "AE", "RV"}
        assert adapter.shell_tool not in adapter.role_hints  # a shell call's role comes from its command


def test_a_user_adapter_subclass_gets_the_protocol_defaults() -> None:
    class Mine(HarnessAdapter):
        name = "mine"

    assert Mine().classify_request(_req()) == CallKind.MAIN
    assert Mine().prepare(CTX) == {}
