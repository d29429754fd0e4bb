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

**Huge pages** (Linux, transparent huge pages in `madvise` or `always` mode). A call's walk through the interpreter's
objects and the proxy's buffers costs TLB misses on 4 KiB pages, most at concurrency 1, where the TLB is refilled
after every switch to the client or the engine. `start_serving_process()`, run by the serving commands (`polar
proxy`, `python -m nemo_polar.proxy.cli`, `polar serve`, `serve-rollout`, `serve-gateway`, `collect`, `demo`) before
they import the server, puts both on 2 MiB pages:
- CPython's object arenas (`huge_page_arenas`, the C module `_hugemem`): cut from 2 MiB-aligned chunks marked
  `MADV_HUGEPAGE`, freed arenas kept for reuse. It must run before the server's modules are imported: their
  objects are the ones every call touches (installed after start-up it measured no gain).
- glibc's heap (the large buffers): glibc reads its `glibc.malloc.hugetlb=1` tunable only as a process starts, so
  the command's process executes itself again once with it added to `GLIBC_TUNABLES` (same PID, same arguments).
On the long-stream mix they took ≈ 3.5-5.5 % off the proxy's CPU a request at c=1 and ≈ 6 % at c=64
(docs/performance.md, "Huge pages"). `POLAR_HUGE_PAGES=off` keeps both off; `GET /admin/status` says what is on
(`huge_pages`). Processes this package does not start (a NeMo Gym resources
server, a Ray actor) keep their small pages, and so do the processes a serving command starts (harness CLIs, engines):
the tunable is taken out of the environment again once the process has started. The cost is resident memory rounded
up to 2 MiB steps, and up to 256 MiB of freed arenas kept for reuse (`_hugemem.c`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import platform
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = [
    "EVENT_LOOPS",
    "EVENT_LOOP_ENV",
    "GC_THRESHOLDS",
    "HUGE_PAGES_ENV",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "huge_page_arenas",
    "huge_pages_status",
    "huge_pages_wanted",
    "keep_freed_memory",
    "loop_name",
    "run_serving",
    "serving_loop",
    "settle_gc",
    "start_serving_process",
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
HUGE_PAGES_ENV = "POLAR_HUGE_PAGES"  # off / 0 / false / no: small pages (module docstring, "Huge pages")
_HUGETLB_TUNABLE = "glibc.malloc.hugetlb"
_TUNABLES_BEFORE = "_POLAR_GLIBC_TUNABLES_BEFORE"  # set across the re-exec: the environment's value to restore
_heap_on_huge_pages = False  # glibc took the hugetlb tunable as this process started (`start_serving_process`)
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
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


def huge_pages_wanted() -> bool:
    """Whether this process should move to huge pages: Linux with transparent huge pages in `madvise` or `always`
    mode, and `POLAR_HUGE_PAGES` not off."""
    if os.environ.get(HUGE_PAGES_ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return False
    try:
        with open(_THP_MODE) as f:
            mode = f.read()
    except OSError:  # not Linux, or no THP in this kernel
        return False
    return "[always]" in mode or "[madvise]" in mode


def huge_page_arenas() -> bool:
    """CPython's object arenas on huge pages from now on (module docstring); False where not wanted or not built."""
    if not huge_pages_wanted():
        return False
    try:
        from nemo_polar import _hugemem
    except ImportError:  # the optional C module was not built (setup.py)
        return False
    return _hugemem.install()


def _glibc_takes_hugetlb() -> bool:
    lib, version = platform.libc_ver()
    try:
        return lib == "glibc" and tuple(int(x) for x in version.split(".")[:2]) >= (2, 35)
    except ValueError:
        return False


def _hugetlb_setting(tunables: str) -> str | None:
    """The value `tunables` (a `GLIBC_TUNABLES` string) gives glibc's hugetlb tunable; None: not there."""
    for item in tunables.split(":"):
        name, _, value = item.partition("=")
        if name == _HUGETLB_TUNABLE:
            return value
    return None


def huge_pages_status() -> dict[str, bool]:
    """What this process has on huge pages (module docstring): CPython's arenas, glibc's heap (`GET /admin/status`
    reports it as `huge_pages`)."""
    arenas = False
    try:
        from nemo_polar import _hugemem

        arenas = bool(_hugemem.stats()["installed"])
    except ImportError:
        pass
    return {"arenas": arenas, "heap": _heap_on_huge_pages}


def start_serving_process() -> None:
    """Called first by a serving command (module docstring, "Huge pages"): execute this process again with glibc's
    hugetlb tunable unless `GLIBC_TUNABLES` names it already (only a process's own `__main__` path may call this: it
    replaces the program), then put CPython's arenas on huge pages. Does nothing where huge pages are not wanted."""
    global _heap_on_huge_pages
    before = os.environ.pop(_TUNABLES_BEFORE, None)
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    setting = _hugetlb_setting(tunables)
    if before is not None:  # executed again by the code below: glibc has read the tunable; children do not inherit it
        _heap_on_huge_pages = True
        if before:
            os.environ["GLIBC_TUNABLES"] = before
        else:
            os.environ.pop("GLIBC_TUNABLES", None)
    elif setting is not None:  # the caller's own setting, kept
        _heap_on_huge_pages = setting in ("1", "2") and _glibc_takes_hugetlb()
    elif huge_pages_wanted() and _glibc_takes_hugetlb() and sys.executable and sys.orig_argv:
        env = {
            **os.environ,
            "GLIBC_TUNABLES": ":".join(filter(None, [tunables, f"{_HUGETLB_TUNABLE}=1"])),
            _TUNABLES_BEFORE: tunables,
        }
        sys.stdout.flush()
        sys.stderr.flush()
        try:  # argv[0] as this interpreter's path, so a venv's interpreter finds its venv again
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
        except OSError as exc:  # goes on as it is, on small pages for glibc's heap
            log.warning("could not start again with %s=1: %s", _HUGETLB_TUNABLE, exc)
    huge_page_arenas()
