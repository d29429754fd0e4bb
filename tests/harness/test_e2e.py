# SPDX-License-Identifier: Apache-2.0
"""End to end, per adapter: the real CLI → the bubblewrap sandbox (only the proxy reachable) → a counting relay →
the real proxy → an upstream, with a forced plan: (1) a shell command writes a file, (2) the CLI's own edit tool
edits it, (3) a text answer ends the session.

Two upstreams:
- `vllm`: real vLLM-CPU `tiny-qwen3` (fixture `vllm_qwen3` from tests/fixtures_backend.py); the acceptance run,
  which also asserts exactly one main trace from the prefix-merging builder.
- `fake`: the proxy's FAKE upstream (`polar_lab.fake_upstream`, named as a fake): it checks the wiring
  between CLI, adapter, sandbox and proxy (native tool shapes, results coming back, classification, counts) in
  seconds; it claims nothing about what a model produced, so no trace assertion is made with it.

Each test asserts: exit 0; the file's final content; model calls counted by the relay == records, each classified;
each forced tool call reached the CLI in its native shape and its result came back in the next main request; the
connect trace shows the relay's port as the only destination.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web
from nemo_polar.harness_adapters import BUILTIN, HarnessAdapter, get_adapter, resolve_plan
from nemo_polar.harness_adapters.install import status as install_status

from nemo_polar.examples import tiny_agent_command
from nemo_polar.runtime.harness import make_context, run_harness
from nemo_polar.runtime.sandbox import bwrap_available
from nemo_polar.types import CallKind, CompletionRecord

from ..proxy.conftest import LoopThread
from .counting_relay import CountingRelay

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
T = TypeVar("T")
MODEL = "tiny-qwen3"
INSTRUCTION = "Create notes.txt containing hello, then change hello to hello polar."
PLAN = {
    "version": 1,
    "steps": [
        {"shell": "printf 'hello\\n' > notes.txt"},
        {"edit": {"path": "notes.txt", "old": "hello", "new": "hello polar"}},
        {"text": "Done: notes.txt now says hello polar."},
    ],
    "side": "live",
}
# live calls (side calls, anything after the plan) on a random-weight model are noise: keep them short
SAMPLING = {"max_tokens": 64, "temperature": 0.0}
# kinds each harness is expected to produce besides `main` in this short session
EXTRA_KINDS = {"qwen_code": {"side"}, "opencode": {"side"}}


@dataclass
class Stack:
    kind: str
    lt: LoopThread
    proxy: Any
    relay: CountingRelay
    eot_token_ids: tuple[int, ...] = ()


def _start_stack(kind: str, upstream_url: str, served_model: str, tmp: Path, backend: Any = None) -> Stack:
    from nemo_polar.proxy.app import Proxy, ProxyConfig

    lt = LoopThread(timeout=600)
    extra: dict[str, Any] = {}
    if kind == "vllm":  # a whole session merges into one exact chain only with prefix-preserving generation
        extra = {
            "prefix_preserving": "splice",
            "model_dir": str(backend.model_dir),
            "eot_token_ids": list(backend.eot_token_ids),
        }
    proxy = Proxy(
        ProxyConfig(upstreams=[upstream_url], store_dir=str(tmp / "store"), served_model=served_model, **extra)
    )

    async def up() -> tuple[web.AppRunner, CountingRelay]:
        runner = proxy.runner()
        await runner.setup()
        site = proxy.site(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        proxy.base_url = f"http://127.0.0.1:{port}"
        relay = await CountingRelay(target=proxy.base_url).start()
        return runner, relay

    runner, relay = lt.run(up())
    stack = Stack(kind, lt, proxy, relay, tuple(backend.eot_token_ids) if backend is not None else ())
    stack.runner = runner  # type: ignore[attr-defined]
    return stack


def _stop_stack(stack: Stack) -> None:
    async def down() -> None:
        await stack.relay.stop()
        await stack.runner.cleanup()  # type: ignore[attr-defined]

    stack.lt.run(down())
    stack.lt.stop()


@pytest.fixture(scope="module", params=["fake", "vllm"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed (make test installs Debian `bubblewrap`)")
    if importlib.util.find_spec("nemo_polar.proxy.app") is None:
        pytest.skip("the proxy is not installed")
    tmp = tmp_path_factory.mktemp(f"e2e-{request.param}")
    if request.param == "fake":
        from polar_lab.fake_upstream import FakeUpstream

        lt0 = LoopThread(timeout=600)
        fake = FakeUpstream()
        lt0.run(fake.start())
        s = _start_stack("fake", fake.base_url, MODEL, tmp)
        yield s
        _stop_stack(s)
        lt0.run(fake.stop())
        lt0.stop()
        return
    if importlib.util.find_spec("tests.fixtures_backend") is None:
        pytest.skip("the vLLM-CPU backend fixtures (tests/fixtures_backend.py) have not landed yet")
    backend = request.getfixturevalue("vllm_qwen3")
    s = _start_stack("vllm", backend.base_url, backend.model, tmp, backend)
    yield s
    _stop_stack(s)


def _plan_for(adapter: HarnessAdapter, ctx: Any) -> dict[str, Any]:
    plan = resolve_plan(PLAN, adapter, ctx)
    if adapter.name == "mini_swe_agent":  # it ends on its submit command, not on a text answer
        plan["steps"][-1] = {"tool": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}
    return plan


def _tool_results(record: CompletionRecord) -> dict[str, str]:
    """tool_call_id -> result text of the tool messages in a record's normalised request."""
    out = {}
    for m in record.request.get("messages", []):
        if m.get("role") == "tool":
            c = m.get("content")
            text = c if isinstance(c, str) else json.dumps(c)
            out[str(m.get("tool_call_id"))] = text
    return out


