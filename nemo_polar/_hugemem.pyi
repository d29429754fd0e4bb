# SPDX-License-Identifier: Apache-2.0
"""CPython's object arenas on transparent huge pages (_hugemem.c); optional: `proxy/tuning.py` does without it."""

def install() -> bool:
    """From now on pymalloc's 1 MiB arenas are cut from 2 MiB-aligned `MADV_HUGEPAGE` chunks; False where not Linux."""

def stats() -> dict[str, int | bool]:
    """`installed`, and counts: `chunks` mapped, arenas `carved`, `reused`, kept `free`, `released`."""
