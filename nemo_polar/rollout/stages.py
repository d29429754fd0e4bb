# SPDX-License-Identifier: Apache-2.0
"""What happens to one session inside each gateway stage: INIT (runtime + prepare actions), RUN (the agent),
POSTRUN (records → trajectory → evaluation → post-run hooks → `SessionResult`).

Budgets: the session budget (`TaskSpec.timeout_s`) starts at INIT; the agent budget (`AgentSpec.timeout_s`,
capped by what is left of the session budget) starts at RUN. A timeout is data, not an exception: the session
gets status TIMEOUT and still goes through POSTRUN with whatever records exist (a partial trajectory). Failures
become a `failure` dict on the job and a masked `EvalResult`; nothing here raises into the gateway except
cancellation (which kills the agent's process tree on its way out, in `Runtime.exec`).

The pools, queues and admission live in `gateway.py`; this module is the per-session work.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from nemo_polar.errors import PolarError
from nemo_polar.evaluators import EvalContext, run_evaluator
from nemo_polar.evaluators.base import apply_trace_rewards
from nemo_polar.evaluators.base import failure as eval_failure
from nemo_polar.loading import load_object
from nemo_polar.rollout.proxylink import SessionRequest
from nemo_polar.rollout.retry import Backoff, retry
from nemo_polar.rollout.runtime import Runtime, RuntimeSetupError, create_runtime
from nemo_polar.rollout.spec import ExecAction, TaskSpec, UploadDirAction, UploadFileAction
from nemo_polar.rollout.task_options import SIMULATION, SimulationOptions
from nemo_polar.rundir import RunDir, SessionDir
from nemo_polar.types import CompletionRecord, EvalResult, SessionResult, Trajectory, TrajectoryStatus

if TYPE_CHECKING:
    from nemo_polar.rollout.proxylink import ProxyLink

__all__ = ["SIMULATION", "Job", "SessionWork"]

log = logging.getLogger(__name__)


class PrepareActionError(PolarError, RuntimeError):
    """A prepare action of the session spec failed (INIT); retried, then fatal for the session."""


@dataclass(eq=False)
class Job:
    """One session as it moves through the gateway."""

    session_id: str
    task: TaskSpec
    sample_index: int
    attempt: int
    session_dir: Path
    stage: str = "init_queue"
    status: str = TrajectoryStatus.COMPLETED.value
    failure: dict[str, Any] | None = None
    runtime: Runtime | None = None
    fresh: list[Runtime] = field(default_factory=list)
    prewarm: asyncio.Task[Runtime] | None = None
    proxy_session: str | None = None
    agent_exit_code: int | None = None
    deadline: float = math.inf  # loop.time() when the session budget runs out
    t: dict[str, float] = field(default_factory=dict)  # wall-clock stage marks
    current: asyncio.Task[Any] | None = None
    cancelled: bool = False

    def fail(self, stage: str, kind: str, reason: str, *, status: str = TrajectoryStatus.ERROR.value) -> None:
        if self.failure is None:
            self.failure = {"stage": stage, "kind": kind, "reason": reason[-2000:]}
            self.status = status

    def timing(self) -> dict[str, float]:
        t, out = self.t, {}
        for name, a, b in (
            ("init_s", "init_start", "init_end"),
            ("ready_s", "init_end", "run_start"),
            ("run_s", "run_start", "run_end"),
            ("postrun_s", "post_start", "post_end"),
            ("total_s", "admitted", "post_end"),
        ):
            if a in t and b in t:
                out[name] = max(0.0, t[b] - t[a])
        return out


class SessionWork:
    """The stage bodies, parameterised by the gateway's shared pieces."""

    def __init__(
        self,
        *,
        node_id: str,
        work_dir: Path,
        proxy: ProxyLink | None,
        model: str,
        builder_options: dict[str, Any],
        keep_runtimes: bool,
    ):
        self.node_id = node_id
        self.work_dir = work_dir
        self.proxy = proxy
        self.model = model
        self.builder_options = builder_options
        self.keep_runtimes = keep_runtimes
        self.records_total = 0

    # -- INIT ------------------------------------------------------------------------------------------------------

    async def make_runtime(self, job: Job, name: str) -> Runtime:
        port = urlsplit(self.proxy.base_url).port if self.proxy is not None else None
        rt = await create_runtime(
            f"{job.session_id}.{name}",
            job.task.runtime,
            RunDir(self.work_dir).runtimes / job.session_id / name,
            proxy_port=port,
            hidden=(self.work_dir,),  # other sessions' runtimes and the record store stay out of sight
        )
        try:
            await self._prepare(rt, job)
        except BaseException:
            await rt.destroy()
            raise
        return rt

    async def _prepare(self, rt: Runtime, job: Job) -> None:
        for i, action in enumerate(job.task.session.prepare):

            async def once(action: Any = action, i: int = i) -> None:
                if isinstance(action, UploadFileAction):
                    if action.content is not None:
                        data: str | bytes = action.content
                    else:
                        data = await asyncio.to_thread(Path(action.src or "").read_bytes)
                    await rt.write_file(action.dest, data, action.mode)
                elif isinstance(action, UploadDirAction):
                    await rt.upload_dir(Path(action.src), action.dest)
                elif isinstance(action, ExecAction):
                    res = await rt.exec(action.command, timeout_s=action.timeout_s, env=action.env)
                    if not res.ok:
                        why = "timed out" if res.timed_out else f"exit {res.exit_code}"
                        raise PrepareActionError(f"prepare[{i}] exec {why}: {(res.stdout + res.stderr)[-1000:]}")

            await retry(
                once,
                backoff=Backoff(attempts=action.retries + 1, base_s=0.5, cap_s=5.0),
                retry_on=(PrepareActionError, OSError, RuntimeSetupError),
                what=f"{job.session_id} prepare[{i}]",
            )

    async def init(self, job: Job) -> None:
        loop = asyncio.get_running_loop()
        job.t["init_start"] = time.time()
        job.deadline = loop.time() + job.task.timeout_s
        job.session_dir.mkdir(parents=True, exist_ok=True)
        try:
            async with asyncio.timeout_at(job.deadline):
                job.runtime = await self.make_runtime(job, "agent")
        except TimeoutError:
            job.fail(
                "init",
                "init_timeout",
                f"INIT exceeded the session budget of {job.task.timeout_s}s",
                status=TrajectoryStatus.TIMEOUT.value,
            )
        except (PrepareActionError, RuntimeSetupError, OSError) as exc:
            job.fail("init", "init_failed", f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            log.exception("INIT of %s crashed", job.session_id)
            job.fail("init", "init_failed", f"{type(exc).__name__}: {exc}")
        finally:
            job.t["init_end"] = time.time()

    # -- RUN -------------------------------------------------------------------------------------------------------

    async def run(self, job: Job) -> None:
        loop = asyncio.get_running_loop()
        job.t["run_start"] = time.time()
        task, rt = job.task, job.runtime
        assert rt is not None
        if task.session.refresh_runtime:  # the evaluation runtime is prepared while the agent runs
            job.prewarm = asyncio.create_task(self.make_runtime(job, "fresh0"))
        budget = job.deadline - loop.time()
        if task.agent.timeout_s is not None:
            budget = min(budget, task.agent.timeout_s)
        try:
            if budget <= 0:
                job.fail(
                    "run",
                    "session_timeout",
                    "no session budget left for the agent",
                    status=TrajectoryStatus.TIMEOUT.value,
                )
                return
            argv, env = await self._agent_command(job, rt)
            res = await rt.exec(argv, timeout_s=budget, env=env, stdout_path=SessionDir(job.session_dir).agent_log)
            job.agent_exit_code = res.exit_code
            if res.timed_out:
                job.fail(
                    "run",
                    "agent_timeout",
                    f"the agent exceeded its budget of {budget:.1f}s",
                    status=TrajectoryStatus.TIMEOUT.value,
                )
            elif res.exit_code is None:
                job.fail("run", "agent_not_started", res.stderr)
        except Exception as exc:
            log.warning("RUN of %s failed: %s", job.session_id, exc, exc_info=True)
            job.fail("run", "agent_setup_failed", f"{type(exc).__name__}: {exc}")
        finally:
            job.t["run_end"] = time.time()

    async def _agent_command(self, job: Job, rt: Runtime) -> tuple[list[str], dict[str, str]]:
        task = job.task
        agent = task.agent
        plan = task.plan_for(job.sample_index)
        if agent.harness == SIMULATION:  # a timed process standing in for an agent; no model is called
            sim = SimulationOptions.model_validate(agent.options)
            run_s = sim.run_s
            if isinstance(run_s, list):
                run_s = run_s[job.sample_index % len(run_s)]
            job.session_dir.mkdir(parents=True, exist_ok=True)
            SessionDir(job.session_dir).plan.write_bytes(orjson.dumps(plan or {"steps": []}))
            (rt.home / "polar-plan.json").write_bytes(orjson.dumps(plan or {"steps": []}))  # the run dir is hidden
            argv = [
                sys.executable,
                "-m",
                "nemo_polar.rollout.simulation",
                "--plan",
                f"{rt.agent_home}/polar-plan.json",
                "--run-s",
                str(float(run_s)),
                "--exit-code",
                str(sim.exit_code),
            ]
            return argv, {}
        from nemo_polar.harness_adapters import HarnessContext, get_adapter, resolve_plan
        from nemo_polar.harness_adapters.install import install_dir
        from nemo_polar.runtime.harness import write_home

        if self.proxy is None:
            raise RuntimeError(f"harness {agent.harness!r} needs a model proxy; this gateway has no upstream")
        adapter = get_adapter(agent.harness)
        opts = adapter.options_model.model_validate(agent.options)  # checked at submit (task_options)
        inst = install_dir(adapter)
        ctx = HarnessContext(
            base_url=self.proxy.base_url,
            api_key="",
            model=agent.model or self.model,
            workdir=rt.agent_workdir,
            home=rt.agent_home,
            install_dir=str(inst) if inst is not None and inst.exists() else None,
            command_line=getattr(opts, "command_line", None),
            max_turns=getattr(opts, "max_turns", None),
            provider_api=getattr(opts, "provider_api", None),
            idle_timeout_s=self.proxy.idle_limit_s,
        )
        resolved = resolve_plan(plan, adapter, ctx) if plan else None
        session = await self.proxy.open_session(
            SessionRequest(
                session_id=job.session_id,
                task_id=task.task_id,
                plan=resolved,
                sampling=agent.sampling,
                metadata={
                    "sample_index": job.sample_index,
                    "attempt": job.attempt,
                    "harness": agent.harness,
                    **task.metadata.model_dump(exclude_none=True),
                },
                classifier=adapter.classify_request,
            )
        )
        job.proxy_session = session.session_id
        ctx = replace(ctx, api_key=session.api_key, base_url=session.base_url)
        write_home(adapter, ctx, rt.home)  # written on the host; the CLI sees them under ctx.home
        env = adapter.env(ctx)
        for var in adapter.env_unset:
            env.pop(var, None)
        return adapter.command(ctx, task.instruction), env

    # -- POSTRUN ---------------------------------------------------------------------------------------------------

    async def fresh_runtime(self, job: Job) -> Runtime:
        if job.prewarm is not None:
            pending, job.prewarm = job.prewarm, None
            rt = await pending
        else:
            rt = await self.make_runtime(job, f"fresh{len(job.fresh)}")
        job.fresh.append(rt)
        return rt

    def _build(self, job: Job, records: list[CompletionRecord], reward: float | None) -> Trajectory:
        try:
            from nemo_polar.trajectory import build
        except ImportError:
            return Trajectory(status=job.status)
        opts = {**self.builder_options, **job.task.builder.options}
        if reward is not None:
            opts["reward"] = reward
        traj = build(records, builder=job.task.builder.name, **opts)
        traj.status = job.status
        return traj

    async def postrun(self, job: Job) -> SessionResult:
        """Records → trajectory → evaluation → (trajectory with the reward) → hooks → teardown → result."""
        job.t["post_start"] = time.time()
        notes: dict[str, Any] = {}
        records, diff = await self._collect(job)
        trajectory = self._safe_build(job, records, None, notes)
        ev = await self._evaluate(job, diff, trajectory)
        if records and "builder_error" not in notes:
            trajectory = self._safe_build(job, records, ev.reward, notes)
        trajectory, unmatched = apply_trace_rewards(trajectory, ev.trace_rewards)
        if unmatched:
            notes["unmatched_trace_rewards"] = unmatched
        task = job.task
        result = SessionResult(
            session_id=job.session_id,
            task_id=task.task_id,
            sample_index=job.sample_index,
            status=job.status,
            harness=task.agent.harness,
            trajectory=trajectory,
            eval=ev,
            record_ids=[r.id for r in records],
            metadata={
                **task.metadata.model_dump(exclude_none=True),
                "attempt": job.attempt,
                "node_id": self.node_id,
                "agent_exit_code": job.agent_exit_code,
                **({"failure": job.failure} if job.failure else {}),
                **notes,
            },
        )
        hook_errors = await self._hooks(job, result)
        if hook_errors:
            result.metadata["hook_errors"] = hook_errors
        await self.teardown(job)
        job.t["post_end"] = time.time()
        result.timing = job.timing()
        result.trajectory.timing = {**result.trajectory.timing, **result.timing}
        await asyncio.to_thread(SessionDir(job.session_dir).result.write_bytes, result.to_json(compact=True))
        return result

    async def _collect(self, job: Job) -> tuple[list[CompletionRecord], str]:
        """The session's proxy records (the session closed first) and the workdir diff (kept in the session dir)."""
        records: list[CompletionRecord] = []
        diff = ""
        try:
            if self.proxy is not None and job.proxy_session is not None:
                await self.proxy.close_session(job.proxy_session)
                records = await self.proxy.records(job.proxy_session)
                self.records_total += len(records)
            if job.runtime is not None:
                diff = await asyncio.wait_for(job.runtime.diff(), timeout=120)
                await asyncio.to_thread(SessionDir(job.session_dir).diff.write_text, diff)
        except Exception as exc:
            log.warning("POSTRUN collection for %s failed: %s", job.session_id, exc)
            job.fail("postrun", "collect_failed", f"{type(exc).__name__}: {exc}")
        return records, diff

    def _safe_build(
        self, job: Job, records: list[CompletionRecord], reward: float | None, notes: dict[str, Any]
    ) -> Trajectory:
        try:
            return self._build(job, records, reward)
        except Exception as exc:  # a builder bug costs the traces, not the session
            notes["builder_error"] = f"{type(exc).__name__}: {exc}"
            return Trajectory(status=job.status)

    async def _evaluate(self, job: Job, diff: str, trajectory: Trajectory) -> EvalResult:
        failure = job.failure
        if failure is not None and (
            failure["stage"] == "init" or failure["kind"] in ("agent_setup_failed", "agent_not_started")
        ):  # nothing the agent did can be judged: masked
            return eval_failure(failure["kind"], failure["reason"], mask_sample=True)
        task = job.task
        ctx = EvalContext(
            task_id=task.task_id,
            sample_index=job.sample_index,
            instruction=task.instruction,
            options=task.evaluator.options,
            status=job.status,
            diff=diff,
            session_dir=job.session_dir,
            agent_exit_code=job.agent_exit_code,
            trajectory=trajectory,
            runtime=job.runtime,
            fresh_runtime=lambda: self.fresh_runtime(job),
            metadata=task.metadata.model_dump(exclude_none=True),
        )
        return await run_evaluator(task.evaluator.name, ctx, timeout_s=task.evaluator.timeout_s)

    async def _hooks(self, job: Job, result: SessionResult) -> list[str]:
        errors = []
        for i, hook in enumerate(job.task.session.post_run):
            try:
                if hook.kind == "exec":
                    if job.runtime is None:
                        raise RuntimeError("no runtime")
                    assert hook.command is not None
                    res = await job.runtime.exec(hook.command, timeout_s=hook.timeout_s)
                    if not res.ok:
                        raise RuntimeError(f"exit {res.exit_code}{' (timeout)' if res.timed_out else ''}")
                else:
                    fn = load_object(hook.target or "", what="post-run hook")
                    out = fn(job.session_dir, result.to_dict())
                    if asyncio.iscoroutine(out):
                        await asyncio.wait_for(out, timeout=hook.timeout_s)
            except Exception as exc:
                errors.append(f"post_run[{i}]: {type(exc).__name__}: {exc}")
        return errors

    async def teardown(self, job: Job) -> None:
        """Destroy every runtime of the job (the prewarmed one included)."""
        if job.prewarm is not None:
            pending, job.prewarm = job.prewarm, None
            pending.cancel()
            (out,) = await asyncio.gather(pending, return_exceptions=True)
            if not isinstance(out, BaseException):  # a cancelled or failed prewarm cleaned up after itself
                job.fresh.append(out)
        if self.keep_runtimes:
            return
        for rt in [job.runtime, *job.fresh]:
            if rt is not None:
                try:
                    await rt.destroy()
                except Exception as exc:
                    log.warning("destroying a runtime of %s: %s", job.session_id, exc)
        job.runtime = None
        job.fresh.clear()