def _check_forced_steps(plan: dict[str, Any], main: list[CompletionRecord], kind: str) -> None:
    steps = plan["steps"]
    ids_seen: set[str] = set()
    assert len(main) >= len(steps), f"{len(main)} main calls for {len(steps)} plan steps"
    for i, step in enumerate(steps):
        rec = main[i]
        assert rec.origin == "forced", f"main call {i} was not forced"
        if "tool" not in step:
            continue
        calls = rec.response["tool_calls"]
        assert [c["function"]["name"] for c in calls] == [step["tool"]], f"step {i}: {calls}"
        assert json.loads(calls[0]["function"]["arguments"]) == step["arguments"]
        if i + 1 == len(main):  # the session's last call (mini-swe-agent's submit): nothing comes after it
            continue
        duplicate = calls[0]["id"] in ids_seen
        ids_seen.add(calls[0]["id"])
        if kind == "fake" and duplicate:
            # the FAKE upstream numbers tool-call ids per reply (`chatcmpl-tool-0` every time); a CLI that keys its
            # history by id (Claude Code) keeps one of the duplicates. Real vLLM ids are unique.
            continue
        results = _tool_results(main[i + 1])
        assert calls[0]["id"] in results or len(results) > len(_tool_results(rec)), (
            f"the result of step {i} ({step['tool']}) did not come back in the next main request"
        )


def _wait_until_idle(stack: Stack, timeout_s: float = 300.0) -> None:
    """Wait for the proxy to finish what is still in flight (a call the CLI abandoned when it exited, e.g. a title
    generation, still completes and is recorded) — through its admin API."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    req = urllib.request.Request(
        stack.proxy.base_url + "/admin/status", headers={"Authorization": f"Bearer {stack.proxy.control_token}"}
    )
    while time.monotonic() < deadline:
        with urllib.request.urlopen(req, timeout=30) as resp:
            if json.loads(resp.read())["in_flight"] == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"the proxy still had calls in flight after {timeout_s:.0f} s")


def _first_drift(traj: Any) -> str:
    return json.dumps([t.metadata for t in traj.traces])[:2000]


@pytest.mark.parametrize("name", list(BUILTIN))
def test_harness_end_to_end(name: str, stack: Stack, tmp_path: Path) -> None:
    _run_plan(name, stack, tmp_path)


@pytest.mark.parametrize("api", ["openai-responses", "anthropic-messages", "google-generative-ai"])
def test_pi_speaks_each_provider_api(api: str, stack: Stack, tmp_path: Path) -> None:
    """Pi's other three provider APIs (the default, openai-completions, runs above), each through its dialect."""
    records = _run_plan("pi", stack, tmp_path, provider_api=api)
    expected = {"openai-responses": "openai_responses", "anthropic-messages": "anthropic_messages"}
    assert {r.dialect for r in records} == {expected.get(api, "google_genai")}


