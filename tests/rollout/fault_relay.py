# SPDX-License-Identifier: Apache-2.0
"""A FAULT-INJECTING relay (test helper): sits between the proxy and its upstream (vLLM, or the proxy's fake) and,
on a fixed schedule over call numbers, answers 500, hangs past the proxy's read timeout, or drops the connection
without answering; every other call is forwarded unchanged. Each decision is one JSON line in `log`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import orjson
from aiohttp import web


class FaultRelay:
    def __init__(self, upstream: str, *, hang_s: float = 30.0):
        self.upstream = upstream.rstrip("/")
        self.hang_s = hang_s
        self.calls = 0
        self.log: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self.base_url = ""

    @staticmethod
    def fault_for(n: int) -> str:
        if n % 10 == 3:
            return "error"
        if n % 10 == 6:
            return "drop"
        if n % 20 == 9:
            return "timeout"
        return "pass"

    def counts(self) -> Counter[str]:
        return Counter(e["fault"] for e in self.log)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method != "POST":  # model listing, health: never faulted
            return await self._forward(request, body)
        n = self.calls
        self.calls += 1
        fault = self.fault_for(n)
        self.log.append({"n": n, "path": request.path, "fault": fault})
        if fault == "error":
            return web.json_response({"error": {"message": "injected fault", "type": "server_error"}}, status=500)
        if fault == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)  # never reaches the client: the connection is gone
        if fault == "timeout":
            await asyncio.sleep(self.hang_s)
        return await self._forward(request, body)

    async def _forward(self, request: web.Request, body: bytes) -> web.Response:
        assert self._http is not None
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with self._http.request(
            request.method,
            self.upstream + request.path_qs,
            data=body or None,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=600),
        ) as up:
            data = await up.read()
            return web.Response(body=data, status=up.status, content_type=up.content_type)

    async def start(self) -> FaultRelay:
        self._http = aiohttp.ClientSession()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    def log_jsonl(self) -> bytes:
        return b"".join(orjson.dumps(e) + b"\n" for e in self.log)
