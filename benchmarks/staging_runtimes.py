# SPDX-License-Identifier: Apache-2.0
"""Run-slot occupancy and session wall time per runtime: bubblewrap vs Docker vs Podman containers, side by side.

    .venv/bin/python benchmarks/staging_runtimes.py [--sessions 8] [--run-slots 2] [--run-s 2.0]

What runs: `--sessions` one-sample sessions of the real-repository task `pybugs/webcolors-short-hex` on one
`Gateway` (the real INIT / READY / RUNNING / POSTRUN pools) per runtime: INIT creates the real runtime (a
bubblewrap sandbox over the task tree, or a `--network none` container from the task image), RUN is the SIMULATED
agent (a timed process, named as a simulation: `--run-s` seconds, then it applies the task's fix plan itself, no
model), POSTRUN grades with SWE-bench's protocol (`swe_tests`) on a fresh runtime prewarmed while the agent ran.
Every session must score 1.0 (the fix plan is correct), so the numbers are for work that really happened.

Printed per runtime: staged run-slot occupancy (backlog window and whole makespan), makespan, and per-session wall
time p50 / max of INIT, POSTRUN and admitted → result; plus the container start latency (`run --rm IMAGE true`,
median of 5) per engine. Needs the task images (`polar image build --tasks pybugs --only webcolors-short-hex`,
or built here on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from staging import run_config  # the same gateway driver as benchmarks/staging.py

from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.runtime.engines import ENGINES, engine_available, get_engine
from nemo_polar.runtime.images import ensure_task_image
from nemo_polar.tasks.pybugs import build_tree, select, task_specs

TASK = "webcolors-short-hex"


def tasks_for(kind: str, n: int, run_s: float) -> list[TaskSpec]:
    (bug,) = select([TASK])
    images = None
    if kind != "local":
        images = {bug.name: ensure_task_image(get_engine(kind), bug.name, build_tree(bug)[0]).tag}
    (base,) = task_specs([bug], runtime=kind, images=images, plans=("fix",))
    agent = {"harness": "simulation", "options": {"run_s": run_s}}
    return [
        base.model_copy(update={"task_id": f"{kind}-{i}", "agent": base.agent.model_validate(agent)}) for i in range(n)
    ]


def start_latency(kind: str, image: str) -> float:
    engine = get_engine(kind)
    samples = []
    for _ in range(5):
        t0 = time.monotonic()
        engine.check(engine.run_sync("run", "--rm", "--network", "none", image, "true"), "run")
        samples.append(time.monotonic() - t0)
    return statistics.median(samples)


async def run_kind(kind: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    tasks = tasks_for(kind, args.sessions, args.run_s)
    results: list[Any] = []

    async def keep(result: Any) -> None:
        results.append(result)

    out = await run_config(tasks, slots=args.run_slots, staged=True, work=work, on_result=keep)
    out["rewards"] = sorted({r.reward for r in results})
    for key in ("init_s", "postrun_s", "total_s"):
        vals = sorted(r.timing.get(key, 0.0) for r in results)
        out[key] = (vals[len(vals) // 2], vals[-1]) if vals else (0.0, 0.0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--run-slots", type=int, default=2)
    ap.add_argument("--run-s", type=float, default=2.0)
    args = ap.parse_args(argv)
    kinds = ["local", *[k for k in ENGINES if engine_available(k) is None]]
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="polar-staging-rt-") as tmp:
        for kind in kinds:
            rows[kind] = asyncio.run(run_kind(kind, args, Path(tmp) / kind))
    print(f"{args.sessions} sessions of pybugs/{TASK}, {args.run_slots} run slots, simulated agent {args.run_s}s")
    print(
        f"{'runtime':10s}{'occ backlog':>12s}{'occ whole':>10s}{'makespan':>10s}{'init p50/max':>15s}"
        f"{'postrun p50/max':>17s}{'session p50/max':>17s}  rewards"
    )
    for kind, r in rows.items():
        label = "bubblewrap" if kind == "local" else kind
        print(
            f"{label:10s}{r['backlog']:12.3f}{r['whole']:10.3f}{r['makespan_s']:9.1f}s"
            + "".join(f"{r[k][0]:9.2f}/{r[k][1]:5.2f}s" for k in ("init_s", "postrun_s", "total_s"))
            + f"  {r['rewards']}"
        )
    for kind in kinds[1:]:
        (bug,) = select([TASK])
        image = ensure_task_image(get_engine(kind), bug.name, build_tree(bug)[0]).tag
        print(f"container start latency ({kind}, run --rm true, median of 5): {start_latency(kind, image):.2f}s")
    bad = [k for k, r in rows.items() if r["rewards"] != [1.0]]
    if bad:
        print(f"sessions did not all score 1.0 on: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
