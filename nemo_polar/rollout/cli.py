# SPDX-License-Identifier: Apache-2.0
"""`polar serve` (rollout server + one gateway in one process: the single-machine default), `polar serve-rollout`
and `polar serve-gateway --node-id N` (the two apart), `polar launch --ray --gateways N` (the server and N gateways
as Ray actors: `ray_launch`). Everything binds 127.0.0.1 unless `--host` says otherwise.

A gateway given `--upstream URL` (a vLLM OpenAI endpoint, repeatable) hosts the model-API proxy in-process;
without one it can only run `simulation` agents. The run directory (`--work-dir`) follows DESIGN §3: `rollout.sqlite`
(the server's journal), `records.sqlite` (the proxy's store), `sessions/<session_id>/`; give each `serve-gateway`
on one machine its own `--work-dir`. This module parses flags and wires the parts; no logic of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from nemo_polar.rollout.gateway import Gateway, GatewayConfig
from nemo_polar.rollout.proxylink import HostedProxy, start_hosted_proxy
from nemo_polar.rollout.server import RolloutServer, ServerConfig

__all__ = ["register"]

log = logging.getLogger(__name__)


def _gateway_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--work-dir",
        default="polar-run",
        help="run directory: sessions/<session_id>/ (agent.log, diff.patch, result.json), runtimes/, records.sqlite",
    )
    p.add_argument("--init-workers", type=int, default=2)
    p.add_argument("--ready-buffer", type=int, default=2)
    p.add_argument("--run-slots", type=int, default=2)
    p.add_argument("--postrun-workers", type=int, default=2)
    p.add_argument("--upstream", action="append", default=[], help="vLLM base URL for the hosted proxy")
    p.add_argument("--model", default=None, help="served model name (default: the upstream's)")
    p.add_argument("--eot-token-ids", default=None, help="comma-separated end-of-turn ids for the builders")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="rollout server + one gateway node in one process")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700, help="rollout server port")
    p.add_argument("--gateway-port", type=int, default=0, help="gateway port (0: any free port)")
    _gateway_flags(p)
    p.set_defaults(func=_serve)

    p = subparsers.add_parser("serve-rollout", help="the rollout server alone")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700)
    p.add_argument("--journal", default="polar-run/rollout.sqlite")
    p.add_argument("--node-timeout-s", type=float, default=60.0)
    p.add_argument("--max-attempts", type=int, default=2)
    p.set_defaults(func=_serve_rollout)

    p = subparsers.add_parser("launch", help="rollout server + N gateway nodes as Ray actors (`--ray`)")
    p.add_argument("--ray", action="store_true", help="place them as Ray actors (the only engine so far)")
    p.add_argument("--gateways", type=int, default=1, help="number of gateway actors")
    p.add_argument("--host", default="127.0.0.1", help="the address every server binds and advertises")
    p.add_argument("--port", type=int, default=8700, help="rollout server port (0: any free port)")
    p.add_argument("--ray-address", default=None, help="ray.init address: a cluster, `auto`, or `local` (a new one)")
    p.add_argument("--ray-num-cpus", type=int, default=None, help="CPUs of a new local Ray cluster")
    p.add_argument("--ray-node-ip", default=None, help="node IP of a new local Ray cluster (127.0.0.1 in tests)")
    p.add_argument("--ray-temp-dir", default=None, help="Ray's session directory root of a new local cluster")
    _gateway_flags(p)
    p.set_defaults(func=_launch)

    p = subparsers.add_parser("serve-gateway", help="one gateway node, registering with a rollout server")
    p.add_argument("--node-id", required=True)
    p.add_argument("--server", required=True, help="rollout server URL")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    _gateway_flags(p)
    p.set_defaults(func=_serve_gateway)


def _gateway_config(args: argparse.Namespace, node_id: str, server_url: str | None) -> GatewayConfig:
    builder_options: dict[str, Any] = {}
    if args.eot_token_ids:
        builder_options["eot_token_ids"] = [int(x) for x in args.eot_token_ids.split(",")]
    return GatewayConfig(
        node_id=node_id,
        work_dir=args.work_dir,
        init_workers=args.init_workers,
        ready_buffer=args.ready_buffer,
        run_slots=args.run_slots,
        postrun_workers=args.postrun_workers,
        server_url=server_url,
        model=args.model or "polar",
        builder_options=builder_options,
    )


async def _hosted_proxy(args: argparse.Namespace, node_id: str) -> HostedProxy | None:
    return await start_hosted_proxy(list(args.upstream), store_dir=args.work_dir, model=args.model)


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _run_gateway(args: argparse.Namespace, node_id: str, server_url: str | None, host: str, port: int) -> None:
    proxy = await _hosted_proxy(args, node_id)
    gw = Gateway(_gateway_config(args, node_id, server_url), proxy=proxy)
    url = await gw.serve(host, port)
    log.info("gateway %s on %s (proxy %s)", node_id, url, proxy.base_url if proxy else "none: simulation only")
    try:
        await _until_signalled()
    finally:
        await gw.close()
        if proxy is not None:
            await proxy.stop()


async def _serve_all(args: argparse.Namespace) -> None:
    work = Path(args.work_dir)
    await asyncio.to_thread(work.mkdir, parents=True, exist_ok=True)
    server = RolloutServer(ServerConfig(journal_path=str(work / "rollout.sqlite")))
    runner = web.AppRunner(server.make_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    server_url = f"http://{args.host}:{runner.addresses[0][1]}"
    log.info("rollout server on %s", server_url)
    try:
        await _run_gateway(args, "node-0", server_url, args.host, args.gateway_port)
    finally:
        await runner.cleanup()


def _serve(args: argparse.Namespace) -> int:
    asyncio.run(_serve_all(args))
    return 0


def _serve_rollout(args: argparse.Namespace) -> int:
    from nemo_polar.rollout.server import run

    cfg = ServerConfig(journal_path=args.journal, node_timeout_s=args.node_timeout_s, max_attempts=args.max_attempts)
    run(cfg, host=args.host, port=args.port)
    return 0


def _serve_gateway(args: argparse.Namespace) -> int:
    asyncio.run(_run_gateway(args, args.node_id, args.server, args.host, args.port))
    return 0


def _launch(args: argparse.Namespace) -> int:
    if not args.ray:
        raise SystemExit("polar launch: only `--ray` is supported; `polar serve` runs everything in one process")
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
        spec = ray_launch.LaunchSpec(
            gateways=args.gateways,
            host=args.host,
            port=args.port,
            work_dir=args.work_dir,
            gateway=_gateway_config(args, "node-0", None),
            upstreams=tuple(args.upstream),
            model=args.model,
        )
        launched = ray_launch.launch(spec)
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
