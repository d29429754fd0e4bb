# SPDX-License-Identifier: Apache-2.0
"""Shared by `prefix_cache.py` and `session_budget.py`: example tasks through the real rollout stack (rollout server
→ gateway → sandboxed harness CLI → hosted proxy → vLLM), one session at a time, and what vLLM's own counters say.

`Stack` is one proxy configuration with its own rollout server and gateway, assembled by
`nemo_polar.rollout.stack.start_stack` (one run slot: sessions do not overlap, so a `/metrics` delta taken around a
session is that session's). `vllm_counters` reads vLLM's Prometheus counters,
`reset_prefix_cache` empties an engine's prefix cache (the dev endpoint: the servers run with
`VLLM_SERVER_DEV_MODE=1`). Not a benchmark itself (the leading underscore keeps it out of `make bench`).
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total")
# live calls (side calls such as Qwen Code's next-speaker check) on a random-weight model are noise: keep them short
SAMPLING = {"max_tokens": 64, "temperature": 0.0}


def missing_parts(script: str, harnesses: list[str]) -> int | None:
    """Why `script` cannot run here, said once: 0 when the backend is not prepared (a noted skip), 2 when a harness
    CLI is not installed; None when tiny-qwen3 and every harness are ready."""
    from _tables import note
    from nemo_polar.harness_adapters import get_adapter
    from nemo_polar.harness_adapters.install import status as install_status

    from nemo_polar.backend import is_prepared

    if not is_prepared("tiny-qwen3"):
        note(f"{script}: skipped, the backend is not prepared (`polar backend prepare`).")
        return 0
    missing = [h for h in harnesses if not install_status(get_adapter(h)).installed]
    if missing:
        print(f"{script}: not installed: {', '.join(missing)} (`polar harness install NAME`)", file=sys.stderr)
        return 2
    return None


def parse_counters(text: str, names: tuple[str, ...] = COUNTERS) -> dict[str, float]:
    """Sum each named counter over its label sets in a Prometheus text exposition (missing names are 0)."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            try:
                out[name] += float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                continue
    return out


def vllm_counters(base_urls: list[str]) -> dict[str, float]:
    """vLLM's prefix-cache and prompt-token counters, summed over engines."""
    total = dict.fromkeys(COUNTERS, 0.0)
    for url in base_urls:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
            for k, v in parse_counters(r.read().decode()).items():
                total[k] += v
    return total


def reset_prefix_cache(base_urls: list[str], tries: int = 20) -> None:
    """Empty each engine's prefix cache; vLLM refuses (`success: false`) while blocks are held, so retry a while."""
    for url in base_urls:
        for _ in range(tries):
            req = urllib.request.Request(url + "/reset_prefix_cache", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=60) as r:
                body = r.read()
            if b"false" not in body:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{url}: vLLM did not reset its prefix cache after {tries} tries ({body!r})")


def agent_options(harness: str) -> dict[str, Any]:
    """The adapter options a benchmark session runs with; the `shell` harness runs the shipped agent of one's own
    (`nemo_polar/examples/tiny_agent.py`)."""
    from nemo_polar.examples import tiny_agent_command

    return {"max_turns": 12, **({"command_line": tiny_agent_command()} if harness == "shell" else {})}


def example_task(name: str, harness: str, *, plan: str, task_id: str, builder: str) -> Any:
    """One sandboxed session of example `name` driven by its `plan` (`fix_plan` / `noop_plan`), graded by its tests."""
    from tests.rollout.helpers import example_task as make

    return make(
        name,
        task_id=task_id,
        plans=(plan,),
        runtime={"isolation": "sandbox", "source": f"example:{name}"},
        agent={"harness": harness, "timeout_s": 300, "options": agent_options(harness), "sampling": SAMPLING},
        builder=builder,
        timeout_s=600,
    )


