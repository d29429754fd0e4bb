# SPDX-License-Identifier: Apache-2.0
"""`polar data swe-gym INPUT.jsonl --out DIR`: SWE-Gym / SkyRL-v0-293 rows → `DIR/gym.jsonl` (NeMo Gym rows for
`polar_swe`) and `DIR/tasks.jsonl` (Polar TaskSpecs). Parses flags and reports; the work is in `swe_gym`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nemo_polar.data.swe_gym import DEFAULT_IMAGE_PREFIX, SweGymError, convert_file
from nemo_polar.keywords import same_named
from nemo_polar.rundir import RunDir

__all__ = ["register"]

# the `swe-gym` flags passed on to `convert_file` (each named as its option)
SWE_GYM_OPTIONS = ("runtime", "harness", "builder", "num_samples", "timeout_s", "image_prefix")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("data", help="dataset converters")
    sub = p.add_subparsers(dest="data_command", metavar="DATASET", required=True)
    s = sub.add_parser("swe-gym", help="SWE-Gym / SkyRL-v0-293 JSONL → Gym rows (polar_swe) and TaskSpecs")
    s.add_argument("input", help="JSONL, one SWE-Gym instance per line")
    s.add_argument("--out", required=True, help="output directory (gym.jsonl, tasks.jsonl)")
    s.add_argument("--runtime", choices=["docker", "apptainer"], default="docker")
    s.add_argument("--harness", default="qwen_code", help="harness adapter name for the TaskSpecs")
    s.add_argument("--builder", choices=["prefix_merging", "per_request"], default="prefix_merging")
    s.add_argument("--num-samples", type=int, default=1, help="samples per task in the TaskSpecs")
    s.add_argument("--timeout-s", type=float, default=1800.0, help="session budget per sample")
    s.add_argument("--image-prefix", default=DEFAULT_IMAGE_PREFIX, help="for rows without an image")
    s.set_defaults(func=_swe_gym)
    b = sub.add_parser("pybugs", help="the shipped real-repository task set (PyPI releases with an injected bug)")
    b.add_argument("action", choices=["list", "tasks"], help="list the tasks, or write DIR/tasks.jsonl")
    b.add_argument("--out", help="output directory for `tasks`")
    b.add_argument("--runtime", choices=["local", "docker", "podman"], default="local")
    b.add_argument("--only", default="", help="comma-separated task names (default: all)")
    b.add_argument("--harness", default="qwen_code")
    b.add_argument("--num-samples", type=int, default=1)
    b.add_argument("--plans", default="", help="per-sample plans, comma-separated from fix,noop (tests, demos)")
    b.set_defaults(func=_pybugs)


def _pybugs(args: argparse.Namespace) -> int:
    from nemo_polar.rollout.spec import dump_jsonl
    from nemo_polar.tasks.pybugs import PyBugError, select, task_specs

    try:
        bugs = select([n for n in args.only.split(",") if n])
    except KeyError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.action == "list":
        print(f"{'task':32s} {'project':16s} {'version':9s} F2P P2P  problem")
        for b in bugs:
            text = b.problem_statement.replace("\n", " ")
            print(
                f"{b.name:32s} {b.project:16s} {b.version:9s} {len(b.fail_to_pass):3d} {len(b.pass_to_pass):3d}  {text[:60]}…"
            )
        return 0
    if not args.out:
        print("pybugs tasks needs --out DIR", file=sys.stderr)
        return 2
    plans = [p for p in args.plans.split(",") if p]
    if any(p not in ("fix", "noop") for p in plans):
        print(f"--plans takes fix / noop, got {args.plans!r}", file=sys.stderr)
        return 2
    try:
        tasks = task_specs(bugs, runtime=args.runtime, harness=args.harness, num_samples=args.num_samples, plans=plans)
    except (PyBugError, OSError) as exc:
        print(f"cannot build the task repositories: {exc}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dump_jsonl(tasks, RunDir(out).tasks)
    print(f"{len(tasks)} tasks ({args.runtime}) -> {RunDir(out).tasks}")
    return 0


def _swe_gym(args: argparse.Namespace) -> int:
    try:
        rows, tasks = convert_file(args.input, args.out, **same_named(args, SWE_GYM_OPTIONS))
    except SweGymError as exc:
        print(exc, file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cannot read {args.input}: {exc}", file=sys.stderr)
        return 1
    print(f"{len(rows)} rows -> {args.out}/gym.jsonl, {len(tasks)} tasks -> {args.out}/tasks.jsonl")
    return 0
