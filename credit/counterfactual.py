# SPDX-License-Identifier: Apache-2.0
"""Counterfactual calibration of high-credit AE calls: the runner interface and the calibration math.

For a successful trajectory τ and an AE call v_k, a runner replays the session up to call k, substitutes an
alternative action at k (`next_best`: the best non-identical sample from the same context with seeded n>1
sampling; `plan`: a given plan step), continues live and evaluates: Δ_k = R(τ) − R(τ′). Δ_k then corrects
Â_{v_k} (`CounterfactualConfig.mode`).

This module defines the `CounterfactualRunner` protocol and everything around it (which calls to calibrate
within a budget, running them with bounded concurrency and a timeout per run, the correction, the replay plan).
The real runner, `counterfactual_rollout.RolloutRunner`, replays through the rollout service (`{"replay": id}`
steps up to k, then the alternative, then live) and is the only place that calls the rollout client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from nemo_polar.types import CompletionRecord

from .config import CounterfactualConfig
from .graph import CallGraph
from .propagation import CreditAssignment, path_key, surviving_edits

__all__ = [
    "Alternative",
    "CounterfactualOutcome",
    "CounterfactualRequest",
    "CounterfactualRunner",
    "Measurement",
    "apply_calibration",
    "calibrate",
    "corrected_credit",
    "inline_record",
    "observational_delta",
    "replay_plan",
    "select_calls",
]


@dataclass(frozen=True, slots=True)
class Alternative:
    """What replaces call k: `next_best` (seeded n>1 sampling, best non-identical), `second_best` (the model's
    second-most-likely output: second-ranked first token, then greedy) or `plan` (a plan step)."""

    kind: str = "next_best"
    step: Mapping[str, Any] | None = None
    seed: int = 0
    n: int | None = None  # next_best: samples drawn (None: the proxy's default, 4)
    temperature: float | None = None  # next_best: their temperature (None: the proxy's default, 1.0)
    # after k: "live" (the policy continues: the proposal's Δ_k) or "recorded" (the recorded later calls are
    # replayed: do(k) with the rest held fixed, the structural effect used as ground truth on forced sessions)
    then: str = "live"


@dataclass(frozen=True, slots=True)
class CounterfactualRequest:
    """Replay `records` (one session, `seq` order) up to `call_index`, substitute `alternative`, continue live."""

    session_id: str
    records: Sequence[CompletionRecord]
    call_index: int
    record_id: str
    alternative: Alternative
    variant: int = 0
    timeout_s: float = 1800.0


@dataclass(slots=True)
class CounterfactualOutcome:
    """R(τ′) and, when known, the substituted action (`{content, tool_calls}`) and its token ids."""

    reward: float
    action: dict[str, Any] | None = None
    token_ids: list[int] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class CounterfactualRunner(Protocol):
    """Runs one counterfactual session. Implementations: the rollout client (later); tests: in-process."""

    async def run(self, request: CounterfactualRequest) -> CounterfactualOutcome: ...


@dataclass(slots=True)
class Measurement:
    """One measured Δ_k."""

    trajectory: int
    session_id: str
    call_index: int
    record_id: str
    role: str
    reward_original: float
    outcome: CounterfactualOutcome
    alternative: str
    variant: int = 0

    @property
    def delta(self) -> float:
        return self.reward_original - self.outcome.reward


def _edited(graph: CallGraph, survivors: Sequence[int]) -> set[str]:
    return {path_key(p) for i in survivors for p in graph.nodes[i].paths_written}


def observational_delta(
    graphs: Sequence[CallGraph], assignments: Sequence[CreditAssignment], t: int, k: int, reward_range: float = 1.0
) -> float | None:
    """A cheap estimate of Δ_k/R without a replay: R(τ) minus the mean reward of the other trajectories of τ's
    GRPO group whose surviving edits touch none of call k's files (None when the group has no such trajectory).
    Without recorded paths (NeMo RL annotations) the comparison set is the trajectories with no surviving edit."""
    a, g = assignments[t], graphs[t]
    mine = {path_key(p) for p in g.nodes[k].paths_written}
    others = []
    for u, (gu, au) in enumerate(zip(graphs, assignments, strict=True)):
        if u == t or au.group_id != a.group_id:
            continue
        theirs = _edited(gu, surviving_edits(gu))
        untouched = not (mine & theirs) if mine else not surviving_edits(gu)
        if untouched:
            others.append(au.reward)
    if not others:
        return None
    return (a.reward - sum(others) / len(others)) / reward_range


def select_calls(
    graphs: Sequence[CallGraph],
    assignments: Sequence[CreditAssignment],
    config: CounterfactualConfig | None = None,
    *,
    success_threshold: float = 1.0,
) -> list[tuple[int, int]]:
    """(trajectory, call) pairs to calibrate, at most `max_per_trajectory` per trajectory, `budget` in all, only
    successful trajectories by default. AE calls ranked by |Â_v| (`select="credit"`; ties: the structural factor,
    then order) or by uncertainty (`select="uncertain"`): |Â_v/max_j Â_j − `observational_delta`|, the rule's
    relative credit against the cheap estimate (no estimate: maximal uncertainty, 1)."""
    cfg = config or CounterfactualConfig()
    cands: list[tuple[float, float, int, int]] = []
    for t, (g, a) in enumerate(zip(graphs, assignments, strict=True)):
        if cfg.only_successful and a.reward < success_threshold:
            continue
        top = float(a.factor.abs().max()) if len(a.factor) else 0.0
        for k, node in enumerate(g.nodes):
            if node.role != "AE":
                continue
            if cfg.select == "uncertain":
                est = observational_delta(graphs, assignments, t, k, cfg.reward_range)
                rel = float(a.factor[k]) / top if top > 0 else 0.0
                score = 1.0 if est is None else abs(rel - est)
                cands.append((score, abs(float(a.credit[k])), t, k))
            else:
                cands.append((abs(float(a.credit[k])), float(a.factor[k]), t, k))
    cands.sort(key=lambda c: (-c[0], -c[1], c[2], c[3]))
    per: dict[int, int] = {}
    out: list[tuple[int, int]] = []
    for _, _, t, k in cands:
        if len(out) >= cfg.budget:
            break
        if per.get(t, 0) >= cfg.max_per_trajectory:
            continue
        per[t] = per.get(t, 0) + 1
        out.append((t, k))
    return out


def corrected_credit(assignment: CreditAssignment, k: int, delta: float, config: CounterfactualConfig) -> float:
    """Â_{v_k} corrected by Δ_k (see `CounterfactualConfig.mode`)."""
    d = delta / config.reward_range
    a_v = float(assignment.credit[k])
    if config.mode == "scale":
        return a_v * (1.0 + config.strength * (d - config.expected_delta))
    if config.mode == "replace":
        return assignment.advantage * assignment.scale * d
    return a_v + config.strength * abs(assignment.advantage) * d  # additive


def apply_calibration(
    assignments: Sequence[CreditAssignment],
    measurements: Sequence[Measurement],
    config: CounterfactualConfig | None = None,
) -> None:
    """Correct the measured calls in place (the mean Δ over a call's variants) and record Δ in `calibrated`.

    `factor[k]` follows the corrected credit (Â_v/Â_τ) so metrics computed from factors see the calibration;
    where Â_τ = 0 the credit is 0 whatever the factor, and the factor is left as the structural share.
    """
    cfg = config or CounterfactualConfig()
    by_call: dict[tuple[int, int], list[float]] = {}
    for m in measurements:
        by_call.setdefault((m.trajectory, m.call_index), []).append(m.delta)
    for (t, k), ds in by_call.items():
        a = assignments[t]
        delta = sum(ds) / len(ds)
        new = corrected_credit(a, k, delta, cfg)
        a.credit = a.credit.clone()
        a.credit[k] = new
        if a.advantage != 0.0:
            a.factor = a.factor.clone()
            a.factor[k] = new / a.advantage
        a.calibrated[k] = delta


async def calibrate(
    graphs: Sequence[CallGraph],
    assignments: Sequence[CreditAssignment],
    records: Sequence[Sequence[CompletionRecord]],
    runner: CounterfactualRunner,
    config: CounterfactualConfig | None = None,
    *,
    plans: Mapping[tuple[int, int], Mapping[str, Any]] | None = None,
    k_variants: int = 1,
    success_threshold: float = 1.0,
    apply: bool = True,
) -> list[Measurement]:
    """Select calls within the budget, run `k_variants` counterfactuals each (bounded concurrency, a timeout per
    run; a failed or timed-out run is skipped), and correct the credits in place when `apply`.

    `plans[(t, k)]` is the plan step for `alternative="plan"` (a call without one is skipped). Pass
    `CallCreditConfig.curation.k_variants` as `k_variants` to get K variants per call for DPO pairs.
    """
    cfg = config or CounterfactualConfig()
    chosen = select_calls(graphs, assignments, cfg, success_threshold=success_threshold)
    sem = asyncio.Semaphore(cfg.concurrency)
    jobs: list[tuple[int, int, int, CounterfactualRequest]] = []
    for t, k in chosen:
        step = None
        if cfg.alternative == "plan":
            step = (plans or {}).get((t, k))
            if step is None:
                continue
        node = graphs[t].nodes[k]
        for v in range(k_variants):
            alt = Alternative(
                kind=cfg.alternative,
                step=step,
                seed=cfg.seed + v * cfg.next_best_n,  # variants draw disjoint seed ranges
                n=cfg.next_best_n,
                temperature=cfg.next_best_temperature,
            )
            req = CounterfactualRequest(
                graphs[t].session_id, list(records[t]), k, node.record_id, alt, v, cfg.timeout_s
            )
            jobs.append((t, k, v, req))

    async def one(t: int, k: int, v: int, req: CounterfactualRequest) -> Measurement | None:
        async with sem:
            try:
                outcome = await asyncio.wait_for(runner.run(req), timeout=cfg.timeout_s)
            except Exception:  # a failed or timed-out replay is data: skip the call
                return None
        return Measurement(
            t,
            graphs[t].session_id,
            k,
            req.record_id,
            graphs[t].nodes[k].role,
            assignments[t].reward,
            outcome,
            cfg.alternative,
            v,
        )

    results = await asyncio.gather(*(one(*j) for j in jobs))
    measurements = [m for m in results if m is not None]
    if apply:
        apply_calibration(assignments, measurements, cfg)
    return measurements


def inline_record(rec: CompletionRecord) -> dict[str, Any]:
    """What a `replay` step needs of a recorded call when the replaying proxy's store does not hold it: the
    response, its token data and the sampling it was rendered with (the proxy renders the prompt the same way)."""
    return {
        "response": rec.response,
        "finish_reason": rec.finish_reason,
        "generation_token_ids": list(rec.generation_token_ids),
        "generation_log_probs": list(rec.generation_log_probs),
        "served_model": rec.served_model,
        "request": {"sampling": (rec.request or {}).get("sampling", {})},
    }


def replay_plan(
    records: Sequence[CompletionRecord], record_id: str, alternative: Alternative, *, inline: bool = False
) -> dict[str, Any]:
    """The session plan (docs/contracts.md) a runner sends to replace the call `record_id`: replay the recorded
    main-agent calls before it (`{"replay": id}`, token for token), substitute the alternative, continue live
    (`alternative.then == "recorded"`: replay the recorded calls after it first).
    For `next_best` the substituted step is `{"next_best": {"seed": s, "exclude_record": record_id}}` (the proxy
    samples n>1 from the same context and takes the most likely sample that differs from the recorded one).
    `inline=True` carries each replayed record (`inline_record`) and the excluded response in the steps, for a
    proxy whose store does not hold the recorded session."""
    main = sorted((r for r in records if r.call_kind == "main"), key=lambda r: r.seq)
    pos = next((i for i, r in enumerate(main) if r.id == record_id), None)
    if pos is None:
        raise ValueError(f"{record_id} is not a main-agent call of this session")

    def replay(r: CompletionRecord) -> dict[str, Any]:
        return {"replay": r.id, "record": inline_record(r)} if inline else {"replay": r.id}

    steps = [replay(r) for r in main[:pos]]
    if alternative.kind == "plan":
        if alternative.step is None:
            raise ValueError("alternative 'plan' needs a step")
        steps.append(dict(alternative.step))
    elif alternative.kind == "second_best":
        sb: dict[str, Any] = {"exclude_record": record_id}
        if inline:
            sb["exclude_response"] = main[pos].response
        steps.append({"second_best": sb})
    else:
        nb: dict[str, Any] = {"seed": alternative.seed, "exclude_record": record_id}
        if alternative.n is not None:
            nb["n"] = alternative.n
        if alternative.temperature is not None:
            nb["temperature"] = alternative.temperature
        if inline:
            nb["exclude_response"] = main[pos].response
            ctk = ((main[pos].request or {}).get("sampling") or {}).get("chat_template_kwargs")
            if ctk:
                nb["chat_template_kwargs"] = ctk
        steps.append({"next_best": nb})
    if alternative.then == "recorded":
        steps += [replay(r) for r in main[pos + 1 :]]
    elif alternative.then != "live":
        raise ValueError(f"alternative.then must be 'live' or 'recorded', got {alternative.then!r}")
    steps.append({"live": True})
    return {"version": 1, "steps": steps, "side": "live"}
