# SPDX-License-Identifier: Apache-2.0
"""The one retry helper: capped exponential backoff with jitter, bounded attempts, only the named errors retried."""

from __future__ import annotations

import asyncio

import pytest

from nemo_polar.rollout.retry import Backoff, retry


def test_backoff_grows_caps_and_jitters() -> None:
    b = Backoff(attempts=5, base_s=0.1, cap_s=1.0, jitter=0.5)
    for n, full in enumerate([0.1, 0.2, 0.4, 0.8, 1.0, 1.0]):
        draws = [b.delay(n) for _ in range(200)]
        assert all(full * 0.5 <= d <= full for d in draws)
        assert len(set(draws)) > 1  # jittered
    assert not b.exhausted(4) and b.exhausted(5)
    assert not Backoff(attempts=None).exhausted(10**6)


def test_retry_until_success_and_gives_up() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return "ok"

    fast = Backoff(attempts=3, base_s=0.001, cap_s=0.002)
    assert asyncio.run(retry(flaky, backoff=fast, retry_on=(ConnectionError,))) == "ok"
    assert len(calls) == 3

    calls.clear()
    with pytest.raises(ConnectionError):
        asyncio.run(retry(flaky, backoff=Backoff(attempts=2, base_s=0.001), retry_on=(ConnectionError,)))
    assert len(calls) == 2

    async def wrong() -> None:
        calls.append(1)
        raise ValueError("not retried")

    calls.clear()
    with pytest.raises(ValueError):
        asyncio.run(retry(wrong, backoff=fast, retry_on=(ConnectionError,)))
    assert len(calls) == 1
