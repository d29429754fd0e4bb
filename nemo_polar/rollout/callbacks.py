# SPDX-License-Identifier: Apache-2.0
"""Result callbacks of the rollout server: each journalled result POSTed to its task's `callback_url`.

Delivery is at-least-once: every result carries an `Idempotency-Key` header (the session id) and is retried with
capped exponential backoff and jitter (`retry.Backoff`) until a 2xx arrives or the attempts run out; each attempt's
outcome is written to the journal (`journal.py`) before the next, so a restarted server resumes the pending ones.
`server.py` owns the journal and the HTTP client session and wakes `callback_loop` when a new result is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aiohttp

from nemo_polar.rollout.journal import Journal
from nemo_polar.rollout.retry import Backoff

__all__ = ["callback_loop", "deliver_callback"]

log = logging.getLogger(__name__)


async def callback_loop(
    journal: Journal,
    http: aiohttp.ClientSession,
    wake: asyncio.Event,
    *,
    tick_s: float,
    timeout_s: float,
    backoff: Backoff,
) -> None:
    """Deliver the due callbacks every `tick_s` (or when `wake` is set), forever; a failed round is logged."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=tick_s)
        wake.clear()
        try:
            due = journal.due_callbacks(time.time())
            if due:
                await asyncio.gather(
                    *(deliver_callback(journal, http, *d, timeout_s=timeout_s, backoff=backoff) for d in due)
                )
        except Exception:
            log.exception("callback round failed")


async def deliver_callback(
    journal: Journal,
    http: aiohttp.ClientSession,
    key: str,
    url: str,
    body: bytes,
    attempts: int,
    *,
    timeout_s: float,
    backoff: Backoff,
) -> None:
    """One delivery attempt; the journal records delivered, failed (attempts exhausted) or pending (next due time)."""
    error: str | None = None
    try:
        async with http.post(
            url,
            data=body,
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if 200 <= resp.status < 300:
                journal.callback_done(key, "delivered", attempts + 1, time.time(), None)
                return
            error = f"HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    n = attempts + 1
    if backoff.exhausted(n):
        log.error("callback %s to %s failed %d times; giving up: %s", key, url, n, error)
        journal.callback_done(key, "failed", n, time.time(), error)
    else:
        journal.callback_done(key, "pending", n, time.time() + backoff.delay(n - 1), error)
