# SPDX-License-Identifier: Apache-2.0
"""The Polar stack the `polar_swe` process hosts (DESIGN §7): the model-API proxy (capture of token ids and
logprobs from vLLM), one gateway node (staged pools, runtimes, builders, evaluators) and the rollout server it
registers with — all in this process's event loop, each on its own 127.0.0.1 port.

The upstream (vLLM's OpenAI endpoint) comes from the server config (`upstream_urls`) or, when that is empty, from
the first `seed_session` (the agent resolves it from Gym's model server config). A later seed naming another
upstream is refused: one process, one policy. This module knows nothing of Gym's request models.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from nemo_polar.rollout.gateway import Gateway, GatewayConfig
from nemo_polar.rollout.proxylink import HostedProxy
from nemo_polar.rollout.server import RolloutServer, ServerConfig
from nemo_polar.types import CompletionRecord

__all__ = ["PolarStack", "StackConfig", "UpstreamMismatch"]

log = logging.getLogger(__name__)


class UpstreamMismatch(ValueError):
    """A seed asked for an upstream other than the one this process already proxies."""


@dataclass
class StackConfig:
    work_dir: str
    upstream_urls: list[str] = field(default_factory=list)
    served_model: str | None = None
    prefix_preserving: str | None = None
    model_dir: str | None = None
    eot_token_ids: list[int] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    init_workers: int = 2
    ready_buffer: int = 2
    run_slots: int = 2
    postrun_workers: int = 2


def _norm(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class PolarStack:
    def __init__(self, config: StackConfig):
        self.config = config
        self.proxy: HostedProxy | None = None
        self.gateway: Gateway | None = None
        self.rollout_url = ""
        self.gateway_url = ""
        self._server_runner: web.AppRunner | None = None
        self._lock = asyncio.Lock()

    @property
    def started(self) -> bool:
        return self.proxy is not None

    @property
    def proxy_url(self) -> str:
        return self.proxy.base_url if self.proxy is not None else ""

    @property
    def upstreams(self) -> list[str]:
        return [_norm(u) for u in self.config.upstream_urls]

    async def ensure(self, upstream_url: str | None = None, model: str | None = None) -> None:
        """Start the stack once (with `upstream_url` when the config names none); refuse a different upstream."""
        async with self._lock:
            if self.started:
                if upstream_url and self.config.upstream_urls and _norm(upstream_url) not in self.upstreams:
                    raise UpstreamMismatch(
                        f"this polar_swe process proxies {self.upstreams}; a seed asked for {_norm(upstream_url)}"
                    )
                return
            if not self.config.upstream_urls:
                if not upstream_url:
                    raise UpstreamMismatch("no upstream: set upstream_urls in the config or pass upstream_url")
                self.config.upstream_urls = [upstream_url]
            if model and not self.config.served_model:
                self.config.served_model = model
            await self._start()

    async def _start(self) -> None:
        from nemo_polar.proxy.app import ProxyConfig

        c = self.config
        work = Path(c.work_dir)
        await asyncio.to_thread(work.mkdir, parents=True, exist_ok=True)
        extra: dict[str, Any] = {}
        if c.prefix_preserving:
            extra["prefix_preserving"] = c.prefix_preserving
        if c.model_dir:
            extra["model_dir"] = c.model_dir
        if c.eot_token_ids:
            extra["eot_token_ids"] = list(c.eot_token_ids)
        self.proxy = await HostedProxy(
            ProxyConfig(
                upstreams=self.upstreams,
                store_dir=str(work),  # records.sqlite in the run directory (DESIGN §3)
                served_model=c.served_model,
                sampling=dict(c.sampling),
                **extra,
            )
        ).start()
        # The gateway lives in this process: a heartbeat late because the loop was busy (a tokenizer load, a
        # burst of commits on a loaded machine) is not a lost node, so the loss timeout is generous here.
        server = RolloutServer(
            ServerConfig(journal_path=str(work / "rollout.sqlite"), node_timeout_s=300.0, dispatch_grace_s=60.0)
        )
        self._server_runner = web.AppRunner(server.make_app(), access_log=None)
        await self._server_runner.setup()
        await web.TCPSite(self._server_runner, "127.0.0.1", 0).start()
        self.rollout_url = f"http://127.0.0.1:{self._server_runner.addresses[0][1]}"
        builder_options: dict[str, Any] = {}
        if c.eot_token_ids:
            builder_options["eot_token_ids"] = list(c.eot_token_ids)
        self.gateway = Gateway(
            GatewayConfig(
                node_id="polar_swe-0",
                work_dir=str(work),
                init_workers=c.init_workers,
                ready_buffer=c.ready_buffer,
                run_slots=c.run_slots,
                postrun_workers=c.postrun_workers,
                server_url=self.rollout_url,
                heartbeat_s=0.5,
                model=c.served_model or "polar",
                builder_options=builder_options,
            ),
            proxy=self.proxy,
        )
        self.gateway_url = await self.gateway.serve("127.0.0.1", 0)
        log.info("polar stack: proxy %s, rollout %s, gateway %s", self.proxy_url, self.rollout_url, self.gateway_url)

    async def stop(self) -> None:
        """Gateway (cancels sessions, tears runtimes down) → rollout server → proxy."""
        if self.gateway is not None:
            await self.gateway.close()
            self.gateway = None
        if self._server_runner is not None:
            await self._server_runner.cleanup()
            self._server_runner = None
        if self.proxy is not None:
            await self.proxy.stop()
            self.proxy = None

    async def records(self, session_id: str) -> list[CompletionRecord]:
        if self.proxy is None:
            return []
        return await self.proxy.records(session_id)

    def diff(self, session_id: str) -> str | None:
        path = Path(self.config.work_dir) / "sessions" / session_id / "diff.patch"
        return path.read_text() if path.is_file() else None

    def status(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "proxy_url": self.proxy_url,
            "rollout_url": self.rollout_url,
            "gateway_url": self.gateway_url,
            "upstreams": self.upstreams,
            "served_model": self.config.served_model,
            "work_dir": self.config.work_dir,
        }
