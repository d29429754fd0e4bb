# SPDX-License-Identifier: Apache-2.0
"""The one retry helper: bounded attempts, capped exponential backoff with jitter.

`Backoff.delay(n)` is the wait before retry n (0-based); `retry(fn, backoff=..., retry_on=...)` calls an async
function until it succeeds, the attempts run out (the last error is re-raised) or it raises something not in
`retry_on`. Journalled retry schedules (callbacks) use `Backoff.delay` directly. No I/O of its own.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "retry"]

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    attempts: int | None = 5  # total attempts; None = until cancelled
    base_s: float = 0.2
    cap_s: float = 10.0
    jitter: float = 0.5  # fraction of each delay that is randomised

    def delay(self, n: int) -> float:
        d = min(self.cap_s, self.base_s * (2.0 ** min(n, 30)))
        return d * (1.0 - self.jitter) + random.random() * d * self.jitter

    def exhausted(self, attempts_made: int) -> bool:
        return self.attempts is not None and attempts_made >= self.attempts


async def retry(
    fn: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    what: str = "operation",
) -> T:
    n = 0
    while True:
        try:
            return await fn()
        except retry_on as exc:
            n += 1
            if backoff.exhausted(n):
                raise
            wait = backoff.delay(n - 1)
            log.debug("%s failed (%s: %s); retry %d in %.2fs", what, type(exc).__name__, exc, n, wait)
            await asyncio.sleep(wait)
