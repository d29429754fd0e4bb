# SPDX-License-Identifier: Apache-2.0
"""`summary.json` of a collect run: attempts, accepted, acceptance rate, mean turns, messages per session and
trainable tokens — in total, per harness, per repository and per harness × repository (the paper's Table 2).

Definitions (each computed from the run directory's own files, so a reader can recompute them):
- attempt: one finished session (any status); `errors` counts ERROR sessions and masked samples among them.
- accepted: a usable session (not ERROR, not masked) with reward >= `accept_threshold` (default 1.0).
- turns: main-agent assistant turns = call spans in the session's `main` and `post_compaction` traces.
- messages: OpenAI-style messages of the session's main conversation (what `polar export sft` writes).
- trainable tokens: the sum of every trace's `loss_mask`.
- repository: `metadata.repo`, else `metadata.group_id`, else the task id.

This module reads and aggregates; it runs no session.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_polar.collect.accept import is_accepted, repo_of, usable
from nemo_polar.collect.export import sft_lines
from nemo_polar.rundir import RunDir, read_results, records_by_session, write_json
from nemo_polar.types import ChainKind, CompletionRecord, SessionResult

__all__ = [
    "aggregate",
    "is_accepted",
    "load_records_by_session",
    "load_results",
    "repo_of",
    "session_row",
    "summarize",
    "usable",
    "write_summary",
]

_MAIN_CHAINS = (ChainKind.MAIN.value, ChainKind.POST_COMPACTION.value)


def load_results(run_dir: str | Path) -> list[SessionResult]:
    """The `SessionResult` lines of `run_dir/trajectories.jsonl` (`nemo_polar.rundir.read_results`)."""
    return read_results(run_dir)


def load_records_by_session(run_dir: str | Path) -> dict[str, list[CompletionRecord]]:
    """The run's records per session in `seq` order (`nemo_polar.rundir.records_by_session`)."""
    return records_by_session(run_dir)


def session_row(s: SessionResult, records: Sequence[CompletionRecord], accept_threshold: float) -> dict[str, Any]:
    """Per-session numbers (the summary aggregates these; the viewer's index shows them)."""
    traces = s.trajectory.traces
    lines = sft_lines(s, records)
    return {
        "session_id": s.session_id,
        "task_id": s.task_id,
        "sample_index": s.sample_index,
        "harness": s.harness or "?",
        "repo": repo_of(s),
        "status": s.status,
        "reward": s.reward,
        "accepted": is_accepted(s, accept_threshold),
        "error": not usable(s),
        "turns": sum(len(t.call_spans) for t in traces if t.chain_kind in _MAIN_CHAINS),
        "messages": len(lines[0]["messages"]) if lines else 0,
        "trainable_tokens": sum(t.trainable_tokens for t in traces),
        "chains": dict(Counter(t.chain_kind for t in traces)),
        "records": len(s.record_ids),
        "generated_tokens": sum(len(r.generation_token_ids) for r in records if r.ok),
    }


def aggregate(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    rows = list(rows)
    n = len(rows)
    accepted = sum(1 for r in rows if r["accepted"])
    chains: Counter[str] = Counter()
    for r in rows:
        chains.update(r["chains"])

    def mean(key: str) -> float:
        return round(sum(r[key] for r in rows) / n, 4) if n else 0.0

    return {
        "attempts": n,
        "accepted": accepted,
        "acceptance_rate": round(accepted / n, 4) if n else 0.0,
        "errors": sum(1 for r in rows if r["error"]),
        "mean_reward": mean("reward"),
        "mean_turns": mean("turns"),
        "messages_per_session": mean("messages"),
        "trainable_tokens": sum(r["trainable_tokens"] for r in rows),
        "trainable_tokens_per_session": mean("trainable_tokens"),
        "generated_tokens": sum(r["generated_tokens"] for r in rows),
        "records": sum(r["records"] for r in rows),
        "chains": dict(sorted(chains.items())),
    }


def _grouped(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    return {k: aggregate(v) for k, v in sorted(groups.items())}


def summarize(
    results: Sequence[SessionResult],
    records: Mapping[str, Sequence[CompletionRecord]],
    *,
    accept_threshold: float = 1.0,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    rows = [session_row(s, records.get(s.session_id, ()), accept_threshold) for s in results]
    by_hr: dict[str, Any] = {}
    for h in sorted({r["harness"] for r in rows}):
        by_hr[h] = _grouped([r for r in rows if r["harness"] == h], "repo")
    return {
        **(dict(extra) if extra else {}),
        "accept_threshold": accept_threshold,
        "written_at": time.time(),
        "total": aggregate(rows),
        "by_harness": _grouped(rows, "harness"),
        "by_repo": _grouped(rows, "repo"),
        "by_harness_repo": by_hr,
        "sessions": rows,
    }


def write_summary(
    run_dir: str | Path, *, accept_threshold: float = 1.0, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Recompute `run_dir/summary.json` from trajectories.jsonl and records.sqlite; return it."""
    rd = RunDir(run_dir)
    summary = summarize(read_results(rd), records_by_session(rd), accept_threshold=accept_threshold, extra=extra)
    write_json(rd.summary, summary)
    return summary