def pybugs_image(name: str, engine: str) -> str:
    """The task image of real-repository task `name` on container engine `engine` (`docker` / `podman`; built here on
    first use, then cached by content hash; the engine started as the runtime starts it)."""
    from nemo_polar.runtime.engines import get_engine
    from nemo_polar.runtime.images import ensure_task_image
    from nemo_polar.tasks.pybugs import build_tree, select

    (bug,) = select([name])
    return ensure_task_image(get_engine(engine), bug.name, build_tree(bug)[0]).tag


def pybugs_task(name: str, harness: str, *, runtime: str, task_id: str, builder: str, image: str | None = None) -> Any:
    """One session of real-repository task `name` (`nemo_polar.tasks.pybugs`: a PyPI release with an injected
    bug, graded by its own tests with SWE-bench's protocol) driven by its fix plan, in `runtime`: `local` (bubblewrap
    over the cached tree) or `docker` / `podman` (a `--network none` container from the task image `image`)."""
    from nemo_polar.tasks.pybugs import select, task_specs

    (bug,) = select([name])
    images = {bug.name: image} if image else None
    (task,) = task_specs([bug], runtime=runtime, images=images, harness=harness, plans=("fix",))
    agent = task.agent.model_copy(update={"timeout_s": 300, "options": agent_options(harness), "sampling": SAMPLING})
    return task.model_copy(
        update={
            "task_id": task_id,
            "agent": agent,
            "builder": task.builder.model_copy(update={"name": builder}),
            "timeout_s": 900,
        }
    )


class Stack:
    """`nemo_polar.rollout.stack.start_stack` with one gateway of one run slot; `routing` is the stack's option
    (`sticky` | `round_robin`: how its proxy spreads requests over the upstreams).

    `options`: `StackConfig` fields (upstreams, served_model, prefix_preserving, model_dir, eot_token_ids, …)."""

    def __init__(self, work: Path, options: dict[str, Any], *, routing: str = "sticky"):
        self.work, self.options, self.routing = work, options, routing

    async def __aenter__(self) -> Stack:
        from nemo_polar.rollout.stack import StackConfig, start_stack

        cfg = StackConfig(
            work_dir=str(self.work),
            gateways=1,
            run_slots=1,
            init_workers=1,
            ready_buffer=1,
            heartbeat_s=0.2,
            routing=self.routing,
            **self.options,
        )
        self.stack = await start_stack(cfg)
        self.server_url = self.stack.server_url
        proxy = self.stack.proxy
        assert proxy is not None and self.stack.gateway is not None, "the stack needs an upstream and a gateway"
        self.proxy = proxy
        self.gw = self.stack.gateway
        self.marks: dict[str, dict[str, float]] = {}
        self._watch_stages()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.close()

    def _watch_stages(self) -> None:
        """Keep each session's stage marks (`Job.t`: admitted, init/run/post start and end, wall-clock), and mark
        the evaluation's start and end inside POSTRUN, by wrapping the gateway's own stage methods (no product
        code changes; the marks are the ones the gateway records for `SessionResult.timing`)."""
        work = self.gw.work
        postrun, evaluate = work.postrun, work._evaluate

        async def timed_evaluate(job: Any, *a: Any, **kw: Any) -> Any:
            job.t["eval_start"] = time.time()
            try:
                return await evaluate(job, *a, **kw)
            finally:
                job.t["eval_end"] = time.time()

        async def kept_postrun(job: Any) -> Any:
            self.marks[job.session_id] = job.t
            return await postrun(job)

        work._evaluate = timed_evaluate  # type: ignore[method-assign]
        work.postrun = kept_postrun  # type: ignore[method-assign]

    async def run(self, task: Any, timeout_s: float = 900) -> list[tuple[Any, list[Any]]]:
        """Submit `task`, wait for its sessions; each `SessionResult` with its proxy records (in call order). The
        session's stage marks are in `self.marks[session_id]`."""
        from nemo_polar.rollout import PolarClient

        async with PolarClient(self.server_url, poll_wait_s=5) as client:
            await client.submit(task)
            results = await asyncio.wait_for(client.collect(task.task_id), timeout=timeout_s)
        out = []
        for r in results:
            records = await self.proxy.records(r.session_id)
            out.append((r, sorted(records, key=lambda rec: rec.seq)))
        return out
