# SPDX-License-Identifier: Apache-2.0
"""`keep_freed_memory`: batches of large buffers, built and freed together as a proxy at concurrency does, stop
page-faulting once the allocator keeps what was freed (each case in its own interpreter: the setting is
process-wide and cannot be undone)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")

BATCHES = r"""
import json, resource, sys
from nemo_polar.proxy.malloc import keep_freed_memory
tuned = keep_freed_memory() if sys.argv[1] == "tuned" else None
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
print(json.dumps({"tuned": tuned, "faults_per_buffer": (faults() - f0) / (5 * 64)}))
"""


def _run(mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", BATCHES, mode], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def test_freed_buffers_are_reused_without_page_faults() -> None:
    plain, tuned = _run("plain"), _run("tuned")
    print(
        f"minor faults per 400 KB buffer: {plain['faults_per_buffer']:.1f} as glibc starts, "
        f"{tuned['faults_per_buffer']:.1f} with keep_freed_memory()"
    )
    assert tuned["tuned"] is True
    assert tuned["faults_per_buffer"] < 2  # a buffer is 98 pages: fresh pages would fault ~100 times
