# SPDX-License-Identifier: Apache-2.0
"""One harness session through an embedded proxy, written as a run directory (docs/run_directory.md).

`run_session` starts the proxy (a stack of one standalone proxy: `nemo_polar.rollout.stack`) on loopback in front of
`upstream` (its store is the run directory's `records.sqlite`), creates a session whose plan (harness-neutral steps
resolved through the adapter) and request classifier come from the harness adapter, runs the CLI in the bubblewrap
sandbox, then builds the trajectory and writes `trajectories.jsonl`, `summary.json` and `sessions/<session_id>/`
(harness stdout/stderr, the connect trace, the workdir diff when the workdir is a git repository). The summary
counts the calls that got a model answer and those that failed, with the first failure's recorded error;
`SessionRun.failure` says why a session did not do its job (the harness failed or timed out, or never got a model
answer). It does not evaluate or assign credit.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_polar.harness_adapters import HarnessAdapter, get_adapter, resolve_plan
from nemo_polar.rollout.stack import StackConfig, start_stack
from nemo_polar.rundir import RunDir
from nemo_polar.runtime.harness import make_context, run_harness
from nemo_polar.runtime.sandbox import AGENT_HOME, AGENT_WORKDIR
from nemo_polar.trajectory.export import traces_to_jsonl
from nemo_polar.trajectory.registry import build

__all__ = ["SessionRun", "run_session"]


@dataclass(frozen=True, slots=True)
class SessionRun:
    session_id: str
    exit_code: int | None
    timed_out: bool
    records: int
    call_kinds: dict[str, int]
    chains: dict[str, int]
    destinations: list[str]
    out: Path
    answered: int = 0  # records with a model answer (no error)
    failed_calls: int = 0  # records whose call failed (upstream error, rejected request, stream cut)
    first_error: dict[str, Any] | None = None  # the first failed call's recorded error

    @property
    def failure(self) -> str | None:
        """Why the session did not do its job (None when it did): the harness failed, or never got an answer."""
        if self.timed_out:
            return "the harness timed out"
        if self.answered == 0:
            if self.failed_calls:
                why = _error_text(self.first_error)
                return f"the harness got no model answer: {self.failed_calls} call(s) failed, the first with {why}"
            return "the harness made no model call"
        if self.exit_code != 0:
            return f"the harness exited with {self.exit_code}"
        return None


def _error_text(error: dict[str, Any] | None) -> str:
    if not error:
        return "an unknown error"
    status = error.get("upstream_status") or error.get("status")
    head = f"{status} " if status else ""
    return f"{head}{error.get('message') or error.get('type') or error}"


def _layout(out: Path, workdir: Path, session_id: str) -> tuple[Path, Path, Path, Path]:
    """Resolved run directory and workdir, the session's directory and its private HOME (created)."""
    out, workdir = out.resolve(), workdir.resolve()
    sdir = RunDir(out).session(session_id)
    sdir.home.mkdir(parents=True)
    return out, workdir, sdir.root, sdir.home


def _git_diff(workdir: Path) -> str | None:
    if not (workdir / ".git").exists():
        return None
    proc = subprocess.run(
        ["git", "-C", str(workdir), "diff", "HEAD"], capture_output=True, text=True, timeout=60, check=False
    )
    return proc.stdout if proc.returncode == 0 else None


async def run_session(
    *,
    harness: str | HarnessAdapter,
    workdir: Path,
    instruction: str,
    upstream: str,
    out: Path,
    plan: dict[str, Any] | None = None,
    model: str = "polar",
    served_model: str | None = None,
    builder: str = "prefix_merging",
    timeout_s: float = 1800.0,
    provider_api: str | None = None,
    command_line: str | None = None,
    proxy_options: Mapping[str, Any] | None = None,
) -> SessionRun:
    """`proxy_options`: further proxy options of the stack (`prefix_preserving`, `model_dir`, `eot_token_ids`,
    `sampling`, `forced_tokens`: see `nemo_polar.rollout.stack.StackConfig`)."""
    adapter = get_adapter(harness) if isinstance(harness, str) else harness
    stack_cfg = StackConfig(
        work_dir=str(out),
        upstreams=[upstream],
        served_model=served_model,
        serve_rollout=False,
        gateways=0,
        **dict(proxy_options or {}),
    )
    session_id = uuid.uuid4().hex
    out, workdir, sdir, home = _layout(out, workdir, session_id)
    stack = await start_stack(stack_cfg)  # a standalone proxy: no rollout server, no gateway
    try:
        assert stack.proxy is not None
        proxy = stack.proxy.proxy
        # the CLI sees its workdir and HOME at the sandbox's fixed paths (prompts name no host directory)
        ctx_args: dict[str, Any] = {
            "model": model,
            "workdir": Path(AGENT_WORKDIR),
            "home": Path(AGENT_HOME),
            "provider_api": provider_api,
            "command_line": command_line,  # the `shell` adapter's command
            "idle_timeout_s": stack.proxy.idle_limit_s,  # longer than the proxy may keep a call silent
        }
        probe = make_context(adapter, base_url=proxy.base_url, api_key="-", **ctx_args)
        resolved = resolve_plan(plan, adapter, probe) if plan else None
        session = await proxy.create_session(
            session_id=session_id,
            plan=resolved,
            classifier=adapter.classify_request,
            metadata={"harness": adapter.name},
        )
        ctx = make_context(adapter, base_url=proxy.base_url, api_key=session.api_key, **ctx_args)
        started = time.time()
        result = await run_harness(
            adapter, ctx, instruction, timeout_s=timeout_s, out_dir=sdir, host_workdir=workdir, host_home=home
        )
        duration_s = time.time() - started
        records = sorted(proxy.store.list_records(session_id, limit=1_000_000), key=lambda r: r.seq)
    finally:
        await stack.close()
    trajectory = build(records, builder=builder)
    rd = RunDir(out)
    rd.trajectories.write_bytes(traces_to_jsonl(trajectory))
    rd.session(session_id).connect.write_text("".join(json.dumps(e) + "\n" for e in result.connections))
    diff = _git_diff(workdir)
    if diff is not None:
        rd.session(session_id).workdir_diff.write_text(diff)
    failed = [r for r in records if r.error is not None]
    run = SessionRun(
        session_id=session_id,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        records=len(records),
        call_kinds=dict(Counter(r.call_kind for r in records)),
        chains=dict(Counter(str(t.chain_kind) for t in trajectory.traces)),
        destinations=sorted(result.destinations),
        out=out,
        answered=len(records) - len(failed),
        failed_calls=len(failed),
        first_error=failed[0].error if failed else None,
    )
    summary = {
        "harness": adapter.name,
        "version": adapter.version,
        "session_id": session_id,
        "instruction": instruction,
        "upstream": upstream,
        "exit_code": run.exit_code,
        "timed_out": run.timed_out,
        "duration_s": round(duration_s, 3),
        "records": run.records,
        "answered": run.answered,
        "failed_calls": run.failed_calls,
        "first_error": run.first_error,
        "failure": run.failure,
        "call_kinds": run.call_kinds,
        "chains": run.chains,
        "builder": builder,
        "status": trajectory.status,
        "connect_destinations": run.destinations,
    }
    rd.summary.write_text(json.dumps(summary, indent=2) + "\n")
    return run
