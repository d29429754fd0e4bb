# SPDX-License-Identifier: Apache-2.0
"""CALL-CREDIT over a run directory (docs/run_directory.md): read sessions and records, write `credit.jsonl`.

Reads `trajectories.jsonl` (one `SessionResult` per line; a bare `Trajectory` with `session_id`/`reward`
fields, or one `Trace` per line as `polar run` writes it, are accepted too) and the records from
`records.jsonl` (one `CompletionRecord` per line) or `records.sqlite`, read through `nemo_polar.rundir` (the
proxy store's own read API; pending rows are skipped). Groups are `metadata.group_id`, else `task_id`. Writes one
line per session to `credit.jsonl`: the session's Â_τ and, per call, `{call_index, record_id, role, evidence, parents, credit, …}` — the shape
of `polar_calls` (docs/nemo.md) plus the credit. Returns the metrics for the CLI. No trainer; the network only for
counterfactual calibration (a runner, or `counterfactual.rollout_url`: each measured call gets its `delta`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nemo_polar.rundir import RunDir, read_records_of
from nemo_polar.types import CompletionRecord, EvalResult, SessionResult, Trace, Trajectory

from .config import CallCreditConfig
from .counterfactual import CounterfactualRunner, Measurement, calibrate
from .graph import CallGraph, annotate
from .metrics import broadcast_factors, is_hacked, reward_hacking, role_distributions, weakness_report
from .propagation import CreditAssignment, assign

__all__ = ["RunCredit", "credit_run_dir", "load_records", "load_sessions"]


def load_sessions(run_dir: Path, records: Sequence[CompletionRecord] = ()) -> list[SessionResult]:
    """Sessions of `run_dir/trajectories.jsonl`. Lines may be `SessionResult`s, `Trajectory`s (with optional
    `session_id`/`task_id`/`harness`/`reward`/`metadata` fields) or single `Trace`s (what `polar run` writes: they
    are grouped into sessions by the session of the records their spans name; harness and session id default to
    `summary.json`'s; the reward is the traces' `reward`)."""
    path = RunDir(run_dir).trajectories
    if not path.exists():
        raise FileNotFoundError(f"{path} not found")
    out = []
    loose: list[Trace] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        d = orjson.loads(line)
        if "trajectory" in d:
            out.append(SessionResult.from_dict(d))
        elif "traces" in d:  # a bare Trajectory line
            extra = {k: d.pop(k) for k in ("session_id", "task_id", "harness", "reward", "metadata") if k in d}
            reward = extra.pop("reward", None)
            out.append(
                SessionResult.from_dict(
                    {
                        "session_id": extra.get("session_id", f"line{n}"),
                        "task_id": extra.get("task_id", "task"),
                        "harness": extra.get("harness"),
                        "metadata": extra.get("metadata", {}),
                        "trajectory": d,
                        "eval": None if reward is None else {"reward": reward},
                    }
                )
            )
        elif "response_ids" in d or "call_spans" in d:
            loose.append(Trace.from_dict(d))
        else:
            raise ValueError(f"{path}:{n}: neither a SessionResult, a Trajectory nor a Trace")
    if loose:
        out += _sessions_from_traces(run_dir, loose, records)
    return out


def _sessions_from_traces(
    run_dir: Path, traces: list[Trace], records: Sequence[CompletionRecord]
) -> list[SessionResult]:
    summary: dict[str, Any] = {}
    if RunDir(run_dir).summary.exists():
        summary = json.loads(RunDir(run_dir).summary.read_text())
    session_of = {r.id: r.session_id for r in records}
    default_sid = str(summary.get("session_id") or "session")
    groups: dict[str, list[Trace]] = {}
    for t in traces:
        sid = next((session_of[rid] for rid, _, _ in t.call_spans if rid in session_of), default_sid)
        groups.setdefault(sid, []).append(t)
    out = []
    for sid, ts in groups.items():
        reward = next((t.reward for t in ts if t.reward is not None), None)
        out.append(
            SessionResult(
                session_id=sid,
                task_id=str(summary.get("task_id") or sid),
                harness=summary.get("harness"),
                trajectory=Trajectory(traces=ts),
                eval=None if reward is None else EvalResult(reward=float(reward)),
                record_ids=[rid for t in ts for rid, _, _ in t.call_spans],
            )
        )
    return out


def load_records(run_dir: Path) -> list[CompletionRecord]:
    """The run's records, read through the run directory's reader (`records.jsonl`, else the proxy's store API)."""
    return read_records_of(run_dir)


@dataclass(slots=True)
class RunCredit:
    sessions: list[SessionResult]
    graphs: list[CallGraph]
    assignments: list[CreditAssignment]
    hacking: dict[str, Any]
    hacking_broadcast: dict[str, Any]
    distributions: dict[str, Any]
    weaknesses: dict[str, Any]
    measurements: list[Measurement] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out = {
            "sessions": len(self.sessions),
            "calls": sum(len(g) for g in self.graphs),
            "reward_hacking": self.hacking,
            "reward_hacking_broadcast": self.hacking_broadcast,
            "role_distributions": self.distributions,
            "weaknesses": self.weaknesses,
        }
        if self.measurements:
            ds = [m.delta for m in self.measurements]
            out["counterfactual"] = {
                "runs": len(ds),
                "mean_delta": sum(ds) / len(ds),
                "measured": [
                    {"session_id": m.session_id, "record_id": m.record_id, "role": m.role, "delta": m.delta}
                    for m in self.measurements
                ],
            }
        return out


def credit_run_dir(
    run_dir: str | Path,
    config: CallCreditConfig | None = None,
    *,
    out_name: str | None = None,
    runner: CounterfactualRunner | None = None,
    plans: Mapping[str, Mapping[str, Any]] | None = None,
) -> RunCredit:
    """Annotate, assign and summarise every session of `run_dir`; write `run_dir/out_name` (default `credit.jsonl`).

    With a counterfactual `runner` (or `config.counterfactual.rollout_url`, which makes a `RolloutRunner` over
    `tasks.jsonl`), the selected AE calls are calibrated before the metrics; `plans` maps a record id to the plan
    step that replaces it when `counterfactual.alternative` is `plan`."""
    cfg = config or CallCreditConfig()
    rd = Path(run_dir)
    records = load_records(rd)
    sessions = load_sessions(rd, records)
    by_session: dict[str, list[CompletionRecord]] = {}
    for r in records:
        by_session.setdefault(r.session_id, []).append(r)
    graphs: list[CallGraph] = []
    used: list[list[CompletionRecord]] = []
    for s in sessions:
        recs = by_session.get(s.session_id, [])
        if s.record_ids:
            wanted = set(s.record_ids)
            recs = [r for r in recs if r.id in wanted] or recs
        g = annotate(recs, harness=s.harness, session_id=s.session_id, config=cfg)
        if not recs and s.trajectory.traces:
            g = annotate(s.trajectory, records=[], harness=s.harness, session_id=s.session_id, config=cfg)
        graphs.append(g)
        used.append(recs)
    rewards = [s.reward for s in sessions]
    groups = [s.metadata.get("group_id", s.task_id) for s in sessions]
    assignments = assign(graphs, rewards, cfg, group_ids=groups)
    measurements: list[Measurement] = []
    if runner is None and cfg.counterfactual.rollout_url:
        from .counterfactual_rollout import runner_for_run_dir

        runner = runner_for_run_dir(rd, cfg.counterfactual.rollout_url, sessions)
    if runner is not None:
        steps = {
            (t, k): plans[n.record_id]
            for t, g in enumerate(graphs)
            for k, n in enumerate(g.nodes)
            if plans and n.record_id in plans
        }
        measurements = asyncio.run(
            calibrate(
                graphs,
                assignments,
                used,
                runner,
                cfg.counterfactual,
                plans=steps,
                k_variants=cfg.curation.k_variants,
                success_threshold=cfg.metrics.success_threshold,
            )
        )
    hack = reward_hacking(graphs, rewards, [a.factor for a in assignments], cfg.metrics)
    hack_b = reward_hacking(graphs, rewards, [broadcast_factors(g) for g in graphs], cfg.metrics)
    dist = role_distributions(graphs, assignments)
    weak = weakness_report(graphs, cfg.metrics, cfg.curation)
    out_path = rd / out_name if out_name else RunDir(rd).credit
    with open(out_path, "w", encoding="utf-8") as f:
        for s, g, a in zip(sessions, graphs, assignments, strict=True):
            f.write(json.dumps(_line(s, g, a, cfg), ensure_ascii=False) + "\n")
    return RunCredit(sessions, graphs, assignments, hack, hack_b, dist, weak, measurements)


def _line(s: SessionResult, g: CallGraph, a: CreditAssignment, cfg: CallCreditConfig) -> dict[str, Any]:
    parents: dict[int, list[int]] = {}
    for e in g.edges:
        parents.setdefault(e.dst, []).append(e.src)
    chain_of = {rid: t.chain_kind for t in s.trajectory.traces for rid, _, _ in t.call_spans}
    return {
        "session_id": s.session_id,
        "task_id": s.task_id,
        "harness": s.harness,
        "group_id": s.metadata.get("group_id", s.task_id),
        "reward": a.reward,
        "advantage": a.advantage,
        "scale": a.scale,
        "hacked": is_hacked(a.roles, a.factor, cfg.metrics) if a.reward >= cfg.metrics.success_threshold else False,
        "calls": [
            {
                "call_index": k,
                "record_id": n.record_id,
                "role": n.role,
                "evidence": n.evidence,
                "ambiguous": n.ambiguous,
                "parents": sorted(parents.get(k, [])),
                "chain_kind": chain_of.get(n.record_id, n.call_kind),
                "credit": float(a.credit[k]),
                "factor": float(a.factor[k]),
                "rv_reward": float(a.rv_reward[k]),
                **({"delta": a.calibrated[k]} if k in a.calibrated else {}),
                "test_outcome": n.test_outcome,
                "summary": n.summary,
            }
            for k, n in enumerate(g.nodes)
        ],
        "edges": [e.to_dict() for e in g.edges],
    }
