# SPDX-License-Identifier: Apache-2.0
"""`polar image build | list | stop-daemon`: container images without a registry.

    polar image build [--engine docker|podman|all] [--tasks pybugs] [--only NAME,...] [--validate]

builds the base image (`polar-base`, root filesystem from mmdebstrap, cached by content hash) and, with `--tasks
pybugs`, each task's image (`polar-task-<name>`, its repository at `/testbed`), on each engine; prints one line per
image (built or cached, seconds, size); `--validate` then checks each task on that engine (gold patch resolves,
empty patch does not). Exits non-zero when anything failed, saying what. Parses flags and reports; the work is in
`nemo_polar.runtime.images` and `nemo_polar.tasks`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from nemo_polar.runtime.engines import ENGINES, EngineError, get_engine, stop_docker

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("image", help="container images built here (no registry needed)")
    sub = p.add_subparsers(dest="image_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build the base image and task images (cached by content hash)")
    b.add_argument("--engine", choices=[*ENGINES, "all"], default="all")
    b.add_argument("--tasks", choices=["none", "pybugs"], default="pybugs", help="task set whose images to build")
    b.add_argument("--only", default="", help="comma-separated task names (default: the whole set)")
    b.add_argument("--validate", action="store_true", help="validate each task on the engine after building")
    b.set_defaults(func=_build)
    s = sub.add_parser("stop-daemon", help="stop the private dockerd started for this cache dir")
    s.set_defaults(func=_stop_daemon)


def _stop_daemon(args: argparse.Namespace) -> int:
    print("stopped the private dockerd" if stop_docker() else "no private dockerd was running")
    return 0


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def _build(args: argparse.Namespace) -> int:
    from nemo_polar.runtime.images import ensure_base, ensure_task_image

    kinds = list(ENGINES) if args.engine == "all" else [args.engine]
    failed: list[str] = []
    bugs: list[Any] = []
    if args.tasks == "pybugs":
        from nemo_polar.tasks.pybugs import PyBugError, build_tree, select

        try:
            bugs = select([n for n in args.only.split(",") if n])
        except KeyError as exc:
            print(exc, file=sys.stderr)
            return 2
    for kind in kinds:
        try:
            engine = get_engine(kind)
            base = ensure_base(engine)
        except EngineError as exc:
            print(f"{kind}: {exc}", file=sys.stderr)
            failed.append(f"{kind} base")
            continue
        print(
            f"{kind}  {base.tag:40s} {'built' if base.built else 'cached'} {base.seconds:7.1f}s {_mb(base.size_bytes)}"
        )
        for bug in bugs:
            try:
                tree, _ = build_tree(bug)
                img = ensure_task_image(engine, bug.name, tree, base.tag)
            except (EngineError, PyBugError, OSError) as exc:
                print(f"{kind}  {bug.name}: {exc}", file=sys.stderr)
                failed.append(f"{kind} {bug.name}")
                continue
            state = "built" if img.built else "cached"
            print(f"{kind}  {img.tag:40s} {state} {img.seconds:7.1f}s {_mb(img.size_bytes)}", flush=True)
            if args.validate:
                from nemo_polar.tasks.validate import validate

                v = asyncio.run(validate(bug, kind))
                print(
                    f"{kind}  {bug.name}: {'valid' if v.ok else 'INVALID'} (FAIL_TO_PASS failing before "
                    f"{v.f2p_failing_before}/{v.n_f2p}, after {v.f2p_failing_after}; PASS_TO_PASS passing "
                    f"{v.p2p_passing_after}/{v.n_p2p}; {v.seconds:.1f}s)",
                    flush=True,
                )
                if not v.ok:
                    failed.append(f"{kind} {bug.name} validation")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
