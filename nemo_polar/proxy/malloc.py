# SPDX-License-Identifier: Apache-2.0
"""Keep freed memory for reuse in a serving process (glibc's allocator), so large buffers stop page-faulting.

A proxy at concurrency builds many large buffers at once and frees them together: request bodies, upstream answers
and the record's JSON (≈ 400 KB for a 30k-token prompt). glibc gives an allocation over its mmap threshold (128 KiB,
raised on the fly up to the largest chunk freed) its own pages, and returns the top of the heap to the OS once more
than its trim threshold is free there; the next batch then touches fresh pages, a minor fault each 4 KiB. Committing
30k-token records 16 or 64 at a time cost ≈ 100 faults and ≈ 1.5x the CPU of committing them one at a time
(docs/performance.md, "Freed memory kept"). With larger thresholds the freed chunks stay in the heap and are reused.

Only the processes this package runs as servers call `keep_freed_memory` (`polar proxy`, `polar serve` and its
gateway and rollout variants), as the cyclic-GC settings are installed only there: an application embedding the
proxy keeps its allocator as it is. The cost is resident memory: up to `TRIM_THRESHOLD` of freed heap is kept.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # allocations below this come from the heap (glibc's own ceiling for its moving threshold)
TRIM_THRESHOLD = 128 << 20  # freed memory at the heap's top kept up to this much


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
