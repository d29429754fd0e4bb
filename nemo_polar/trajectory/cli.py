# SPDX-License-Identifier: Apache-2.0
"""`polar build`: build trajectories from a records JSONL file (one `CompletionRecord` JSON per line).

Records are grouped by `session_id`; each session is built with the chosen builder and options and written as
plain JSONL traces (default), NeMo Gym rollout dicts (`--format gym`) or NeMo RL message logs
(`--format message_log`); a one-line stats summary per session goes to stderr. This module only parses
arguments and does file I/O around the pure builders.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from nemo_polar.types import CompletionRecord, ValidationError

from .export import to_gym_records, to_message_log, traces_to_jsonl
from .registry import OptionsError, build

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("build", help="build trajectories from a records JSONL file")
    p.add_argument("records", type=Path, help="JSONL file of CompletionRecords")
    p.add_argument("--builder", default="prefix_merging", help="per_request | prefix_merging | pkg.module.fn")
    p.add_argument("--fidelity", choices=["exact", "canonical"], default="exact")
    p.add_argument(
        "--eot",
        type=_terminator,
        nargs="+",
        default=None,
        metavar="ID[,ID...]",
        help="end-of-turn terminators from the tokenizer: each item ends a turn on its own (e.g. 151645 151643); "
        "a multi-token terminator is comma-joined (e.g. 7,8)",
    )
    p.add_argument("--side-calls", choices=["keep", "mask", "drop"], default="mask")
    p.add_argument("--forced-policy", choices=["mask", "keep"], default="mask")
    p.add_argument("--reward", type=float, default=None)
    p.add_argument("--format", choices=["jsonl", "gym", "message_log"], default="jsonl")
    p.add_argument("-o", "--output", type=Path, default=None, help="output file (default: stdout)")
    p.set_defaults(func=_run)


def _terminator(text: str) -> int | list[int]:
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a token id list: {text!r}") from exc
    return ids[0] if len(ids) == 1 else ids


def _read(path: Path) -> dict[str, list[CompletionRecord]]:
    sessions: dict[str, list[CompletionRecord]] = defaultdict(list)
    with path.open("rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = CompletionRecord.from_json(line)
            except (orjson.JSONDecodeError, ValidationError, TypeError, ValueError) as exc:
                raise SystemExit(f"{path}:{n}: not a CompletionRecord: {exc}") from exc
            sessions[rec.session_id].append(rec)
    return sessions


def _run(args: argparse.Namespace) -> int:
    if not args.records.is_file():
        print(f"polar build: no such file: {args.records}", file=sys.stderr)
        return 2
    sessions = _read(args.records)
    out = args.output.open("wb") if args.output else sys.stdout.buffer
    try:
        for sid, recs in sessions.items():
            try:
                traj = build(
                    recs,
                    args.builder,
                    fidelity=args.fidelity,
                    eot_token_ids=args.eot or (),
                    side_calls=args.side_calls,
                    forced_policy=args.forced_policy,
                    reward=args.reward,
                )
            except (OptionsError, KeyError) as exc:
                print(f"polar build: {exc}", file=sys.stderr)
                return 2
            if args.format == "jsonl":
                out.write(traces_to_jsonl(traj))
            elif args.format == "gym":
                for row in to_gym_records(traj, recs):
                    out.write(orjson.dumps({"session_id": sid, **row}) + b"\n")
            else:
                for i, t in enumerate(traj.traces):
                    row = {"session_id": sid, "trace_index": i, "message_log": to_message_log(t)}
                    out.write(orjson.dumps(row) + b"\n")
            s = traj.stats
            print(
                f"{sid}: {traj.status} records={s.records} chains={s.chains} merged={s.merged} "
                f"trainable={s.trainable_tokens} drift_tokens={s.drift_tokens} "
                f"splits={ {k: v for k, v in s.splits.items() if v} } policy={s.policy_tokens}",
                file=sys.stderr,
            )
    finally:
        if args.output:
            out.close()
    return 0
