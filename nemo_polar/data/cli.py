# SPDX-License-Identifier: Apache-2.0
"""`polar data swe-gym INPUT.jsonl --out DIR`: SWE-Gym / SkyRL-v0-293 rows → `DIR/gym.jsonl` (NeMo Gym rows for
`polar_swe`) and `DIR/tasks.jsonl` (Polar TaskSpecs). Parses flags and reports; the work is in `swe_gym`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nemo_polar.data.swe_gym import DEFAULT_IMAGE_PREFIX, SweGymError, convert_file

__all__ = ["register"]


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


def _swe_gym(args: argparse.Namespace) -> int:
    try:
        rows, tasks = convert_file(
            args.input,
            args.out,
            runtime=args.runtime,
            harness=args.harness,
            builder=args.builder,
            num_samples=args.num_samples,
            timeout_s=args.timeout_s,
            image_prefix=args.image_prefix,
        )
    except SweGymError as exc:
        print(exc, file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cannot read {args.input}: {exc}", file=sys.stderr)
        return 1
    print(f"{len(rows)} rows -> {args.out}/gym.jsonl, {len(tasks)} tasks -> {args.out}/tasks.jsonl")
    return 0
