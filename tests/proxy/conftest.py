# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the proxy tests: the proxy (and FAKE upstreams where a real one cannot serve) on a background loop.

Tests drive the proxy through real HTTP with the official, synchronous SDK clients, so the server runs on its own
event loop in a thread. `make_proxy(upstreams=[...], **config)` starts one; `fake_upstream()` starts a loopback
FAKE vLLM/SGLang server (named as a fake: it is used for failure injection, routing and the SGLang engine, never to
claim what a model produced).
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from aiohttp import web

from nemo_polar.proxy.app import Proxy, ProxyConfig
from nemo_polar.proxy.sessions import Session
from polar_lab.fake_upstream import FakeUpstream

T = TypeVar("T")


class LoopThread:
    """An asyncio loop in a daemon thread; `run(coro)` executes on it and returns the result."""

    def __init__(self, timeout: float = 120) -> None:
        self.timeout = timeout  # the default wait of `run`
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout or self.timeout)

    def stop(self) -> None:
        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_rest(), timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class ProxyHandle:
    """A running proxy: `base_url`, the `Proxy` object, and helpers for the admin API."""

    def __init__(self, lt: LoopThread, proxy: Proxy, runner: web.AppRunner):
        self.lt = lt
        self.proxy = proxy
        self.runner = runner
        self.port = runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        proxy.base_url = self.base_url

    def session(self, **kw: Any) -> Session:
        return self.lt.run(self.proxy.create_session(**kw))

    def records(self, session_id: str) -> list[Any]:
        return self.proxy.store.list_records(session_id, limit=10_000)

    def admin(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> tuple[int, Any]:
        return http_json(
            method,
            self.base_url + path,
            body,
            headers={"Authorization": f"Bearer {token or self.proxy.control_token}"},
        )


def http_json(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None
) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            text = resp.read()
            return resp.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return exc.code, json.loads(text)
        except ValueError:
            return exc.code, text.decode(errors="replace")


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.stop()


@pytest.fixture
def fake_upstream(loop_thread: LoopThread) -> Iterator[Any]:
    """Factory: `fake_upstream(flavor="vllm")` → a started FAKE upstream on loopback."""
    started: list[FakeUpstream] = []

    def make(flavor: str = "vllm", **behaviour: Any) -> FakeUpstream:
        fake = FakeUpstream(flavor=flavor)
        for k, v in behaviour.items():
            setattr(fake.behaviour, k, v)
        loop_thread.run(fake.start())
        started.append(fake)
        return fake

    yield make
    for f in started:
        loop_thread.run(f.stop())


@pytest.fixture
def make_proxy(loop_thread: LoopThread, tmp_path: Any) -> Iterator[Any]:
    """Factory: `make_proxy(upstreams=[url, ...], **ProxyConfig fields)` → a running `ProxyHandle`."""
    handles: list[ProxyHandle] = []

    def make(upstreams: list[str], **cfg: Any) -> ProxyHandle:
        cfg.setdefault("store_dir", str(tmp_path / f"store{len(handles)}"))
        cfg.setdefault("control_token", "test-control-token")
        proxy = Proxy(ProxyConfig(upstreams=upstreams, **cfg))

        async def start() -> web.AppRunner:
            runner = proxy.runner()
            await runner.setup()
            await proxy.site(runner, "127.0.0.1", 0).start()
            return runner

        h = ProxyHandle(loop_thread, proxy, loop_thread.run(start()))
        handles.append(h)
        return h

    yield make
    for h in handles:
        loop_thread.run(h.runner.cleanup())
