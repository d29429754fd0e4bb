# SPDX-License-Identifier: Apache-2.0
"""`PolarClient`: the trainer's async client for the rollout server.

    async with PolarClient("http://127.0.0.1:8700") as polar:
        await polar.submit(task)                      # idempotent by task_id
        async for result in polar.results(task.task_id):
            ...                                       # SessionResults, as they finish

`results()` long-polls `GET /tasks/{id}/results?after=N`: each result crosses the wire once (no full
re-download per poll), and a dropped connection resumes from the last index seen. Every request has a timeout and
carries the rollout service's shared secret (`secret=`, default `POLAR_ROLLOUT_SECRET(_FILE)`; see `auth.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from nemo_polar.errors import PolarError
from nemo_polar.rollout.auth import auth_headers, resolve_secret
from nemo_polar.rollout.retry import Backoff, retry
from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.types import SessionResult

__all__ = ["PolarClient", "PolarClientError"]


class PolarClientError(PolarError, RuntimeError):
    def __init__(self, status: int, body: str):
        super().__init__(f"rollout server answered {status}: {body[:1000]}")
        self.status = status
        self.body = body


class PolarClient:
    def __init__(
        self, base_url: str, *, timeout_s: float = 30.0, poll_wait_s: float = 20.0, secret: str | None = None
    ):
        self.base_url = base_url.rstrip("/")
        self._headers = auth_headers(secret if secret is not None else resolve_secret())
        self.timeout_s = timeout_s
        self.poll_wait_s = poll_wait_s
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> PolarClient:
        self._http = aiohttp.ClientSession()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _request(self, method: str, path: str, *, body: bytes | None = None, extra_s: float = 0.0) -> Any:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        async with self._http.request(
            method,
            self.base_url + path,
            data=body,
            headers={**self._headers, "Content-Type": "application/json"} if body is not None else self._headers,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s + extra_s),
        ) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                raise PolarClientError(resp.status, raw.decode(errors="replace"))
            return orjson.loads(raw)

    async def submit(self, task: TaskSpec | dict[str, Any]) -> dict[str, Any]:
        spec = task if isinstance(task, TaskSpec) else TaskSpec.model_validate(task)
        out: dict[str, Any] = await self._request("POST", "/tasks", body=spec.to_json())
        return out

    async def status(self, task_id: str) -> dict[str, Any]:
        out: dict[str, Any] = await self._request("GET", f"/tasks/{task_id}")
        return out

    async def cancel(self, task_id: str) -> dict[str, Any]:
        out: dict[str, Any] = await self._request("DELETE", f"/tasks/{task_id}")
        return out

    async def results(self, task_id: str, *, after: int = 0) -> AsyncIterator[SessionResult]:
        """Yield each result of the task once, as it finishes, until the task is done or cancelled."""
        backoff = Backoff(attempts=None, base_s=0.5, cap_s=5.0)
        while True:

            async def page(after: int = after) -> Any:
                return await self._request(
                    "GET",
                    f"/tasks/{task_id}/results?after={after}&wait_s={self.poll_wait_s}",
                    extra_s=self.poll_wait_s,
                )

            # a restarting server is waited for; a 4xx is the caller's problem
            data = await retry(
                page, backoff=backoff, retry_on=(aiohttp.ClientError, asyncio.TimeoutError), what="results poll"
            )
            for item in data["results"]:
                after = int(item["index"])
                yield SessionResult.from_dict(item["result"])
            if data["done"] and not data["results"]:
                return

    async def collect(self, task_id: str) -> list[SessionResult]:
        return [r async for r in self.results(task_id)]
