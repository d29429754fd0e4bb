# SPDX-License-Identifier: Apache-2.0
"""The launcher's refit hooks reach the Polar stack that NeMo Gym hosts (`credit/nemo_rl/hosted.py`).

Real parts: a local Ray; NeMo RL's own `spinup_nemo_gym_actor` (its `NemoGym` actor, the pinned Gym 0.5.1), called
through `nemo_rl.algorithms.grpo` as NeMo RL's `setup()` calls it, after `launch.install_refit_hooks` wrapped it;
Gym's head server and the `polar_swe` resources server from `environments/` on the ports Gym picks; the hosted
Polar proxy; NeMo RL's real `refit_policy_generation`. Fakes, named: `FakeGeneration` (the generation interface
whose weight sync NeMo RL's refit calls; no GPU worker here) and `polar_lab.fake_upstream.FakeUpstream` (a
vLLM-shaped OpenAI server: no model is needed to stamp a version on a record).

Checked: the first refit (before any rollout, the hosted stack not started yet) pauses `polar_swe` and stamps
version 1, which the stack's proxy carries once a seed starts it; the second refit pauses the running proxy while
the weights change, and the next record carries policy version 2.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nemo_polar.credit.nemo_rl.launch import install_refit_hooks
from nemo_rl.algorithms import grpo

from polar_lab.gym_grpo_smoke import ENVIRONMENTS, NEMO_GYM_ACTOR, link_server_venvs

from .loopback import fake_upstream_thread
from .standin_run_grpo_nemo_gym import REFITS, FakeGeneration

pytestmark = [pytest.mark.e2e]

TOKEN = "hosted-refit-test-token"


@pytest.fixture
def fake_upstream() -> Iterator[str]:
    with fake_upstream_thread() as url:
        yield url


@pytest.fixture
def hooked_grpo(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """NeMo RL's grpo module with the launcher's refit hooks installed; its globals restored afterwards."""
    refit, spinup = grpo.refit_policy_generation, grpo.spinup_nemo_gym_actor
    monkeypatch.setenv("POLAR_CONTROL_TOKEN", TOKEN)  # the driver's; the Gym servers inherit it through the actor
    hosted = install_refit_hooks(grpo, [], 30.0, gym=True)
    try:
        yield hosted
    finally:
        grpo.refit_policy_generation, grpo.spinup_nemo_gym_actor = refit, spinup
        REFITS.clear()


def _http(url: str, body: dict[str, Any] | None = None, token: str | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=60) as resp:
        return json.loads(resp.read())


def _one_record_version(proxy_url: str) -> Any:
    """One model call through the hosted proxy in a new session; the policy version its record carries."""
    session = _http(f"{proxy_url}/sessions", {"task_id": "hosted-refit"}, token=TOKEN)
    _http(
        f"{proxy_url}/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        token=session["api_key"],
    )
    page = _http(f"{proxy_url}/sessions/{session['session_id']}/records", token=TOKEN)
    (record,) = page["records"]
    return record["policy_version"]


def test_launcher_refit_hooks_find_pause_and_stamp_the_gym_hosted_stack(
    hooked_grpo: Any, fake_upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES

    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(ENVIRONMENTS))
    monkeypatch.setitem(ACTOR_ENVIRONMENT_REGISTRY, NEMO_GYM_ACTOR, PY_EXECUTABLES.SYSTEM)  # no uv build here
    env_configs = {
        "nemo_gym": {
            "default_host": "127.0.0.1",
            "uv_venv_dir": str(link_server_venvs(tmp_path / "server-venvs", Path(sys.prefix))),
            "skip_venv_if_present": True,
            # the polar_swe block of resources_servers/polar_swe/configs/polar_swe.yaml, no agent: nothing rolls out
            "polar_swe": {
                "resources_servers": {
                    "polar_swe": {"entrypoint": "app.py", "domain": "coding", "work_dir": str(tmp_path / "run")}
                }
            },
        }
    }
    ray_tmp = tempfile.mkdtemp(prefix="polar-ray-")  # Ray's socket paths must stay short
    actor = None
    try:
        ray.init(num_cpus=1, include_dashboard=False, _temp_dir=ray_tmp)
        actor = grpo.spinup_nemo_gym_actor(
            env_configs, [f"{fake_upstream}/v1"], "m", tokenizer=None, enable_router_replay=False,
            routed_experts_dtype="int32", use_fastokens=False,
        )  # fmt: skip
        (polar_swe,) = hooked_grpo()  # found through the actor's head server, on the port Gym picked
        assert polar_swe.endswith("/polar") and _http(f"{polar_swe}/status")["started"] is False

        seen: list[tuple[Any, ...]] = []

        def during_refit() -> None:
            admin = _http(f"{polar_swe}/admin/status", token=TOKEN)
            proxy = _http(f"{admin['proxy_url']}/admin/status", token=TOKEN) if admin["started"] else None
            seen.append(
                (admin["paused"], admin["policy_version"], proxy and (proxy["paused"], proxy["policy_version"]))
            )

        generation = FakeGeneration(on_sync=during_refit)
        grpo.refit_policy_generation(None, generation, False)  # NeMo RL refits once before its first rollout
        # the first seed starts the hosted stack (as polar_agent's does): it comes up stamped with version 1
        seed = _http(f"{polar_swe[: -len('/polar')]}/seed_session", {"upstream_url": f"{fake_upstream}/v1"})
        assert _one_record_version(seed["proxy_url"]) == 1
        grpo.refit_policy_generation(None, generation, False)
        assert _one_record_version(seed["proxy_url"]) == 2

        assert seen == [(True, None, None), (True, 1, (True, 1))]  # paused while the weights changed
        final = _http(f"{polar_swe}/admin/status", token=TOKEN)
        assert (final["paused"], final["policy_version"]) == (False, 2)
        with pytest.raises(urllib.error.HTTPError) as refused:  # the admin routes want the control token
            _http(f"{polar_swe}/admin/pause", {"timeout_s": 1}, token="wrong")
        assert refused.value.code == 401
    finally:
        if actor is not None:
            ray.get(actor.__ray_call__.remote(lambda self: self.rh.shutdown()), timeout=120)
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
