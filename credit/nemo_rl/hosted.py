# SPDX-License-Identifier: Apache-2.0
"""Find the Polar stacks that NeMo Gym hosts in a NeMo RL run, so the refit hooks can pause and stamp them.

In a NeMo RL Gym launch the Polar proxy lives inside the `polar_swe` resources server, which NeMo RL's `NemoGym`
actor starts on ports nobody chose in advance (and the proxy itself binds loopback inside that process). Gym knows
where every server runs: its head server answers `GET /global_config_dict_yaml`, the resolved config with each
server's `host` and `port`. So:

1. `capture_gym_actors(module)` wraps `spinup_nemo_gym_actor` in NeMo RL's GRPO module (the name its `setup()`
   calls) and keeps the `NemoGym` actor handle it returns;
2. `head_server_url(actor)` asks that actor where its head server listens (`node_ip`, `head_server_port`);
3. `polar_swe_admin_urls(head_url)` reads the head server's config and returns `http://HOST:PORT/polar` for every
   server whose implementation is `resources_servers/polar_swe`: the `polar_swe` admin routes mirror the proxy's
   (`/admin/pause`, `/admin/policy_version`, `/admin/resume`), so `gateways.GatewayAdmin` drives them unchanged.

`HostedStacks` is the callable `GatewayAdmin` asks at each refit; it remembers what it found. Does not: pause
anything itself, or import `nemo_rl` / `ray` at module level.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable
from types import ModuleType
from typing import Any

import yaml

from nemo_polar.errors import PolarError

from .wrapping import wrap_if_present

log = logging.getLogger(__name__)

SPINUP_NAME = "spinup_nemo_gym_actor"
POLAR_SWE_IMPL = "polar_swe"  # the directory under resources_servers/ (an instance may have any name)
_WRAPPED_FLAG = "__polar_gym_actor_capture__"


class HostedDiscoveryError(PolarError, RuntimeError):
    """Gym's head server did not answer with its config."""


def head_server_url(actor: Any, *, timeout_s: float = 60.0) -> str:
    """`http://NODE_IP:PORT` of the head server a spun-up NeMo RL `NemoGym` actor started."""
    import ray

    node_ip, port = ray.get(
        actor.__ray_call__.remote(lambda self: (self.node_ip, self.head_server_port)), timeout=timeout_s
    )
    if not node_ip or not port:
        raise HostedDiscoveryError("the NemoGym actor has not started its head server (no node_ip / port)")
    return f"http://{node_ip}:{port}"


def polar_swe_servers(global_config: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(instance name, host, port) of every `resources_servers/polar_swe` server in a Gym global config."""
    out = []
    for name, entry in global_config.items():
        servers = entry.get("resources_servers") if isinstance(entry, dict) else None
        cfg = servers.get(POLAR_SWE_IMPL) if isinstance(servers, dict) else None
        if isinstance(cfg, dict) and cfg.get("port"):
            out.append((str(name), str(cfg.get("host") or "127.0.0.1"), int(cfg["port"])))
    return out


def polar_swe_admin_urls(head_url: str, *, timeout_s: float = 30.0) -> list[str]:
    """`http://HOST:PORT/polar` of every `polar_swe` server the head server at `head_url` knows."""
    head_url = head_url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{head_url}/global_config_dict_yaml", timeout=timeout_s) as resp:
            text = resp.read().decode()
    except OSError as exc:
        raise HostedDiscoveryError(f"{head_url}/global_config_dict_yaml: {exc}") from exc
    loaded = yaml.safe_load(text)
    if isinstance(loaded, str):  # FastAPI answers the YAML string as a JSON string, which is valid YAML too
        loaded = yaml.safe_load(loaded)
    if not isinstance(loaded, dict):
        raise HostedDiscoveryError(f"{head_url}/global_config_dict_yaml is not a mapping")
    head_host = head_url.split("://", 1)[-1].rsplit(":", 1)[0]
    return [
        f"http://{head_host if host in ('0.0.0.0', '') else host}:{port}/polar"
        for _, host, port in polar_swe_servers(loaded)
    ]


class HostedStacks:
    """The admin URLs of the `polar_swe` servers of the Gym actors captured so far (remembered once found)."""

    def __init__(self, *, timeout_s: float = 30.0) -> None:
        self.actors: list[Any] = []
        self.head_urls: list[str] = []
        self.timeout_s = timeout_s
        self._found: list[str] = []

    def add_actor(self, actor: Any) -> None:
        self.actors.append(actor)
        self._found = []  # a new Gym actor: look again

    def add_head_server(self, url: str) -> None:
        self.head_urls.append(url.rstrip("/"))
        self._found = []

    def __call__(self) -> list[str]:
        if self._found:
            return list(self._found)
        heads = list(self.head_urls)
        for actor in self.actors:
            heads.append(head_server_url(actor, timeout_s=self.timeout_s))
        found: list[str] = []
        for head in heads:
            found.extend(u for u in polar_swe_admin_urls(head, timeout_s=self.timeout_s) if u not in found)
        if heads and not found:
            log.warning("no polar_swe server behind Gym's head server(s) %s: nothing to pause at refit", heads)
        self._found = found
        return list(found)


def capture_gym_actors(module: ModuleType, stacks: HostedStacks) -> Callable[..., Any] | None:
    """Wrap `<module>.spinup_nemo_gym_actor` so every actor it spins up is handed to `stacks` (idempotent: a
    second call replaces the wrapper, it never stacks a second one; None when the module has no such function)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def spinup_nemo_gym_actor(*args: Any, **kwargs: Any) -> Any:
            actor = original(*args, **kwargs)
            stacks.add_actor(actor)
            return actor

        return spinup_nemo_gym_actor

    # rewrap: a second capture (another launch in this process) hands the actors to its own `stacks`
    return wrap_if_present(module, SPINUP_NAME, make, _WRAPPED_FLAG, rewrap=True)
