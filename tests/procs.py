# SPDX-License-Identifier: Apache-2.0
"""Finding processes by a marker in their command line (for tests that prove nothing was left running), and waiting
for a server process a test started to answer."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
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


def wait_until_serving(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """Until `HEAD url` answers; fails with the end of `proc`'s stderr (a pipe) once it has exited or `timeout_s`
    has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=2):
                return
        except OSError:
            alive = proc.poll() is None
            if not alive or time.monotonic() >= deadline:
                err = proc.stderr.read().decode()[-2000:] if proc.stderr and not alive else ""
                why = "exited" if not alive else f"{timeout_s} s"
                raise AssertionError(f"{url} did not answer ({why}): {err}") from None
            time.sleep(0.05)
