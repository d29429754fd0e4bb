# SPDX-License-Identifier: Apache-2.0
"""Pieces every builder shares: which records are usable, which policy applies to a call, and the stats.

Pure functions of `CompletionRecord`s and `BuildOptions`. Failed records (`error` set) are skipped without
breaking anything; records are ordered by `seq` (request arrival). A call's policy is `train`, `mask`
(kept as context, never trained, counted) or `drop` (left out, counted). This module builds no chains.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from nemo_polar.types import (
    CallKind,
    ChainKind,
    CompletionRecord,
    Origin,
    SplitReason,
    Trace,
    Trajectory,
    TrajectoryStats,
    TrajectoryStatus,
)

from .options import BuildOptions

__all__ = ["DROP", "MASK", "TRAIN", "Tally", "call_policy", "finish_trajectory", "usable_records"]

TRAIN, MASK, DROP = "train", "mask", "drop"


def usable_records(records: Iterable[CompletionRecord]) -> tuple[list[CompletionRecord], int]:
    """Successful records in arrival order (by `seq`, ties by `arrived_at`), and how many failed ones were skipped."""
    ok: list[CompletionRecord] = []
    failed = 0
    for r in records:
        if r.error is not None:
            failed += 1
            continue
        ok.append(r)
    ok.sort(key=lambda r: (r.seq, r.arrived_at))
    return ok, failed


def is_forced(record: CompletionRecord) -> bool:
    return record.origin != Origin.LIVE.value


@dataclass(slots=True)
class Tally:
    """Running counts a builder fills while it works; `finish_trajectory` turns them into `TrajectoryStats`."""

    records: int = 0
    merged: int = 0
    sampled_tokens: int = 0
    drift_tokens: int = 0
    splits: dict[str, int] = field(default_factory=lambda: {r.value: 0 for r in SplitReason})
    policy_tokens: dict[str, int] = field(default_factory=dict)

    def count_policy(self, name: str, tokens: int) -> None:
        self.policy_tokens[name] = self.policy_tokens.get(name, 0) + tokens


def call_policy(record: CompletionRecord, kind: str, options: BuildOptions, tally: Tally) -> str:
    """Decide (and count) what happens to one call's sampled tokens.

    Precedence: a dropped side call is dropped; otherwise forced/replayed tokens follow `forced_policy`;
    otherwise side calls follow `side_calls`.
    """
    n = len(record.generation_token_ids)
    if kind == CallKind.SIDE.value and options.side_calls == "drop":
        tally.count_policy("side_dropped", n)
        return DROP
    if is_forced(record) and options.forced_policy == "mask":
        tally.splits[SplitReason.FORCED_MASKED.value] += 1
        tally.count_policy("forced_masked", n)
        return MASK
    if kind == CallKind.SIDE.value and options.side_calls == "mask":
        tally.count_policy("side_masked", n)
        return MASK
    return TRAIN


def trace_reward(chain_kind: str, options: BuildOptions) -> float | None:
    """Side traces get the task reward only when the user explicitly keeps them and sets no `side_reward`."""
    if chain_kind == ChainKind.SIDE.value:
        if options.side_calls != "keep":
            return None
        return options.side_reward if options.side_reward is not None else options.reward
    return options.reward


def main_first(traces: list[Trace]) -> list[Trace]:
    """Stable order with the first main-kind trace moved to the front (what a NeMo Gym record delivers)."""
    for i, t in enumerate(traces):
        if t.chain_kind == ChainKind.MAIN.value:
            return [t, *traces[:i], *traces[i + 1 :]] if i else traces
    return traces


def finish_trajectory(traces: list[Trace], tally: Tally, *, failed: int) -> Trajectory:
    """Order the traces (main first), compute the stats of docs/contracts.md and the status.

    `delivered_fraction` is the share of all trainable tokens that sit in the first trace when it is the main
    chain: what one NeMo Gym rollout record (one contiguous chain, docs/nemo.md) delivers; 1.0 when nothing is
    trainable. Status is ERROR only when every record failed; TIMEOUT is the rollout service's to set.
    """
    traces = main_first(traces)
    trainable = 0
    for t in traces:
        trainable += sum(t.loss_mask)
    delivered = 1.0
    if trainable:
        first = traces[0]
        delivered = sum(first.loss_mask) / trainable if first.chain_kind == ChainKind.MAIN.value else 0.0
    stats = TrajectoryStats(
        chains=len(traces),
        records=tally.records,
        merged=tally.merged,
        splits=dict(tally.splits),
        trainable_tokens=trainable,
        delivered_fraction=delivered,
        drift_tokens=tally.drift_tokens,
        policy_tokens=dict(tally.policy_tokens),
    )
    status = TrajectoryStatus.COMPLETED.value
    if tally.records == 0 and failed:
        status = TrajectoryStatus.ERROR.value
    return Trajectory(status=status, traces=traces, stats=stats)
