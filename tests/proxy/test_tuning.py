# SPDX-License-Identifier: Apache-2.0
"""`tune_serving_process`: batches of large buffers, built and freed together as a proxy at concurrency does, stop
page-faulting once the allocator keeps what was freed, and the cyclic GC is settled (each case in its own
interpreter: the settings are process-wide and the allocator's cannot be undone)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")

BATCHES = r"""
import gc, json, resource, sys
from nemo_polar.proxy.tuning import GC_THRESHOLDS, tune_serving_process
tuned = tune_serving_process() if sys.argv[1] == "tuned" else None
gc_settled = gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 1000
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def batch(k):
    bufs = [bytes([65 + i % 26]) * 400_000 for i in range(k)]  # 64 x 400 KB: a batch of 30k-token records
    return sum(len(b) for b in bufs)
for _ in range(3):  # warm: the heap reaches its working size
    batch(64)
f0 = faults()
for _ in range(5):
    batch(64)
print(json.dumps({"tuned": tuned, "gc": gc_settled, "faults_per_buffer": (faults() - f0) / (5 * 64)}))
"""


def _run(mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", BATCHES, mode], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def test_a_tuned_process_reuses_freed_buffers_without_page_faults_and_settles_its_gc() -> None:
    plain, tuned = _run("plain"), _run("tuned")
    print(
        f"minor faults per 400 KB buffer: {plain['faults_per_buffer']:.1f} as glibc starts, "
        f"{tuned['faults_per_buffer']:.1f} with tune_serving_process()"
    )
    assert tuned["tuned"] is True and tuned["gc"] is True and plain["gc"] is False
    assert tuned["faults_per_buffer"] < 2  # a buffer is 98 pages: fresh pages would fault ~100 times


def test_the_serving_entry_points_tune_their_process_after_the_stack_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """`polar serve` (and its gateway and rollout variants) and a Ray gateway actor call `tune_serving_process` once
    their stack is up (the stack and the setting are stubbed: the setting is process-wide)."""
    import asyncio

    from nemo_polar.rollout import cli, ray_launch

    events: list[str] = []

    class FakeStack:
        def __init__(self) -> None:
            self.gateway_urls = ["http://127.0.0.1:1"]

        async def close(self) -> None:
            events.append("closed")

    async def start_stack(cfg: object) -> FakeStack:
        events.append("started")
        return FakeStack()

    async def until_signalled() -> None:
        events.append("serving")

    for mod in (cli, ray_launch):
        monkeypatch.setattr(mod, "start_stack", start_stack)
        monkeypatch.setattr(mod, "tune_serving_process", lambda: events.append("tuned") or True)
    monkeypatch.setattr(cli, "_until_signalled", until_signalled)

    asyncio.run(cli._run(object()))
    assert events == ["started", "tuned", "serving", "closed"]
    events.clear()
    monkeypatch.setattr(ray_launch, "StackConfig", lambda **kw: kw)
    assert asyncio.run(ray_launch.GatewayActor().start({})) == "http://127.0.0.1:1"
    assert events == ["started", "tuned"]
