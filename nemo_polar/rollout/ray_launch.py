# SPDX-License-Identifier: Apache-2.0
"""`polar launch --ray`: the rollout server and N gateway nodes as Ray actors (NeMo RL already runs on Ray).

Each actor serves the same aiohttp app as `polar serve-rollout` / `polar serve-gateway`, on the event loop Ray
gives an async actor; the gateways register with the server over HTTP exactly as separate processes do, so a
gateway started by hand on another host still joins by URL. The actors reserve no CPUs in Ray's accounting
(`num_cpus=0`): they serve HTTP and run agents as subprocesses, they are not compute tasks, and a trainer's
placement groups keep the cluster's CPUs. Every address is the `host` given (127.0.0.1 by default).

`ray` is imported lazily (the `nemo-polar[ray]` extra); connecting to a cluster (`ray.init`) is the caller's job.
This module places, waits for and stops actors; it schedules nothing itself.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web

from nemo_polar.rollout.gateway import Gateway, GatewayConfig
from nemo_polar.rollout.proxylink import HostedProxy, start_hosted_proxy
from nemo_polar.rollout.server import RolloutServer, ServerConfig

__all__ = ["GatewayActor", "LaunchSpec", "Launched", "RolloutServerActor", "launch", "stop"]

_START_TIMEOUT_S = 120.0  # an actor's process starts cold (imports) on a loaded machine
_REGISTER_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 60.0


class RolloutServerActor:
    """The rollout server (`RolloutServer`) inside a Ray actor."""

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None

    async def start(self, journal_path: str, host: str, port: int) -> str:
        Path(journal_path).parent.mkdir(parents=True, exist_ok=True)
        self._runner = web.AppRunner(
            RolloutServer(ServerConfig(journal_path=journal_path)).make_app(), access_log=None
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        return f"http://{host}:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class GatewayActor:
    """One gateway node (`Gateway`, with its hosted proxy when given upstreams) inside a Ray actor."""

    def __init__(self) -> None:
        self._gateway: Gateway | None = None
        self._proxy: HostedProxy | None = None

    async def start(self, config: dict[str, Any], host: str, upstreams: list[str], model: str | None) -> str:
        cfg = GatewayConfig(**config)
        self._proxy = await start_hosted_proxy(upstreams, store_dir=cfg.work_dir, model=model)
        self._gateway = Gateway(cfg, proxy=self._proxy)
        return await self._gateway.serve(host, 0)

    async def stop(self) -> None:
        if self._gateway is not None:
            await self._gateway.close()
            self._gateway = None
        if self._proxy is not None:
            await self._proxy.stop()
            self._proxy = None


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What to launch. `gateway` holds the `GatewayConfig` knobs shared by every node (pools, model, builder
    options); each node gets its own `node-<i>` id and `<work_dir>/node-<i>` run directory."""

    gateways: int = 1
    host: str = "127.0.0.1"
    port: int = 8700
    work_dir: str = "polar-run"
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    upstreams: tuple[str, ...] = ()
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Launched:
    server_url: str
    gateway_urls: list[str]
    server: Any  # the actor handles
    gateways: list[Any]


def _nodes(server_url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{server_url}/nodes", timeout=10) as resp:
        nodes: list[dict[str, Any]] = json.loads(resp.read())
        return nodes


def _wait_registered(server_url: str, node_ids: set[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if node_ids <= {n["node_id"] for n in _nodes(server_url)}:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"gateways {sorted(node_ids)} did not register with {server_url} in {timeout_s:.0f}s")
        time.sleep(0.2)


def launch(spec: LaunchSpec) -> Launched:
    """Start the server actor, then `spec.gateways` gateway actors registering with it; returns once all have
    registered. On any failure the actors started so far are killed before the error propagates."""
    import ray

    if spec.gateways < 1:
        raise ValueError("gateways must be >= 1")
    work = Path(spec.work_dir).absolute()  # actors do not share the driver's working directory
    server: Any = ray.remote(num_cpus=0)(RolloutServerActor).remote()
    gateways: list[Any] = []
    try:
        server_url: str = ray.get(
            server.start.remote(str(work / "rollout.sqlite"), spec.host, spec.port), timeout=_START_TIMEOUT_S
        )
        node_ids = [f"node-{i}" for i in range(spec.gateways)]
        configs = [
            asdict(replace(spec.gateway, node_id=n, work_dir=str(work / n), server_url=server_url, public_url=None))
            for n in node_ids
        ]
        gateways = [ray.remote(num_cpus=0)(GatewayActor).remote() for _ in node_ids]
        refs = [
            g.start.remote(c, spec.host, list(spec.upstreams), spec.model)
            for g, c in zip(gateways, configs, strict=True)
        ]
        urls = ray.get(refs, timeout=_START_TIMEOUT_S)
        _wait_registered(server_url, set(node_ids), _REGISTER_TIMEOUT_S)
    except BaseException:
        for actor in [*gateways, server]:
            ray.kill(actor)
        raise
    return Launched(server_url, list(urls), server, gateways)


def stop(launched: Launched) -> None:
    """Gateways first (they cancel what they still run), then the server; then the actors are released."""
    import ray

    try:
        ray.get([g.stop.remote() for g in launched.gateways], timeout=_STOP_TIMEOUT_S)
        ray.get(launched.server.stop.remote(), timeout=_STOP_TIMEOUT_S)
    finally:
        for actor in [*launched.gateways, launched.server]:
            ray.kill(actor)
