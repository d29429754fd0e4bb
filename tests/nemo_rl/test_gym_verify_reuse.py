# SPDX-License-Identifier: Apache-2.0
"""On the Gym path the evaluation runs in the runtime the gateway prewarmed while the agent ran: `polar_swe`'s
`/verify` returns that verdict and builds no runtime of its own (issue 19).

Real parts, under the Gym NeMo RL runs (0.5.1): `polar_swe`'s app served by uvicorn (its lifespan hosts the Polar
stack: proxy, gateway, rollout server); `polar_agent.run` reaching it through Gym's own `ServerClient`; a sandboxed
session of the `shell` harness on the `intervals` example task that applies the fix and makes one model call
through the proxy; the gateway's `swe_tests`; `/verify`. The one fake: the vLLM-shaped upstream
(`polar_lab.fake_upstream`), which answers that one call (no model is judged here). Runtime creations are counted
by wrapping the real `create_runtime` where the gateway and `polar_swe` call it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shlex
import sys
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from nemo_polar.backend.server import free_port
from nemo_polar.rollout import stages

from .loopback import fake_upstream_thread, uvicorn_thread

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
POLAR_SWE = ROOT / "environments" / "resources_servers" / "polar_swe"
POLAR_AGENT = ROOT / "environments" / "responses_api_agents" / "polar_agent"
TASK = "polar-example__intervals"
# the example's fix (its fix_plan's edit), then one model call through the proxy, as a harness would make
MODEL_CALL = (
    "import json, os, urllib.request as u; "
    "body = {'model': os.environ['POLAR_MODEL'], 'messages': [{'role': 'user', 'content': 'fix it'}]}; "
    "u.urlopen(u.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=json.dumps(body).encode(), "
    "headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'}), "
    "timeout=60).read()"
)
COMMAND = r"sed -i 's/start < out\[-1\]\[1\]/start <= out[-1][1]/' intervals.py && python -c " + shlex.quote(
    MODEL_CALL
)


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _post(url: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as resp:
        return json.loads(resp.read()), time.monotonic() - t0


def test_gym_path_evaluates_in_the_prewarmed_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nemo_gym.global_config
    import nemo_gym.server_utils
    from nemo_gym.server_utils import BaseServerConfig, ServerClient
    from omegaconf import OmegaConf

    swe = _load("polar_swe_app_verify_reuse", POLAR_SWE / "app.py")
    agent_mod = _load("polar_agent_app_verify_reuse", POLAR_AGENT / "app.py")
    made: list[tuple[str, str, float]] = []
    destroyed: dict[str, float] = {}

    def counting(module: ModuleType, where: str) -> None:
        real = module.create_runtime

        async def create_runtime(name: str, *args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic()
            rt = await real(name, *args, **kwargs)
            made.append((where, name, time.monotonic() - t0))
            destroy = rt.destroy

            async def timed_destroy() -> None:
                t1 = time.monotonic()
                await destroy()
                destroyed[name] = time.monotonic() - t1

            rt.destroy = timed_destroy
            return rt

        monkeypatch.setattr(module, "create_runtime", create_runtime)

    counting(stages, "gateway")
    counting(swe, "verify")

    row = next(
        r for r in map(json.loads, (POLAR_SWE / "data" / "example.jsonl").read_text().splitlines()) if r
    )  # the first example row
    assert row["instance_id"] == TASK
    port = free_port()
    global_config = OmegaConf.create(
        {"polar_swe": {"resources_servers": {"polar_swe": {"host": "127.0.0.1", "port": port}}}}
    )
    # Gym's process-wide config and HTTP client, as a Gym server process has them (restored afterwards)
    monkeypatch.setattr(nemo_gym.global_config, "_GLOBAL_CONFIG_DICT", global_config)
    monkeypatch.setattr(nemo_gym.server_utils, "_GLOBAL_AIOHTTP_CLIENT", None)
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=free_port()), global_config_dict=global_config
    )
    swe_server = swe.PolarSweResourcesServer(
        config=swe.PolarSweResourcesServerConfig(
            host="127.0.0.1", port=port, entrypoint="app.py", name="polar_swe", work_dir=str(tmp_path / "run")
        ),
        server_client=client,
    )
    with fake_upstream_thread() as upstream, uvicorn_thread(swe_server.setup_webserver(), port) as swe_url:
        agent = agent_mod.PolarAgent(
            config=agent_mod.PolarAgentConfig(
                host="127.0.0.1",
                port=0,
                entrypoint="app.py",
                name="polar_agent",
                resources_server={"type": "resources_servers", "name": "polar_swe"},
                model_server={"type": "responses_api_models", "name": "policy_model"},
                harness="shell",
                upstream_url=f"{upstream}/v1",
                model="m",
                agent_options={"command_line": COMMAND},
                agent_timeout_s=120,
                session_timeout_s=300,
            ),
            server_client=client,
        )
        t0 = time.monotonic()

        async def run() -> Any:
            try:
                return await agent.run(agent_mod.PolarAgentRunRequest.model_validate(row))
            finally:
                if nemo_gym.server_utils._GLOBAL_AIOHTTP_CLIENT is not None:
                    await nemo_gym.server_utils._GLOBAL_AIOHTTP_CLIENT.close()

        out = asyncio.run(run())
        run_s = time.monotonic() - t0
        result = out.model_dump()
        assert result["reward"] == 1.0 and result["resolved"] is True, result.get("failure_reason")
        assert result["mask_sample"] is False and result["instance_config"] == {"mask_sample": False}
        assert result["evaluated_in"] == "session"
        assert len(result["response"]["output"]) > 0  # the model call reached the Gym record
        sessions = {name.rsplit(".", 1)[0] for _, name, _ in made}  # runtimes are named <session_id>.<role>
        (session_id,) = sessions
        # the agent's runtime and the evaluation runtime prewarmed while it ran; none built by /verify
        assert sorted((w, n.rsplit(".", 1)[1]) for w, n, _ in made) == [("gateway", "agent"), ("gateway", "fresh0")]

        diff = swe_server.stack.diff(session_id)
        assert diff and "start <= out[-1][1]" in diff
        body = {**row, "diff": diff, "response": result["response"]}
        again, reuse_s = _post(f"{swe_url}/verify", {**body, "polar_session_id": session_id})
        assert (again["evaluated_in"], again["reward"]) == ("session", 1.0) and len(made) == 2
        fresh, fresh_s = _post(f"{swe_url}/verify", body)  # the former path: a runtime built on the critical path
        assert (fresh["evaluated_in"], fresh["reward"], fresh["test_outcomes"]) == (
            "fresh",
            1.0,
            result["test_outcomes"],
        )
        assert [w for w, _, _ in made[2:]] == ["verify"]
        # a diff the gateway did not evaluate is evaluated here, not answered from the session's verdict
        other = diff.replace("start <= out[-1][1]", "start <= out[-1][1] + 0")
        tampered, _ = _post(f"{swe_url}/verify", {**body, "diff": other, "polar_session_id": session_id})
        assert tampered["evaluated_in"] == "fresh" and [w for w, _, _ in made[3:]] == ["verify"]
    _, fresh_name, creation_s = made[2]
    saved_s = creation_s + destroyed[fresh_name]
    print(
        f"\n[verify-reuse] agent /run {run_s:.2f} s; /verify answered from the session's evaluation in {reuse_s:.3f} s, "
        f"with a fresh runtime in {fresh_s:.3f} s (runtime creation {creation_s:.3f} s + destruction "
        f"{destroyed[fresh_name]:.3f} s: {saved_s:.3f} s off each session's critical path; the tests themselves now "
        f"run in the gateway's POSTRUN, in the runtime prewarmed while the agent ran)"
    )
