# SPDX-License-Identifier: Apache-2.0
"""How a gateway talks to its model-API proxy: create a session, then fetch its records and close it.

`ProxyLink` is the small protocol the gateway uses (a session is opened from one `SessionRequest`); `HostedProxy`
runs the real proxy (`nemo_polar.proxy.app.Proxy`) inside the gateway process on its own loopback port (the gateway
"hosts the proxy": docs/architecture.md), using its Python API so the harness adapter's request classifier is
handed over as a callable. `nemo_polar.rollout.stack`
creates them (one per gateway node).

This module does no agent work and no scheduling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from nemo_polar.harness_adapters import cli_idle_limit_s
from nemo_polar.types import CompletionRecord

__all__ = ["HostedProxy", "ProxyLink", "ProxySession", "SessionRequest"]


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """What the gateway asks its proxy for when an agent starts: the session's and task's ids, the harness's
    resolved plan, its sampling overrides, the metadata every record carries and the harness adapter's request
    classifier."""

    session_id: str
    task_id: str
    plan: dict[str, Any] | None
    sampling: dict[str, Any] | None
    metadata: dict[str, Any]
    classifier: Callable[[dict[str, Any]], str] | None


@dataclass(frozen=True, slots=True)
class ProxySession:
    session_id: str
    api_key: str
    base_url: str


class ProxyLink(Protocol):
    base_url: str
    # how long a session's CLI may wait on a silent call (`harness_adapters.cli_idle_limit_s` of the proxy's limits)
    idle_limit_s: int

    async def open_session(self, request: SessionRequest) -> ProxySession: ...

    async def close_session(self, session_id: str) -> None: ...

    async def records(self, session_id: str) -> list[CompletionRecord]: ...


class HostedProxy:
    """The real proxy app, served by this process on 127.0.0.1 (port 0 = any free port)."""

    def __init__(self, config: Any, *, port: int = 0):
        from nemo_polar.proxy.app import Proxy

        self.proxy = Proxy(config)
        self.port = port
        self.base_url = ""
        self.idle_limit_s = cli_idle_limit_s(config.pause_wait_s, config.read_timeout_s)
        self._runner: web.AppRunner | None = None

    async def start(self) -> HostedProxy:
        self._runner = self.proxy.runner()  # with handler cancellation: a hung-up call stops
        await self._runner.setup()
        site = self.proxy.site(self._runner, "127.0.0.1", self.port)  # the proxy's HTTP front (proxy/front.py)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}"
        self.proxy.base_url = self.proxy.base_url or self.base_url
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def open_session(self, request: SessionRequest) -> ProxySession:
        s = await self.proxy.create_session(
            session_id=request.session_id,
            task_id=request.task_id,
            plan=request.plan,
            sampling=request.sampling or None,
            metadata=request.metadata,
            classifier=request.classifier,
        )
        return ProxySession(s.session_id, s.api_key, self.base_url)

    async def close_session(self, session_id: str) -> None:
        await self.proxy.sessions.close(session_id)

    async def records(self, session_id: str, *, settle_s: float = 15.0) -> list[CompletionRecord]:
        """The session's committed records. A call still in flight (a pending row: e.g. a stream the killed harness
        just cut, whose failure record the proxy is writing) is waited for up to `settle_s`, so it is not lost."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settle_s
        while True:
            done = self._all(session_id, include_pending=False)
            if len(done) == len(self._all(session_id, include_pending=True)) or loop.time() >= deadline:
                return done
            await asyncio.sleep(0.05)

    def _all(self, session_id: str, *, include_pending: bool) -> list[CompletionRecord]:
        out: list[CompletionRecord] = []
        after = -1
        while True:
            page = self.proxy.store.list_records(
                session_id, after_seq=after, limit=1000, include_pending=include_pending
            )
            out.extend(page)
            if len(page) < 1000:
                return out
            after = page[-1].seq
