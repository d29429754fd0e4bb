# SPDX-License-Identifier: Apache-2.0
"""`launch --dry-run` on every recipe against the real NeMo RL (`nemo_rl.algorithms.grpo`,
`nemo_rl.experience.rollouts`), the plain-GRPO guard, `install()`, the refit hooks around NeMo RL's real
`refit_policy_generation` against a fake Polar gateway and the real proxy on loopback, and the `polar_calls` patch
on NeMo RL's real group post-processing.

The one stand-in is the entry script (`standin_run_grpo_nemo_gym.py`): NeMo RL's `run_grpo_nemo_gym.py` cannot run
on a CPU-only machine (its setup hard-codes GPUs).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from nemo_polar.credit.nemo_rl import CallCreditAdvantageEstimator, install, uninstall
from nemo_polar.credit.nemo_rl.factory import PluginNotLoadedError, allows_name_call_credit
from nemo_polar.credit.nemo_rl.launch import EXTRA_ROOTS_ENV, run
from nemo_polar.credit.nemo_rl.patches import install_polar_calls_patch
from nemo_rl.algorithms import grpo
from nemo_rl.experience import rollouts

from .nemo_rl_repro import build_batch
from .standin_run_grpo_nemo_gym import REFITS, FakeGeneration

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
STANDIN: list[str] = []  # the default modules: NeMo RL's own
OUR_CLASS = "nemo_polar.credit.nemo_rl.CallCreditAdvantageEstimator"
PLAIN_CLASS = "nemo_rl.algorithms.advantage_estimator.GRPOAdvantageEstimator"
POLAR_SWE_CONFIG = "resources_servers/polar_swe/configs/polar_swe.yaml"


@pytest.fixture
def gym_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An extra Gym root with polar_swe's config when environments/ does not ship it yet (a named placeholder)."""
    if not (ROOT / "environments" / POLAR_SWE_CONFIG).is_file():
        placeholder = tmp_path / "gym_root" / POLAR_SWE_CONFIG
        placeholder.parent.mkdir(parents=True)
        placeholder.write_text("# PLACEHOLDER for tests until environments/ ships polar_swe\npolar_swe: {}\n")
        monkeypatch.setenv(EXTRA_ROOTS_ENV, str(tmp_path / "gym_root"))
    else:
        monkeypatch.delenv(EXTRA_ROOTS_ENV, raising=False)
    return tmp_path


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(
        json.dumps({"responses_create_params": {"input": []}, "agent_ref": {"name": "polar_agent"}}) + "\n"
    )
    return path


@pytest.fixture(autouse=True)
def _restore_nemo_rl() -> Iterator[None]:
    """Put NeMo RL's module globals back after each test (install/wrap_refit/patch replace them)."""
    from nemo_polar.credit.nemo_rl.sync_metrics import uninstall_sync_metrics

    factory, refit = grpo._create_advantage_estimator, grpo.refit_policy_generation
    post, spinup = rollouts._postprocess_single_nemo_gym_group, grpo.spinup_nemo_gym_actor
    yield
    grpo._create_advantage_estimator, grpo.refit_policy_generation = factory, refit
    grpo.spinup_nemo_gym_actor = spinup
    rollouts._postprocess_single_nemo_gym_group = post
    uninstall_sync_metrics(grpo)
    REFITS.clear()


