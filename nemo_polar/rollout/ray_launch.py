# SPDX-License-Identifier: Apache-2.0
"""`polar launch --ray`: the rollout server and N gateway nodes as Ray actors (NeMo RL already runs on Ray).

Each actor serves the same aiohttp app as `polar serve-rollout` / `polar serve-gateway`, on the event loop Ray
gives an async actor; the gateways register with the server over HTTP exactly as separate processes do, so a
gateway started by hand on another host still joins by URL. The actors reserve no CPUs in Ray's accounting
(`num_cpus=0`): they serve HTTP and run agents as subprocesses, they are not compute tasks, and a trainer's
placement groups keep the cluster's CPUs. Every address is the `host` given (127.0.0.1 by default).

Each actor runs its part through `nemo_polar.rollout.stack.start_stack` (one `StackConfig` split into a server-only
stack and one single-gateway stack per node), so every stack option, prefix-preserving generation included, reaches
the actors. `ray` is imported lazily (the `nemo-polar[ray]` extra); connecting to a cluster (`ray.init`) is the
caller's job. This module places, waits for and stops actors; it schedules nothing itself.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_polar.proxy.tuning import tune_serving_process
from nemo_polar.rollout.auth import auth_headers
from nemo_polar.rollout.stack import Stack, StackConfig, start_stack

__all__ = ["GatewayActor", "Launched", "RolloutServerActor", "launch", "stop"]

_START_TIMEOUT_S = 120.0  # an actor's process starts cold (imports) on a loaded machine
_REGISTER_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 60.0


class _StackActor:
    """One part of the stack (`rollout.stack.start_stack`) inside a Ray actor."""

    def __init__(self) -> None:
        self._stack: Stack | None = None

    async def stop(self) -> None:
        if self._stack is not None:
            await self._stack.close()
            self._stack = None


class RolloutServerActor(_StackActor):
    """The rollout server alone (a stack with no gateway)."""

    async def start(self, config: dict[str, Any]) -> str:
        self._stack = await start_stack(StackConfig(**config))
        assert self._stack.server_url is not None
        return self._stack.server_url


class GatewayActor(_StackActor):
    """One gateway node, with its hosted proxy when the config names upstreams, registering with the server."""

    async def start(self, config: dict[str, Any]) -> str:
        self._stack = await start_stack(StackConfig(**config))
        tune_serving_process()  # the actor's process serves its proxy's model calls (proxy/tuning.py)
        return self._stack.gateway_urls[0]


@dataclass(frozen=True, slots=True)
class Launched:
    server_url: str
    gateway_urls: list[str]
    server: Any  # the actor handles
    gateways: list[Any]


def _nodes(server_url: str, secret: str | None = None) -> list[dict[str, Any]]:
    req = urllib.request.Request(f"{server_url}/nodes", headers=auth_headers(secret))
    with urllib.request.urlopen(req, timeout=10) as resp:
        nodes: list[dict[str, Any]] = json.loads(resp.read())
        return nodes


def _wait_registered(server_url: str, node_ids: set[str], timeout_s: float, secret: str | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if node_ids <= {n["node_id"] for n in _nodes(server_url, secret)}:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"gateways {sorted(node_ids)} did not register with {server_url} in {timeout_s:.0f}s")
        time.sleep(0.2)


def split(config: StackConfig) -> tuple[StackConfig, list[StackConfig]]:
    """`config` as one server-only stack and one single-gateway stack per node (`<work_dir>/<node_id>`, joining the
    server by URL: `server_url` is filled in by `launch`). Paths are made absolute: actors do not share the driver's
    working directory."""
    work = Path(config.work_dir).absolute()
    base = config.model_dump()
    base["work_dir"] = str(work)
    server = StackConfig(**{**base, "upstreams": [], "gateways": 0, "node_ids": []})
    nodes = [
        StackConfig(
            **{
                **base,
                "work_dir": str(work / node_id),
                "serve_rollout": False,
                "gateways": 1,
                "node_ids": [node_id],
                "gateway_port": 0,
                "journal_path": None,
            }
        )
        for node_id in config.node_ids
    ]
    return server, nodes


def launch(config: StackConfig) -> Launched:
    """Start the server actor, then `config.gateways` gateway actors registering with it; returns once all have
    registered. On any failure the actors started so far are killed before the error propagates."""
    import ray

    if config.gateways < 1:
        raise ValueError("gateways must be >= 1")
    server_cfg, node_cfgs = split(config)
    server: Any = ray.remote(num_cpus=0)(RolloutServerActor).remote()
    gateways: list[Any] = []
    try:
        server_url: str = ray.get(server.start.remote(server_cfg.model_dump()), timeout=_START_TIMEOUT_S)
        gateways = [ray.remote(num_cpus=0)(GatewayActor).remote() for _ in node_cfgs]
        refs = [
            g.start.remote({**c.model_dump(), "server_url": server_url})
            for g, c in zip(gateways, node_cfgs, strict=True)
        ]
        urls = ray.get(refs, timeout=_START_TIMEOUT_S)
        _wait_registered(server_url, set(config.node_ids), _REGISTER_TIMEOUT_S, config.secret)
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
