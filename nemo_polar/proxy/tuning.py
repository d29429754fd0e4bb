# SPDX-License-Identifier: Apache-2.0
"""Process settings for a process that serves model calls: its event loop, the cyclic GC settled, and freed memory
kept.

`tune_serving_process()` applies both. `polar proxy` calls it, and so does every process this package runs as a
rollout service whose gateways host proxies: `polar serve` and its gateway and rollout variants, `polar collect`
(and `polar demo`), the gateway actors of `polar launch --ray`, and the NeMo Gym `polar_swe` resources server as it
starts (its lifespan). An application that embeds the proxy or a stack in a process of its own keeps its settings
unless it calls it.

**The cyclic GC.** What exists once the server is up (modules, the app, the store) lives for the whole run, so it is
frozen out of every later collection (`gc.freeze`), and generation 0 runs every 10,000 container allocations instead
of 700. A long stream's parse allocates thousands of short-lived containers, which made collections ≈ 10 % of the
standalone proxy's CPU at c=64 on the long-stream mix (docs/performance.md).

**Freed memory kept** (glibc's allocator), so large buffers stop page-faulting.

A proxy at concurrency builds many large buffers at once and frees them together: request bodies, upstream answers
and the record's JSON (≈ 400 KB for a 30k-token prompt). glibc gives an allocation over its mmap threshold (128 KiB,
raised on the fly up to the largest chunk freed) its own pages, and returns the top of the heap to the OS once more
than its trim threshold is free there; the next batch then touches fresh pages, a minor fault each 4 KiB. Committing
30k-token records 16 or 64 at a time cost ≈ 100 faults and ≈ 1.5x the CPU of committing them one at a time
(docs/performance.md, "Freed memory kept"). With larger thresholds the freed chunks stay in the heap and are reused.

The cost is resident memory: up to `TRIM_THRESHOLD` of freed heap is kept.

**The event loop.** `serving_loop()` makes the loop a serving process runs on: uvloop's where it is installed (a
dependency of the package on Linux and macOS), else asyncio's; `POLAR_EVENT_LOOP=asyncio` (or `polar proxy
--event-loop asyncio`) keeps asyncio's. On the long-stream mix uvloop took 6 % off the proxy's CPU per request at
c=64 and 4 % at c=1 (docs/performance.md, "The event loop"). `polar proxy`, `polar serve`, `serve-rollout` and
`serve-gateway` run on it (`run_serving`); `GET /admin/status` names the proxy's (`event_loop`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import platform
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = [
    "EVENT_LOOPS",
    "EVENT_LOOP_ENV",
    "GC_THRESHOLDS",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "keep_freed_memory",
    "loop_name",
    "run_serving",
    "serving_loop",
    "settle_gc",
    "tune_serving_process",
]

T = TypeVar("T")

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # allocations below this come from the heap (glibc's own ceiling for its moving threshold)
TRIM_THRESHOLD = 128 << 20  # freed memory at the heap's top kept up to this much

GC_THRESHOLDS = (10_000, 20, 20)

EVENT_LOOP_ENV = "POLAR_EVENT_LOOP"
EVENT_LOOPS = (
    "auto",
    "uvloop",
    "asyncio",
)  # auto: uvloop's where installed, else asyncio's  # generation 0 every 10,000 container allocations (CPython's default: 700, 10, 10)


def tune_serving_process() -> bool:
    """`settle_gc()` and `keep_freed_memory()` (module docstring); whether the allocator took its setting."""
    settle_gc()
    return keep_freed_memory()


def settle_gc() -> None:
    """Collect once, freeze what is alive out of later collections, and run generation 0 14x less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (module docstring); False, changing nothing, where the C library is not
    glibc or refuses them."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = (
            libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        )
    except (OSError, AttributeError) as exc:
        log.info("allocator thresholds left as they are: %s", exc)
        return False
    return ok


def _event_loop_choice(choice: str | None) -> str:
    name = (choice or os.environ.get(EVENT_LOOP_ENV) or "auto").strip().lower()
    if name not in EVENT_LOOPS:
        raise ValueError(f"unknown event loop {name!r} ({' | '.join(EVENT_LOOPS)}; {EVENT_LOOP_ENV} or --event-loop)")
    return name


def serving_loop(choice: str | None = None) -> asyncio.AbstractEventLoop:
    """A new event loop for a serving process (module docstring): `choice` ("auto", "uvloop" or "asyncio"), else
    `POLAR_EVENT_LOOP`, else "auto". ValueError for another name, or for "uvloop" where it is not installed."""
    name = _event_loop_choice(choice)
    if name != "asyncio":
        try:
            import uvloop
        except ImportError as exc:
            if name == "uvloop":
                raise ValueError(
                    "event loop 'uvloop' asked for, but uvloop is not installed (pip install uvloop)"
                ) from exc
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()


def run_serving(main: Coroutine[Any, Any, T], choice: str | None = None) -> T:
    """`asyncio.run(main)` on `serving_loop(choice)`."""
    try:
        _event_loop_choice(choice)
    except ValueError:
        main.close()  # never started: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=lambda: serving_loop(choice)) as runner:
        return runner.run(main)


def loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """ "uvloop" or "asyncio": which loop `loop` (default: the running one) is."""
    loop = loop or asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.split(".")[0] == "uvloop" else "asyncio"
