# SPDX-License-Identifier: Apache-2.0
"""Finding processes by a marker in their command line (for tests that prove nothing was left running)."""

from __future__ import annotations

import os
from pathlib import Path


def processes_with(marker: str, *, unless: str | None = None) -> dict[int, str]:
    """pid -> command line (spaces for NULs, at most 200 characters) of every process whose command line holds
    `marker` (and not `unless`)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd and (unless is None or unless.encode() not in cmd):
            found[int(pid)] = cmd.replace(b"\0", b" ").decode(errors="replace")[:200]
    return found
