# SPDX-License-Identifier: Apache-2.0
"""`polar serve` (rollout server + gateway node(s) in one process: the single-machine default), `polar
serve-rollout` and `polar serve-gateway --node-id N` (the two apart), `polar launch --ray --gateways N` (the server
and N gateways as Ray actors: `ray_launch`). Everything binds 127.0.0.1 unless `--host` says otherwise.

A gateway given `--upstream URL` (a vLLM OpenAI endpoint, repeatable) hosts the model-API proxy in-process;
without one it can only run `simulation` agents. Every command takes the stack options of the parts it runs (the
same flags everywhere: `nemo_polar.rollout.stack.add_stack_flags`), prefix-preserving generation included. The run
directory (`--work-dir`) is laid out as docs/run_directory.md says; give each `serve-gateway` on one machine its own
`--work-dir`. This module parses flags and hands them to `rollout.stack`; no logic of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from nemo_polar.proxy.tuning import run_serving, tune_serving_process
from nemo_polar.rollout.auth import SECRET_ENV, SECRET_FILE_ENV, AuthConfigError, check_bind, resolve_secret
from nemo_polar.rollout.stack import Stack, StackConfig, add_stack_flags, config_from_args, start_stack

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="rollout server + gateway node(s) in one process")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700, help="rollout server port")
    p.add_argument("--gateway-port", type=int, default=0, help="the first gateway's port (0: any free port)")
    add_stack_flags(p, ("proxy", "server", "gateway"))
    _secret_flag(p)
    p.set_defaults(func=_serve)

    p = subparsers.add_parser("serve-rollout", help="the rollout server alone")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700)
    p.add_argument("--journal", default="polar-run/rollout.sqlite")
    add_stack_flags(p, ("server",))
    _secret_flag(p)
    p.set_defaults(func=_serve_rollout)

    p = subparsers.add_parser("launch", help="rollout server + N gateway nodes as Ray actors (`--ray`)")
    p.add_argument("--ray", action="store_true", help="place them as Ray actors (the only engine so far)")
    p.add_argument("--host", default="127.0.0.1", help="the address every server binds and advertises")
    p.add_argument("--port", type=int, default=8700, help="rollout server port (0: any free port)")
    p.add_argument("--ray-address", default=None, help="ray.init address: a cluster, `auto`, or `local` (a new one)")
    p.add_argument("--ray-num-cpus", type=int, default=None, help="CPUs of a new local Ray cluster")
    p.add_argument("--ray-node-ip", default=None, help="node IP of a new local Ray cluster (127.0.0.1 in tests)")
    p.add_argument("--ray-temp-dir", default=None, help="Ray's session directory root of a new local cluster")
    add_stack_flags(p, ("proxy", "server", "gateway"))
    _secret_flag(p)
    p.set_defaults(func=_launch)

    p = subparsers.add_parser("serve-gateway", help="one gateway node, registering with a rollout server")
    p.add_argument("--node-id", required=True)
    p.add_argument("--server", required=True, help="rollout server URL")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    add_stack_flags(p, ("proxy", "gateway"), skip=("gateways",))  # one node by name: --node-id
    _secret_flag(p)
    p.set_defaults(func=_serve_gateway)


def _secret_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--secret-file",
        default=None,
        help=f"the rollout service's shared secret, in a file (else ${SECRET_FILE_ENV} or ${SECRET_ENV}); "
        "required to bind a --host other than loopback, and the same on the server, every gateway and client",
    )


def _stack_config(args: argparse.Namespace, **fixed: Any) -> StackConfig:
    """`config_from_args` with the shared secret; an unreadable secret or a public bind without one exits 2."""
    try:
        secret = resolve_secret(args.secret_file)
        cfg = config_from_args(args, secret=secret, **fixed)
        check_bind(cfg.host, cfg.secret, f"polar {getattr(args, 'command', 'serve')}")
    except AuthConfigError as exc:
        print(f"polar {getattr(args, 'command', 'serve')}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return cfg


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _run(stack_cfg: Any) -> None:
    stack: Stack = await start_stack(stack_cfg)
    tune_serving_process()  # a serving process (proxy/tuning.py): its gateways' proxies take the model calls
    try:
        await _until_signalled()
    finally:
        await stack.close()


def _serve(args: argparse.Namespace) -> int:
    cfg = _stack_config(args, host=args.host, port=args.port, gateway_port=args.gateway_port)
    run_serving(_run(cfg))
    return 0


def _serve_rollout(args: argparse.Namespace) -> int:
    journal = Path(args.journal)
    cfg = _stack_config(
        args,
        host=args.host,
        port=args.port,
        journal_path=str(journal),
        work_dir=str(journal.parent),
        gateways=0,
    )
    run_serving(_run(cfg))
    return 0


def _serve_gateway(args: argparse.Namespace) -> int:
    cfg = _stack_config(
        args,
        host=args.host,
        gateway_port=args.port,
        serve_rollout=False,
        server_url=args.server,
        gateways=1,
        node_ids=[args.node_id],
    )
    run_serving(_run(cfg))
    return 0


def _launch(args: argparse.Namespace) -> int:
    if not args.ray:
        raise SystemExit("polar launch: only `--ray` is supported; `polar serve` runs everything in one process")
    cfg = _stack_config(args, host=args.host, port=args.port)  # bad flags or a missing secret fail before Ray
    try:
        import ray
    except ImportError as exc:
        raise SystemExit("polar launch --ray needs Ray: pip install 'nemo-polar[ray]'") from exc
    from nemo_polar.rollout import ray_launch

    init: dict[str, Any] = {"address": args.ray_address, "include_dashboard": False}
    if args.ray_num_cpus is not None:
        init["num_cpus"] = args.ray_num_cpus
    if args.ray_node_ip is not None:
        init["_node_ip_address"] = args.ray_node_ip
    if args.ray_temp_dir is not None:
        init["_temp_dir"] = args.ray_temp_dir
    ray.init(**init)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs handlers of its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        launched = ray_launch.launch(cfg)
        try:
            # one JSON line on stdout once every gateway has registered: what a script waits for
            print(json.dumps({"server": launched.server_url, "gateways": launched.gateway_urls}), flush=True)
            log.info("rollout server on %s, gateways %s", launched.server_url, ", ".join(launched.gateway_urls))
            while not stop.wait(0.5):
                pass
        finally:
            ray_launch.stop(launched)
    finally:
        ray.shutdown()
    return 0
