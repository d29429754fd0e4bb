# SPDX-License-Identifier: Apache-2.0
"""Loopback servers for the NeMo RL-env tests, each in its own thread and event loop: the FAKE vLLM-shaped upstream
(`polar_lab.fake_upstream.FakeUpstream`: no model is needed where these tests use it) and a FastAPI app under
uvicorn (a Gym server's app, served the way Gym serves it)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from polar_lab.fake_upstream import FakeUpstream


@contextmanager
def fake_upstream_thread() -> Iterator[str]:
    """The FAKE upstream's base URL while the block runs."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    fake = FakeUpstream()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(fake.start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(fake.stop())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the fake upstream did not start")
    try:
        yield fake.base_url
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


@contextmanager
def uvicorn_thread(app: Any, port: int) -> Iterator[str]:
    """`app` served by uvicorn on 127.0.0.1:`port` (its lifespan included) while the block runs."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
