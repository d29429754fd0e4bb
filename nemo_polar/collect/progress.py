# SPDX-License-Identifier: Apache-2.0
"""The live progress display of `polar collect` (rich): sessions per stage, rewards so far, tokens/s, ETA.

`CollectProgress` is fed by the collector's hooks — `start(total, done)`, `stages(counts)` (the gateway's stage
counts, polled twice a second), `result(session, generated_tokens)` — and renders a rich `Live` panel on a
terminal. Off a terminal (CI logs, tests) it prints one plain line per finished session instead. Pure display:
it changes nothing in the run.
"""

from __future__ import annotations

import time
from collections import defaultdict
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from nemo_polar.types import SessionResult

__all__ = ["CollectProgress"]

_STAGES = (
    ("queued", "queued"),
    ("init_queue", "init queue"),
    ("init", "INIT"),
    ("ready", "READY"),
    ("running", "RUNNING"),
    ("postrun_queue", "postrun queue"),
    ("postrun", "POSTRUN"),
)


class CollectProgress:
    def __init__(self, console: Console | None = None, *, live: bool | None = None, accept_threshold: float = 1.0):
        self.accept_threshold = accept_threshold
        self.console = console or Console(stderr=True)
        self.use_live = self.console.is_terminal if live is None else live
        self.total = 0
        self.done_before = 0
        self.finished = 0
        self.counts: dict[str, int] = {}
        self.rewards: dict[str, list[float]] = defaultdict(list)
        self.accepted: dict[str, int] = defaultdict(int)
        self.errors = 0
        self.tokens = 0
        self.t0 = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> CollectProgress:
        if self.use_live:
            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(et, e, tb)
            self._live = None

    # -- hooks -----------------------------------------------------------------------------------------------------

    def start(self, total: int, done: int) -> None:
        self.total, self.done_before = total, done
        self.t0 = time.monotonic()
        if done:
            self.console.print(
                f"resuming: {done}/{total} sessions already finished in this run directory", highlight=False
            )
        self._refresh()

    def stages(self, counts: dict[str, Any]) -> None:
        self.counts = {k: int(v) for k, v in counts.items()}
        self._refresh()

    def result(self, res: SessionResult, generated_tokens: int) -> None:
        self.finished += 1
        harness = res.harness or "?"
        self.rewards[harness].append(res.reward)
        masked = res.eval is None or res.eval.mask_sample or res.status == "ERROR"
        self.errors += int(masked)
        self.accepted[harness] += int(not masked and res.reward >= self.accept_threshold)
        self.tokens += generated_tokens
        if self._live is not None:
            self._live.console.print(self._line(res), markup=False, highlight=False)
            self._refresh()
        else:
            self.console.print(
                self._line(res) + f"  [{self.done_before + self.finished}/{self.total}]", markup=False, highlight=False
            )

    # -- rendering -------------------------------------------------------------------------------------------------

    def _line(self, res: SessionResult) -> str:
        why = ""
        if res.eval is not None and res.eval.failure_kind:
            why = f" ({res.eval.failure_kind})"
        return (
            f"finished {res.task_id}#{res.sample_index} [{res.harness}] {res.status} reward={res.reward:g}{why} "
            f"calls={len(res.record_ids)} session={res.session_id}"
        )

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self.render())

    def eta_s(self) -> float | None:
        elapsed = time.monotonic() - self.t0
        left = self.total - self.done_before - self.finished
        if self.finished == 0 or left <= 0:
            return None if left > 0 else 0.0
        return elapsed / self.finished * left

    def render(self) -> Group:
        elapsed = time.monotonic() - self.t0
        done = self.done_before + self.finished
        held = sum(self.counts.get(k, 0) for k, _ in _STAGES[1:])
        counts = {**self.counts, "queued": max(0, self.total - done - held)}
        stages = Table(title=f"polar collect — {done}/{self.total} sessions finished", expand=False)
        for _, label in _STAGES:
            stages.add_column(label, justify="right")
        stages.add_row(*(str(counts.get(k, 0)) for k, _ in _STAGES))
        rewards = Table(show_header=True, expand=False)
        for col in ("harness", "finished", "mean reward", "accepted"):
            rewards.add_column(col, justify="right")
        for h in sorted(self.rewards):
            rs = self.rewards[h]
            rewards.add_row(h, str(len(rs)), f"{sum(rs) / len(rs):.3f}", str(self.accepted[h]))
        eta = self.eta_s()
        tps = self.tokens / elapsed if elapsed > 0 else 0.0
        foot = Text(
            f"elapsed {elapsed:6.0f}s   generated tokens {self.tokens} ({tps:.1f} tok/s)   "
            f"records {self.counts.get('records', 0)}   errors {self.errors}   "
            f"ETA {'—' if eta is None else f'{eta:.0f}s'}"
        )
        return Group(stages, rewards, foot)
