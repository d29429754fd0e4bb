# SPDX-License-Identifier: Apache-2.0
"""Run-slot occupancy of a gateway: how many agent runs are busy, integrated over time.

`BusyMeter` counts the gateway's busy run slots, integrates them over monotonic time (busy slot-seconds), keeps the
(start, end) interval of every agent run, and answers the occupancy of the run slots inside a time window. The
gateway's `stats()` / `/metrics` and `benchmarks/staging.py` read it; it runs nothing itself.
"""

from __future__ import annotations

import time

__all__ = ["BusyMeter"]


class BusyMeter:
    """Integrates busy run slots over time (for the busy fraction and the staging benchmark)."""

    def __init__(self) -> None:
        self.busy = 0
        self.area = 0.0
        self.t0 = time.monotonic()
        self._last = self.t0
        self.first_start: float | None = None
        self.last_end: float | None = None
        self.intervals: list[tuple[float, float]] = []  # (start, end) of each agent run, monotonic seconds
        self._open: dict[int, float] = {}

    def change(self, delta: int) -> None:
        now = time.monotonic()
        self.area += self.busy * (now - self._last)
        self._last = now
        self.busy += delta
        if delta > 0 and self.first_start is None:
            self.first_start = now
        if delta < 0:
            self.last_end = now

    def run_started(self, key: int) -> None:
        self._open[key] = time.monotonic()
        self.change(+1)

    def run_ended(self, key: int) -> None:
        self.change(-1)
        self.intervals.append((self._open.pop(key), time.monotonic()))

    def occupancy(self, start: float, end: float, slots: int) -> float:
        """Busy run-slot time inside [start, end] / (slots x (end - start))."""
        if end <= start:
            return 0.0
        busy = sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.intervals)
        return busy / (slots * (end - start))

    def area_now(self) -> float:
        return self.area + self.busy * (time.monotonic() - self._last)
