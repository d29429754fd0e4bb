# SPDX-License-Identifier: Apache-2.0
"""Run-slot occupancy with staged pools vs a sequential baseline, through the real gateway pools.

    .venv/bin/python benchmarks/staging.py [--sessions 64] [--run-slots 4] [--seed 0]

What runs: 64 one-sample tasks on one `Gateway` (the real INIT / READY / RUNNING / POSTRUN pools, real local
runtimes with their git baseline). The three costs are SIMULATED by timed processes, named as a simulation:
  - INIT: a prepare action `sleep <init_s>` (stands in for pulling / starting a container and installing deps),
  - RUN: the `simulation` agent sleeping `<run_s>` (stands in for the GPU-bound harness run),
  - EVAL: the `command` evaluator running `sleep <eval_s>` (stands in for a test suite).

The distribution is heavy-tailed, shaped after SWE-style rollouts (container start-up tens of seconds with a long
tail, agent runs minutes, test runs tens of seconds with a very long tail) and scaled down ~100x so the whole
benchmark stays under 3 minutes: log-normal with medians init 0.25 s, run 1.0 s, eval 0.3 s and log-sigmas
0.8 / 0.5 / 1.0, each capped at 8x its median. The same seeded draws feed both configurations.

Staged: `init_workers=run_slots`, `ready_buffer=run_slots`, `postrun_workers=run_slots`: preparation and evaluation
overlap the runs. Baseline (`staged=False`): each run slot prepares, runs and evaluates its own session in turn,
as a naive runner does. Occupancy = busy run-slot seconds / (run_slots x window), over the backlog window (first
run start → last run start: while sessions are still waiting, an idle slot is the stager's fault) and over the
whole makespan. Printed side by side with their ratio; the target is staged backlog occupancy >= 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nemo_polar.rollout.gateway import Gateway, GatewayConfig
from nemo_polar.rollout.spec import TaskSpec

MEDIANS = {"init": 0.25, "run": 1.0, "eval": 0.3}
SIGMAS = {"init": 0.8, "run": 0.5, "eval": 1.0}
CAP = 8.0


def draws(n: int, seed: int) -> list[dict[str, float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        d = {}
        for k, med in MEDIANS.items():
            d[k] = min(med * CAP, med * math.exp(rng.gauss(0.0, SIGMAS[k])))
        out.append(d)
    return out


def task(i: int, d: dict[str, float]) -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "task_id": f"stage-{i}",
            "instruction": "simulated session",
            "runtime": {"isolation": "none"},
            "agent": {"harness": "simulation", "options": {"run_s": round(d["run"], 3)}},
            "builder": "per_request",
            "evaluator": {"name": "command", "options": {"command": f"sleep {d['eval']:.3f}"}},
            "session": {"prepare": [{"kind": "exec", "command": f"sleep {d['init']:.3f}"}]},
            "timeout_s": 600,
        }
    )


async def run_config(
    tasks: list[TaskSpec], *, slots: int, staged: bool, work: Path, on_result: Any = None
) -> dict[str, Any]:
    gw = Gateway(
        GatewayConfig(
            node_id="bench",
            work_dir=str(work),
            init_workers=slots,
            ready_buffer=slots,
            run_slots=slots,
            postrun_workers=slots,
            staged=staged,
        ),
        on_result=on_result,
    )
    await gw.start()
    t0 = time.monotonic()
    pending = list(tasks)
    try:
        while pending:  # a client that keeps the gateway fed, backing off on "full" like the server does
            if gw.submit(pending[0].task_id, pending[0], 0) == "full":
                await asyncio.sleep(0.02)
                continue
            pending.pop(0)
        await gw.wait_idle(600)
    finally:
        await gw.stop()
    end = time.monotonic()
    iv = sorted(gw.meter.intervals)
    first, last_start, last_end = iv[0][0], iv[-1][0], max(b for _, b in iv)
    return {
        "makespan_s": end - t0,
        "backlog": gw.meter.occupancy(first, last_start, slots),
        "whole": gw.meter.occupancy(first, last_end, slots),
        "finished": dict(gw.finished),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--run-slots", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ds = draws(args.sessions, args.seed)
    tasks = [task(i, d) for i, d in enumerate(ds)]
    tot = {k: sum(d[k] for d in ds) for k in MEDIANS}
    print(
        f"{args.sessions} sessions, {args.run_slots} run slots; simulated seconds (sum): "
        + ", ".join(f"{k} {v:.1f}" for k, v in tot.items())
    )
    print(
        "p50/p99/max: "
        + "; ".join(
            f"{k} {sorted(d[k] for d in ds)[len(ds) // 2]:.2f}/{sorted(d[k] for d in ds)[int(len(ds) * 0.99)]:.2f}/"
            f"{max(d[k] for d in ds):.2f}"
            for k in MEDIANS
        )
    )
    with tempfile.TemporaryDirectory(prefix="polar-staging-") as tmp:
        staged = asyncio.run(run_config(tasks, slots=args.run_slots, staged=True, work=Path(tmp) / "staged"))
        base = asyncio.run(run_config(tasks, slots=args.run_slots, staged=False, work=Path(tmp) / "sequential"))
    print(f"{'':28s}{'staged':>10s}{'sequential':>12s}{'ratio':>8s}")
    for key, label in (("backlog", "occupancy (backlog window)"), ("whole", "occupancy (whole makespan)")):
        print(f"{label:28s}{staged[key]:10.3f}{base[key]:12.3f}{staged[key] / base[key]:8.2f}")
    print(
        f"{'makespan s':28s}{staged['makespan_s']:10.1f}{base['makespan_s']:12.1f}"
        f"{base['makespan_s'] / staged['makespan_s']:8.2f}  (speed-up)"
    )
    print(f"finished: staged {staged['finished']}, sequential {base['finished']}")
    ok = staged["backlog"] >= 0.95
    print(f"target staged backlog occupancy >= 0.95: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