def _dry_run(recipe: Path, *extra: str) -> list[str]:
    return ["--config", str(recipe), "--dry-run", *STANDIN, *extra]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_dry_run_each_recipe(
    recipe: Path, gym_root: Path, data_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    rc = run(_dry_run(recipe, f"data.train.data_path={data_file}", "polar.harness=qwen_code"))
    out = capsys.readouterr()
    assert rc == 0, out.err
    wanted = OUR_CLASS if "call_credit" in recipe.name or "smoke" in recipe.name else PLAIN_CLASS
    assert f"advantage estimator class: {wanted}" in out.out
    assert f"{EXTRA_ROOTS_ENV}={ROOT / 'environments'}" in out.out
    assert os.environ[EXTRA_ROOTS_ENV].split(os.pathsep)[0] == str(ROOT / "environments")
    assert f"gym config: {POLAR_SWE_CONFIG} -> " in out.out and POLAR_SWE_CONFIG in out.out.split("-> ")[-1]
    assert f"data.train: {data_file.resolve()}" in out.out
    assert "dry run: not training" in out.out


def _header_command(recipe: Path) -> list[str]:
    command = shlex.split(recipe.read_text().splitlines()[0].lstrip("# "))
    assert command[:3] == ["python", "-m", "nemo_polar.credit.nemo_rl.launch"]
    return command


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_header_command_dry_runs(
    recipe: Path, gym_root: Path, data_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exact arguments on each recipe's first line, plus --dry-run and the stand-in."""
    monkeypatch.chdir(ROOT)
    assert run([*_header_command(recipe)[3:], "--dry-run", *STANDIN, f"data.train.data_path={data_file}"]) == 0
    assert "advantage estimator class:" in capsys.readouterr().out


def test_header_command_runs_as_a_process(gym_root: Path, data_file: Path) -> None:
    """The CALL-CREDIT recipe's command as a fresh process (`python -m …`), as a user types it."""
    recipe = ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b_call_credit.yaml"
    argv = [sys.executable, *_header_command(recipe)[1:], "--dry-run", *STANDIN, f"data.train.data_path={data_file}"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert f"advantage estimator class: {OUR_CLASS}" in proc.stdout


def test_guard_plugin_not_loaded_means_plain_grpo_and_refuses(
    gym_root: Path, data_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    recipe = ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b_call_credit.yaml"
    rc = run(_dry_run(recipe, "--no-plugin", f"data.train.data_path={data_file}"))
    err = capsys.readouterr().err
    assert rc == 3
    assert f"asks for {OUR_CLASS} but NeMo RL built {PLAIN_CLASS}" in err
    # the plain recipe is fine without the plug-in: it asks for nothing else
    rc = run(
        _dry_run(
            ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b.yaml", "--no-plugin", f"data.train.data_path={data_file}"
        )
    )
    assert rc == 0 and f"advantage estimator class: {PLAIN_CLASS}" in capsys.readouterr().out


def test_name_call_credit_where_allowed(gym_root: Path, data_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert allows_name_call_credit(grpo)  # `name: str` at the pinned commit
    recipe = ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b.yaml"
    rc = run(_dry_run(recipe, "grpo.adv_estimator.name=call_credit", f"data.train.data_path={data_file}"))
    assert rc == 0 and f"advantage estimator class: {OUR_CLASS}" in capsys.readouterr().out


def test_dry_run_fails_loudly_on_missing_files(
    gym_root: Path, data_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b_call_credit.yaml"
    assert run(_dry_run(recipe, "data.train.data_path=/nonexistent/train.jsonl")) == 2
    assert "data.train: /nonexistent/train.jsonl not found" in capsys.readouterr().err
    missing_cfg = "env.nemo_gym.config_paths=[resources_servers/polar_swe/configs/missing.yaml]"
    assert run(_dry_run(recipe, missing_cfg, f"data.train.data_path={data_file}")) == 2
    assert "resources_servers/polar_swe/configs/missing.yaml: not found" in capsys.readouterr().err
    assert run(_dry_run(recipe, "grpo.not_a_key=1", f"data.train.data_path={data_file}")) == 2
    assert "+grpo.not_a_key=1" in capsys.readouterr().err  # Hydra's own hint, through NeMo RL's parser
    absent = ["--config", str(recipe), "--dry-run", "--grpo-module", "nemo_rl_absent.x"]
    assert run([*absent, f"data.train.data_path={data_file}"]) == 2
    assert "cannot import nemo_rl_absent.x" in capsys.readouterr().err


def test_install_wraps_once_logs_and_guards(capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_polar.credit.nemo_rl.recipe import load_with_overrides
    from nemo_rl.algorithms.advantage_estimator import AdvEstimatorConfig, GRPOAdvantageEstimator

    original = grpo._create_advantage_estimator
    wrapper = install(grpo)
    assert install(grpo) is wrapper and grpo._create_advantage_estimator is wrapper
    config = load_with_overrides(ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b_call_credit.yaml")
    config["policy"]["tokenizer"]["name"] = "Qwen/Qwen3.5-4B"
    config["grpo"]["adv_estimator"] = {"name": "grpo", "_target_": OUR_CLASS, "call_credit": {"alpha": 0.7}}
    master = grpo.MasterConfig(**config)
    est = grpo._create_advantage_estimator(master)
    assert isinstance(est, CallCreditAdvantageEstimator) and est.alpha == 0.7
    assert est.options.call_credit.tokenizer == "Qwen/Qwen3.5-4B"  # filled from policy.tokenizer.name
    assert f"advantage estimator class: {OUR_CLASS}" in capsys.readouterr().out
    # a _target_ naming another class is built and checked the same way
    master.grpo.adv_estimator = AdvEstimatorConfig.model_validate({"name": "grpo", "_target_": PLAIN_CLASS})
    assert isinstance(grpo._create_advantage_estimator(master), GRPOAdvantageEstimator)
    uninstall(grpo)
    assert grpo._create_advantage_estimator is original
    # without the wrapper, NeMo RL's factory builds plain GRPO for a CALL-CREDIT config: the guard catches it
    from nemo_polar.credit.nemo_rl.factory import check_chosen

    master.grpo.adv_estimator = AdvEstimatorConfig.model_validate({"name": "grpo", "_target_": OUR_CLASS})
    with pytest.raises(PluginNotLoadedError):
        check_chosen(grpo._create_advantage_estimator(master), master.grpo.adv_estimator)


class _FakePolarGateway(BaseHTTPRequestHandler):
    """FAKE Polar gateway admin endpoint on loopback: records every POST."""

    calls: ClassVar[list[tuple[str, dict]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).calls.append((self.path, json.loads(body or b"{}")))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_gateway() -> Iterator[str]:
    _FakePolarGateway.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakePolarGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_launch_runs_entry_script_with_refit_hooks_and_patch(
    gym_root: Path,
    data_file: Path,
    fake_gateway: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delenv("POLAR_CALLS_PATCH", raising=False)  # run() sets it; restored afterwards
    recipe = ROOT / "recipes" / "grpo_polar_swe_smoke.yaml"
    entry = ROOT / "tests" / "nemo_rl" / "standin_run_grpo_nemo_gym.py"
    rc = run(
        [
            "--config",
            str(recipe),
            *STANDIN,
            "--entry-script",
            str(entry),
            f"data.train.data_path={data_file}",
            f"polar.gateways=[{fake_gateway}]",
            "polar.admin_timeout_s=5",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "refit: pause/policy_version/resume on 1 Polar gateway(s)" in out and "polar_calls patch: on" in out
    assert "on the polar_swe server(s) NeMo Gym hosts" in out  # a Gym recipe: the hosted stacks are found too
    assert getattr(grpo.spinup_nemo_gym_actor, "__polar_gym_actor_capture__", False)
    assert "standin step 1: CallCreditAdvantageEstimator advantage sum" in out
    assert len(REFITS) == 2  # NeMo RL's refit_policy_generation reached the generation's weight synchronizer
    assert _FakePolarGateway.calls == [
        ("/admin/pause", {"timeout_s": 5}),
        ("/admin/policy_version", {"policy_version": 1}),
        ("/admin/resume", {}),
        ("/admin/pause", {"timeout_s": 5}),
        ("/admin/policy_version", {"policy_version": 2}),
        ("/admin/resume", {}),
    ]


@pytest.fixture
def polar_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The real Polar proxy (`nemo_polar.proxy.app`) on loopback, in its own thread and event loop; its upstream is
    never contacted by the admin calls under test."""

    from nemo_polar.proxy.app import Proxy, ProxyConfig

    monkeypatch.setenv("POLAR_CONTROL_TOKEN", "test-control-token")
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state: dict[str, object] = {}

    def serve() -> None:
        asyncio.set_event_loop(loop)
        proxy = Proxy(ProxyConfig(upstreams=["http://127.0.0.1:9"], store_dir=str(tmp_path / "store")))
        runner = proxy.runner()
        loop.run_until_complete(runner.setup())
        site = proxy.site(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        state["port"] = runner.addresses[0][1]
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(30), "the proxy did not start"
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


def _status(base: str) -> dict:
    request = urllib.request.Request(f"{base}/admin/status", headers={"Authorization": "Bearer test-control-token"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_refit_hooks_drive_the_real_polar_proxy(polar_proxy: str) -> None:
    from nemo_polar.credit.nemo_rl.gateways import GatewayAdmin, GatewayAdminError, wrap_refit

    seen: list[tuple[bool, object]] = []

    def refit(*args: object, **kwargs: object) -> dict:
        status = _status(polar_proxy)  # what the gateway looks like while the weights change
        seen.append((status["paused"], status["policy_version"]))
        return {}

    generation = FakeGeneration(on_sync=refit)
    wrap_refit(grpo, GatewayAdmin([polar_proxy], timeout_s=5))
    grpo.refit_policy_generation(None, generation, False)  # NeMo RL's real refit, wrapped
    grpo.refit_policy_generation(None, generation, False)
    assert seen == [(True, None), (True, 1)]
    final = _status(polar_proxy)
    assert (final["paused"], final["policy_version"]) == (False, 2)
    os.environ["POLAR_CONTROL_TOKEN"] = "wrong-token"  # restored by the fixture's monkeypatch
    with pytest.raises(GatewayAdminError, match="HTTP 401"):
        GatewayAdmin([polar_proxy], timeout_s=5).pause()


def test_refit_failure_resumes_and_unreachable_gateway_raises(fake_gateway: str) -> None:
    from nemo_polar.credit.nemo_rl.gateways import GatewayAdmin, GatewayAdminError, wrap_refit

    def broken_refit(*args: object, **kwargs: object) -> None:
        raise RuntimeError("refit failed")

    wrap_refit(grpo, GatewayAdmin([fake_gateway], timeout_s=5))
    with pytest.raises(RuntimeError, match="refit failed"):
        grpo.refit_policy_generation(None, FakeGeneration(on_sync=broken_refit), False)
    assert [p for p, _ in _FakePolarGateway.calls] == ["/admin/pause", "/admin/resume"]
    with pytest.raises(GatewayAdminError, match="/admin/pause"):
        GatewayAdmin(["http://127.0.0.1:9"], timeout_s=1, attempts=2).pause()


def test_polar_calls_patch_carries_annotations_into_the_batch() -> None:
    """The patch on NeMo RL's real `_postprocess_single_nemo_gym_group`, called as its rollout loop calls it."""
    from types import SimpleNamespace

    from nemo_rl.utils.timer import Timer

    install_polar_calls_patch(rollouts)
    rows = [[([1, 2], [3, 4]), ([1, 2, 3, 4, 5], [6])], [([1, 2], [7])]]
    batch = build_batch(rows, [1.0, 0.0])
    calls = [
        [{"call_index": 0, "role": "IG", "parents": []}, {"call_index": 1, "role": "AE", "parents": [0]}],
        [{"call_index": 0, "role": "OTHER", "parents": []}],
    ]
    results = [
        {
            "message_log": log,
            "input_message_log": log[:1],
            "full_result": {"reward": r, "polar_calls": c, "instance_config": {"mask_sample": False}},
        }
        for log, r, c in zip(batch["repeated_batch"]["message_log"], [1.0, 0.0], calls, strict=True)
    ]
    group = rollouts._postprocess_single_nemo_gym_group(
        [{"agent_ref": {"name": "polar_agent"}}] * 2,
        results,
        Timer(),
        "test",
        SimpleNamespace(cfg={"max_total_sequence_length": 4096}),  # what it reads of the generation interface
        {"loss_multiplier": torch.ones(2)},
        SimpleNamespace(pad_token_id=0),  # what it reads of the tokenizer
        False,
    )
    assert group.final_batch["polar_calls"] == calls
    assert group.final_batch["mask_sample"].tolist() == [False, False]
    est = CallCreditAdvantageEstimator({"call_credit": {"alpha": 0.0}}, None)
    adv = est.compute_advantage(batch["prompt_ids"], batch["rewards"], batch["mask"], repeated_batch=group.final_batch)
    assert [a.role for a in est.last_annotations[0]] == ["IG", "AE"]
    assert est.last_metrics["call_credit/rows_annotated_from_polar_calls"] == 1.0
    assert adv.shape == batch["mask"].shape and torch.all(adv[batch["mask"] == 0] == 0)


def test_name_call_credit_not_allowed_where_name_is_a_literal() -> None:
    """Newer NeMo RL narrows `name` to a Literal: then only `_target_` selects the plug-in."""
    import types
    from typing import Literal

    from pydantic import BaseModel

    class AdvEstimatorConfig(BaseModel):
        name: Literal["grpo", "gdpo", "opd", "reinforce_plus_plus"] = "grpo"

    newer = types.ModuleType("standin_newer_grpo")
    newer.AdvEstimatorConfig = AdvEstimatorConfig  # type: ignore[attr-defined]
    assert not allows_name_call_credit(newer)


def test_async_collector_gets_the_patch_through_a_ray_setup_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray
    from nemo_polar.credit.nemo_rl import launch, patches
    from nemo_rl.experience import rollouts

    seen: dict[str, object] = {}
    # the real ray module; only its init is replaced by a recorder, so no cluster starts
    monkeypatch.setattr(ray, "init", lambda *a, **kw: seen.update(kw))
    launch._inject_ray_setup_hook()
    launch._inject_ray_setup_hook()  # idempotent
    ray.init(address="auto", runtime_env={"env_vars": {"A": "1"}})  # as NeMo RL's init_ray calls it
    assert seen["runtime_env"] == {"env_vars": {"A": "1"}, "worker_process_setup_hook": launch.RAY_SETUP_HOOK}
    # the hook itself: a no-op without the env flag; with it, it wraps the real rollouts module's group post-processing
    current = rollouts._postprocess_single_nemo_gym_group
    # other tests of this session (the CPU GRPO steps, the Gym results) install the patch in the module: start
    # from NeMo RL's own function whatever ran before (restored afterwards)
    original = getattr(current, "__wrapped__", current)
    monkeypatch.setattr(rollouts, "_postprocess_single_nemo_gym_group", original)
    monkeypatch.delenv(patches.PATCH_ENV, raising=False)
    patches.ray_worker_setup()
    assert rollouts._postprocess_single_nemo_gym_group is original
    monkeypatch.setenv(patches.PATCH_ENV, "1")
    patches.ray_worker_setup()
    assert getattr(rollouts._postprocess_single_nemo_gym_group, "__polar_calls_wrapped__", False)
    assert rollouts._postprocess_single_nemo_gym_group.__wrapped__ is original
