# SPDX-License-Identifier: Apache-2.0
"""A loopback counting relay for the end-to-end tests: an HTTP reverse proxy in front of the model proxy that
forwards every request unchanged (streaming the reply back as it comes) and records method, path and status.

It is a measuring instrument, not a fake: the requests go to the real proxy. Counting here, outside the proxy,
is what lets a test check that the proxy recorded every model call the CLI made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


@dataclass
class CountingRelay:
    target: str  # http://127.0.0.1:PORT of the proxy
    seen: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _http: aiohttp.ClientSession | None = None

    async def start(self) -> CountingRelay:
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600), auto_decompress=False
        )
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    def model_calls(self) -> list[dict[str, Any]]:
        """POSTs to a model route (everything but HEAD /, GET …/models and the count-tokens routes)."""
        return [
            r
            for r in self.seen
            if r["method"] == "POST" and "count_tokens" not in r["path"] and ":countTokens" not in r["path"]
        ]

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        body = await request.read()
        entry: dict[str, Any] = {"method": request.method, "path": request.path, "status": None}
        self.seen.append(entry)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._http.request(
            request.method, self.target + request.path_qs, headers=headers, data=body or None
        ) as up:
            entry["status"] = up.status
            out = web.StreamResponse(
                status=up.status, headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP}
            )
            if "content-encoding" in up.headers:
                out.headers["Content-Encoding"] = up.headers["content-encoding"]
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