def _run_plan(name: str, stack: Stack, tmp_path: Path, **ctx_extra: Any) -> list[CompletionRecord]:
    adapter = get_adapter(name)
    if adapter.package is not None and not install_status(adapter).installed:
        pytest.fail(f"{name} is not installed: run `polar harness install {name}` (make test does)")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    extra: dict[str, Any] = {"max_turns": 10, **ctx_extra}
    if name == "shell":
        extra["command_line"] = tiny_agent_command()
    probe = make_context(
        adapter, base_url="http://127.0.0.1:1", api_key="-", model=MODEL, workdir=work, home=home, **extra
    )
    plan = _plan_for(adapter, probe)
    session = stack.lt.run(
        stack.proxy.create_session(plan=plan, classifier=adapter.classify_request, sampling=SAMPLING)
    )
    before = len(stack.relay.seen)
    ctx = make_context(
        adapter,
        base_url=f"http://127.0.0.1:{stack.relay.port}",
        api_key=session.api_key,
        model=MODEL,
        workdir=work,
        home=home,
        **extra,
    )
    res = stack.lt.run(run_harness(adapter, ctx, INSTRUCTION, timeout_s=300, out_dir=tmp_path / "out"), timeout=400)
    detail = f"exit {res.exit_code}\nstdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-3000:]}"
    assert res.ok, detail
    assert (work / "notes.txt").read_text() == "hello polar\n", detail

    _wait_until_idle(stack)
    records = sorted(stack.proxy.store.list_records(session.session_id, limit=10_000), key=lambda r: r.seq)
    counted = [r for r in stack.relay.seen[before:] if r in stack.relay.model_calls()]
    assert len(counted) == len(records), f"relay counted {len(counted)} model calls, proxy recorded {len(records)}"
    kinds = [r.call_kind for r in records]
    assert all(k in CallKind._value2member_map_ for k in kinds)
    assert set(kinds) - {"main"} <= EXTRA_KINDS.get(name, set()), kinds
    main = [r for r in records if r.call_kind == "main"]
    _check_forced_steps(plan, main, stack.kind)

    assert res.destinations == {f"127.0.0.1:{stack.relay.port}"}
    assert res.forwarded == len([e for e in res.connections if e["event"] == "connect"])

    if stack.kind == "vllm":
        from nemo_polar.trajectory.registry import build

        traj = build(records, builder="prefix_merging", eot_token_ids=list(stack.eot_token_ids))
        main_traces = [t for t in traj.traces if t.chain_kind == "main"]
        assert len(main_traces) == 1, f"{len(main_traces)} main traces; first drift: {_first_drift(traj)}"
    return records


def test_claude_code_forced_subagent_gets_its_own_chain(stack: Stack, tmp_path: Path) -> None:
    """A forced `Agent` call: the subagent's requests are classified `subagent` (and, on vLLM, build a subagent
    chain next to the one main chain)."""
    adapter = get_adapter("claude_code")
    if not install_status(adapter).installed:
        pytest.fail("claude_code is not installed: run `polar harness install claude_code` (make test does)")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    agent_call = {
        "description": "Check the workspace",
        "prompt": "List the files in the current directory and report what you see in one sentence.",
        "subagent_type": "general-purpose",
    }
    plan = {"version": 1, "steps": [{"tool": "Agent", "arguments": agent_call}, {"text": "Done."}], "side": "live"}
    session = stack.lt.run(
        stack.proxy.create_session(plan=plan, classifier=adapter.classify_request, sampling=SAMPLING)
    )
    ctx = make_context(
        adapter,
        base_url=f"http://127.0.0.1:{stack.relay.port}",
        api_key=session.api_key,
        model=MODEL,
        workdir=work,
        home=home,
        max_turns=10,
    )
    res = stack.lt.run(run_harness(adapter, ctx, "Use a subagent to look around.", timeout_s=300), timeout=400)
    assert res.ok, f"exit {res.exit_code}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    _wait_until_idle(stack)
    records = sorted(stack.proxy.store.list_records(session.session_id, limit=10_000), key=lambda r: r.seq)
    kinds = [r.call_kind for r in records]
    assert "subagent" in kinds and kinds.count("main") >= 2, kinds
    first_sub = kinds.index("subagent")
    assert kinds.index("main") < first_sub, "the subagent must start after the main agent's Agent call"
    if stack.kind == "vllm":
        from nemo_polar.trajectory.registry import build

        traj = build(records, builder="prefix_merging", eot_token_ids=list(stack.eot_token_ids))
        chain_kinds = [t.chain_kind for t in traj.traces]
        assert chain_kinds.count("main") == 1 and "subagent" in chain_kinds, chain_kinds
