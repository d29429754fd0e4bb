# SPDX-License-Identifier: Apache-2.0
"""The credit-fidelity experiment (docs/credit_sim_model.md §6): batches of simulated sessions through the real
builders and the real CALL-CREDIT path, five credit arms, three metrics, per scenario, builder and vocabulary split.

`make_batch` samples GRPO groups (one task per group), renders and tokenises their records, annotates them and
builds both trajectories. `arm_credits` gives per-call credit for (a) outcome broadcast, (b) uniform per-step split,
(c) CALL-CREDIT rules (`assign`, defaults), (d) (c) + `calibrate` with the simulator's runner, (e) `assign` with
the ω reached by `adapt_omega` (N steps of `coevolution.step`). `measure` reads each call's credit back from the
fused token advantages of each builder and scores it against the exact effects. `run` does it all for a config;
`format_table` prints it. Nothing here changes a CALL-CREDIT option: `CallCreditConfig()` throughout.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from nemo_polar.credit import CallCreditConfig, CoevolutionState, annotate, assign, calibrate, reward_hacking
from nemo_polar.credit.coevolution import step as coevolution_step
from nemo_polar.credit.config import CounterfactualConfig
from nemo_polar.credit.counterfactual import Alternative, CounterfactualRequest
from nemo_polar.credit.fusion import fuse_row, trace_spans
from nemo_polar.credit.graph import CallGraph
from nemo_polar.credit.propagation import CreditAssignment

from nemo_polar.trajectory import build
from nemo_polar.types import CompletionRecord, Trajectory

from .model import IRRELEVANT, SCENARIOS, Model, SimSession, draw_task
from .records import ChatTokenizer, session_records
from .render import HELD_IN, HELD_OUT, Repo, make_repo
from .runner import SimulatorRunner

__all__ = [
    "ARMS",
    "BUILDERS",
    "METRICS",
    "Batch",
    "FidelityConfig",
    "adapt_omega",
    "arm_credits",
    "format_table",
    "make_batch",
    "measure",
    "run",
    "spearman",
    "summarize",
    "vocabulary_check",
]

ARMS = ("broadcast", "uniform", "literal", "rules", "calibrated", "omega")
ARM_LABELS = {
    "broadcast": "(a) outcome broadcast",
    "uniform": "(b) uniform per-step",
    "literal": "(c0) seed formula",
    "rules": "(c) CALL-CREDIT rules",
    "calibrated": "(d) + counterfactual",
    "omega": "(e) after ω adaptation",
}
BUILDERS = ("call", "per_request", "prefix_merging")
METRICS = ("rho", "hack", "hack_sum", "irr_pos")
# the seed's literal formula, printed beside the defaults: out-degree share, zero for out-degree-0 calls
LITERAL = {"structure": "outdegree", "leaf_mode": "literal"}


# arm (d): calibration is off by default (budget 0); the arm measures it at its former default budget
CALIBRATION_BUDGET = 8


def calibration_config(cfg: CallCreditConfig) -> CounterfactualConfig:
    cf = cfg.counterfactual
    return cf if cf.budget > 0 else cf.model_copy(update={"budget": CALIBRATION_BUDGET})


def literal_config(cfg: CallCreditConfig) -> CallCreditConfig:
    prop = cfg.propagation.model_copy(update=LITERAL)
    return cfg.model_copy(update={"propagation": prop})


def _seeded(*parts: Any) -> random.Random:
    key = "|".join(str(p) for p in parts)
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))


@dataclass(slots=True)
class FidelityConfig:
    scenarios: tuple[str, ...] = ("basic", "confounded", "noisy")
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    tasks_in: int = 10
    # the held-out split gets as many tasks as the held-in one (it had 4 until 2026-12-01: too few to separate the
    # arms' 95 % intervals; docs/credit_sim_model.md §9). A sampling parameter of the benchmark, not of the model.
    tasks_out: int = 10
    samples: int = 8
    adapt_steps: int = 5
    adapt_tasks: int = 5
    truth_calls: int = 4
    truth_runs: int = 200


@dataclass(slots=True)
class Batch:
    """One GRPO batch: sessions with their exact effects, records, graphs and both builders' trajectories."""

    vocabs: list[str]
    group_ids: list[str]
    sessions: list[SimSession]
    models: list[Model]
    repos: list[Repo]
    records: list[list[CompletionRecord]]
    graphs: list[CallGraph]
    trajectories: dict[str, list[Trajectory]] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.sessions]

    def deltas(self) -> list[list[float]]:
        return [[st.delta for st in s.steps] for s in self.sessions]

    def irrelevant(self) -> list[list[bool]]:
        return [[st.action in IRRELEVANT for st in s.steps] for s in self.sessions]


def make_batch(
    scenario: str,
    seed: int,
    tag: str,
    vocabs: Sequence[str],
    n_tasks: int,
    n_samples: int,
    tok: ChatTokenizer | None,
    runner: SimulatorRunner | None = None,
    *,
    builders: bool = True,
) -> Batch:
    """`n_tasks` groups of `n_samples` sessions; task i uses vocabulary `vocabs[i % len(vocabs)]`."""
    sc = SCENARIOS[scenario]
    rng = _seeded("batch", scenario, seed, tag)
    b = Batch([], [], [], [], [], [], [])
    for i in range(n_tasks):
        vocab = vocabs[i % len(vocabs)]
        task = draw_task(rng)
        model = Model(sc, task)
        gid = f"{scenario}-{seed}-{tag}-t{i}"
        for j in range(n_samples):
            sess = model.sample(rng)
            repo = make_repo(_seeded("repo", gid), sess.steps[0].state.located)
            sid = f"{gid}-s{j}"
            recs = session_records(sess, repo, vocab, tok, session_id=sid, seed=rng.randrange(2**31))
            b.vocabs.append(vocab)
            b.group_ids.append(gid)
            b.sessions.append(sess)
            b.models.append(model)
            b.repos.append(repo)
            b.records.append(recs)
            b.graphs.append(annotate(recs, harness=vocab))
            if runner is not None:
                runner.register(sid, model, sess, [r.id for r in recs])
    if builders:
        eot = [tok.eot_id] if tok is not None else []
        for name in ("per_request", "prefix_merging"):
            b.trajectories[name] = [build(r, name, eot_token_ids=eot) for r in b.records]
    return b


@dataclass(slots=True)
class ArmCredit:
    """Per-call credit of one arm, its structural factor (credit / Â_τ), and the fusion α its tokens use."""

    credit: list[torch.Tensor]
    factor: list[torch.Tensor]
    advantage: list[float]
    alpha: float


def _from_assignments(out: list[CreditAssignment], alpha: float) -> ArmCredit:
    factors = []
    for a in out:
        if abs(a.advantage) > 1e-12:
            factors.append(a.credit / a.advantage)
        else:
            factors.append(a.factor.clone())
    return ArmCredit([a.credit.clone() for a in out], factors, [a.advantage for a in out], alpha)


def arm_credits(
    b: Batch, cfg: CallCreditConfig, runner: SimulatorRunner, omega: dict[str, float] | None
) -> tuple[dict[str, ArmCredit], list[Any]]:
    """Credits of the five arms on batch `b` (and the calibration's measurements)."""
    rules = assign(b.graphs, b.rewards, cfg, group_ids=b.group_ids)
    adv = [a.advantage for a in rules]
    n = [len(g.nodes) for g in b.graphs]
    arms: dict[str, ArmCredit] = {
        "broadcast": ArmCredit(
            [torch.full((k,), a, dtype=torch.float64) for k, a in zip(n, adv, strict=True)],
            [torch.ones(k, dtype=torch.float64) for k in n],
            adv,
            1.0,
        ),
        "uniform": ArmCredit(
            [torch.full((k,), a / k, dtype=torch.float64) for k, a in zip(n, adv, strict=True)],
            [torch.full((k,), 1.0 / k, dtype=torch.float64) for k in n],
            adv,
            0.0,
        ),
        "literal": _from_assignments(
            assign(b.graphs, b.rewards, literal_config(cfg), group_ids=b.group_ids), cfg.fusion.alpha
        ),
        "rules": _from_assignments(rules, cfg.fusion.alpha),
    }
    cal = assign(b.graphs, b.rewards, cfg, group_ids=b.group_ids)
    measurements = asyncio.run(
        calibrate(
            b.graphs,
            cal,
            b.records,
            runner,
            calibration_config(cfg),
            k_variants=1,
            success_threshold=cfg.metrics.success_threshold,
        )
    )
    arms["calibrated"] = _from_assignments(cal, cfg.fusion.alpha)
    arms["omega"] = _from_assignments(
        assign(b.graphs, b.rewards, cfg, group_ids=b.group_ids, omega=omega), cfg.fusion.alpha
    )
    return arms, measurements


def adapt_omega(
    scenario: str, seed: int, fc: FidelityConfig, cfg: CallCreditConfig, runner: SimulatorRunner
) -> CoevolutionState:
    """N steps of the core's co-evolution on fresh held-in batches (records without token data: only `annotate`
    reads them), each with the default assignment and calibration by the simulator's runner."""
    state = CoevolutionState.initial(cfg)
    for i in range(fc.adapt_steps):
        b = make_batch(scenario, seed, f"adapt{i}", HELD_IN, fc.adapt_tasks, fc.samples, None, runner, builders=False)
        a = assign(b.graphs, b.rewards, cfg, group_ids=b.group_ids, omega=state.omega)
        ms = asyncio.run(
            calibrate(b.graphs, a, b.records, runner, calibration_config(cfg),
                      success_threshold=cfg.metrics.success_threshold)
        )  # fmt: skip
        state = coevolution_step(state, b.graphs, b.rewards, cfg, group_ids=b.group_ids, measurements=ms)
    return state


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's ρ with average ranks for ties (nan when either side is constant)."""

    def ranks(v: Sequence[float]) -> np.ndarray:
        a = np.asarray(v, dtype=np.float64)
        order = np.argsort(a, kind="mergesort")
        r = np.empty(len(a), dtype=np.float64)
        sa = a[order]
        i = 0
        while i < len(a):
            j = i
            while j + 1 < len(a) and sa[j + 1] == sa[i]:
                j += 1
            r[order[i : j + 1]] = (i + j) / 2.0
            i = j + 1
        return r

    if len(x) < 2:
        return float("nan")
    rx, ry = ranks(x), ranks(y)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return float("nan")
    return float(((rx - rx.mean()) * (ry - ry.mean())).mean() / (sx * sy))


def _token_level(traj: Trajectory, g: CallGraph, credit: torch.Tensor, adv: float, alpha: float) -> torch.Tensor:
    """Per call: the mean fused token advantage over its trainable tokens in this builder's traces."""
    tot = torch.zeros(len(g.nodes), dtype=torch.float64)
    cnt = torch.zeros(len(g.nodes), dtype=torch.float64)
    for t in traj.traces:
        mask = torch.tensor(t.loss_mask, dtype=torch.float32)
        spans = trace_spans(t, g)
        fused = fuse_row(mask, spans, credit, adv, alpha).to(torch.float64)
        for s, e, k in spans:
            m = mask[s:e].to(torch.float64)
            tot[k] += float((fused[s:e] * m).sum())
            cnt[k] += float(m.sum())
    if bool((cnt == 0).any()):
        missing = [g.nodes[k].record_id for k in range(len(g.nodes)) if cnt[k] == 0]
        raise AssertionError(f"calls without trainable tokens in {g.session_id}: {missing}")
    return tot / cnt


def measure(b: Batch, arm: ArmCredit, builder: str, cfg: CallCreditConfig) -> dict[str, float]:
    """ρ, reward-hacking rate and positive-credit share on irrelevant calls for one arm and builder."""
    credits: list[torch.Tensor] = []
    factors: list[torch.Tensor] = []
    for i, g in enumerate(b.graphs):
        if builder == "call":
            c = arm.credit[i]
        else:
            c = _token_level(b.trajectories[builder][i], g, arm.credit[i], arm.advantage[i], arm.alpha)
        credits.append(c)
        a = arm.advantage[i]
        factors.append(c / a if abs(a) > 1e-12 else arm.factor[i])
    flat_c = [float(x) for c in credits for x in c]
    flat_d = [d for ds in b.deltas() for d in ds]
    flat_irr = [x for xs in b.irrelevant() for x in xs]
    pos = [max(c, 0.0) for c in flat_c]
    total = sum(pos)
    irr = sum(p for p, i in zip(pos, flat_irr, strict=True) if i)
    rep = reward_hacking(b.graphs, b.rewards, factors, cfg.metrics)
    hack = rep["rate"]
    summed = cfg.metrics.model_copy(update={"hacking_aggregate": "sum"})
    hack_sum = reward_hacking(b.graphs, b.rewards, factors, summed)["rate"]
    return {
        "rho": spearman(flat_c, flat_d),
        "hack": float("nan") if hack is None else float(hack),
        "hack_sum": float("nan") if hack_sum is None else float(hack_sum),
        "irr_pos": irr / total if total > 0 else float("nan"),
        "per_harness": {h: (d["n_hacked"], d["n_successful"]) for h, d in rep["per_harness"].items()},
    }


def vocabulary_check(
    scenario: str, seed: int, n_tasks: int, n_samples: int, cfg: CallCreditConfig
) -> dict[str, int | float]:
    """The held-out batch's sessions (same tag, same draws) rendered in each held-in vocabulary too: how many calls
    get another role than in the held-out rendering, and the largest |Δ Â_v|. Records without token data (only
    `annotate` reads them). Zero everywhere means the held-out split differs from the held-in one only by its draws."""
    ref = make_batch(scenario, seed, "held-out", (HELD_OUT,), n_tasks, n_samples, None, builders=False)
    ref_credit = torch.cat([a.credit for a in assign(ref.graphs, ref.rewards, cfg, group_ids=ref.group_ids)])
    ref_roles = [r for g in ref.graphs for r in g.roles()]
    ref_actions = [[st.action for st in s.steps] for s in ref.sessions]
    out: dict[str, int | float] = {"calls": 0, "role_mismatch": 0, "max_abs_credit_diff": 0.0}
    for vocab in HELD_IN:
        b = make_batch(scenario, seed, "held-out", (vocab,), n_tasks, n_samples, None, builders=False)
        if [[st.action for st in s.steps] for s in b.sessions] != ref_actions:
            raise AssertionError(f"vocabulary {vocab} drew other sessions than {HELD_OUT}")
        credit = torch.cat([a.credit for a in assign(b.graphs, b.rewards, cfg, group_ids=b.group_ids)])
        roles = [r for g in b.graphs for r in g.roles()]
        out["calls"] += len(roles)
        out["role_mismatch"] += sum(x != y for x, y in zip(roles, ref_roles, strict=True))
        out["max_abs_credit_diff"] = max(out["max_abs_credit_diff"], float((credit - ref_credit).abs().max()))
    return out


def truth_check(b: Batch, runner: SimulatorRunner, n_calls: int, n_runs: int, seed: int) -> list[dict[str, float]]:
    """δ for `n_calls` random calls through the runner (call as recorded vs. no action), M runs each, next to
    the exact δ."""
    rng = _seeded("truth", seed, b.group_ids[0] if b.group_ids else "")
    pairs = [(i, k) for i, s in enumerate(b.sessions) for k in range(len(s.steps))]
    out = []
    for i, k in rng.sample(pairs, min(n_calls, len(pairs))):
        recs, rid = b.records[i], b.records[i][k].id
        arms = []
        for step in ({"replay": rid}, {"text": "(no action)"}):
            ys = []
            for v in range(n_runs):
                req = CounterfactualRequest(recs[0].session_id, recs, k, rid, Alternative("plan", step, seed), v)
                ys.append(runner.simulate(req)[1])
            arms.append(ys)
        keep, null = np.asarray(arms[0]), np.asarray(arms[1])
        est = float(keep.mean() - null.mean())
        se = float(math.sqrt(keep.var(ddof=1) / n_runs + null.var(ddof=1) / n_runs))
        out.append({"exact": b.sessions[i].steps[k].delta, "estimate": est, "se": se})
    return out


_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def summarize(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, 95 % t half-width, n) over the finite values."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return float("nan"), float("nan"), 0
    m = sum(v) / len(v)
    if len(v) < 2:
        return m, float("nan"), len(v)
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))
    return m, _T975.get(len(v) - 1, 1.96) * sd / math.sqrt(len(v)), len(v)


def run(fc: FidelityConfig, tok: ChatTokenizer, cfg: CallCreditConfig | None = None) -> dict[str, Any]:
    """Every scenario × seed: held-in and held-out batches, five arms, three builders, three metrics."""
    cfg = cfg or CallCreditConfig()
    results: dict[tuple[str, str, str, str], dict[str, list[float]]] = {}
    extras: dict[str, Any] = {"omega": {}, "truth": [], "chains": {}, "calibrated": {}, "harness": {}, "vocab": {}}
    for scenario in fc.scenarios:
        for seed in fc.seeds:
            runner = SimulatorRunner(seed=seed)
            state = adapt_omega(scenario, seed, fc, cfg, runner)
            extras["omega"].setdefault(scenario, []).append(dict(state.omega))
            for split, vocabs, n_tasks in (("held-in", HELD_IN, fc.tasks_in), ("held-out", (HELD_OUT,), fc.tasks_out)):
                if n_tasks <= 0:
                    continue
                b = make_batch(scenario, seed, split, vocabs, n_tasks, fc.samples, tok, runner)
                arms, ms = arm_credits(b, cfg, runner, state.omega)
                extras["calibrated"].setdefault((scenario, split), []).append(len(ms))
                pm = b.trajectories["prefix_merging"]
                extras["chains"].setdefault((scenario, split), []).append(
                    sum(t.stats.chains for t in pm) / max(len(pm), 1)
                )
                for arm_name, arm in arms.items():
                    for builder in BUILDERS:
                        m = measure(b, arm, builder, cfg)
                        slot = results.setdefault((scenario, split, builder, arm_name), {k: [] for k in METRICS})
                        for key in METRICS:
                            slot[key].append(m[key])
                        for h, (nh, ns) in m["per_harness"].items():
                            cell = extras["harness"].setdefault((scenario, h, builder, arm_name), [0, 0])
                            cell[0] += nh
                            cell[1] += ns
                if split == "held-out":
                    extras["vocab"].setdefault(scenario, []).append(
                        vocabulary_check(scenario, seed, n_tasks, fc.samples, cfg)
                    )
                if split == "held-in" and fc.truth_calls > 0:
                    extras["truth"].extend(truth_check(b, runner, fc.truth_calls, fc.truth_runs, seed))
    return {"results": results, "extras": extras, "config": fc}


def _cell(values: Sequence[float]) -> str:
    m, h, n = summarize(values)
    if n == 0:
        return "      n/a      "
    if not math.isfinite(h):
        return f"{m:+.3f}        "
    return f"{m:+.3f} ± {h:.3f}"


def _harness_table(cells: dict[tuple[str, str, str, str], list[int]], fc: FidelityConfig) -> str:
    """Reward-hacking rate per harness vocabulary (held-in and held-out pooled over seeds: hacked/successful)."""
    arms = ("literal", "rules")
    cols = [(b, a) for a in arms for b in BUILDERS]
    head = "".join(f"{(ARM_LABELS[a].split(' ')[0] + ' ' + b)[:16]:>17}" for b, a in cols)
    lines = [f"reward-hacking rate per harness (hacked / successful sessions over {len(fc.seeds)} seeds)"]
    for scenario in fc.scenarios:
        harnesses = sorted({h for (sc, h, _, _) in cells if sc == scenario})
        if not harnesses:
            continue
        lines.append(f"{scenario:<16}{head}")
        for h in harnesses:
            row = ""
            for b, a in cols:
                nh, ns = cells.get((scenario, h, b, a), [0, 0])
                row += f"{(f'{nh / ns:.3f} ({nh}/{ns})' if ns else 'n/a'):>17}"
            lines.append(f"  {h:<14}{row}")
    return "\n".join(lines)


def format_table(out: dict[str, Any]) -> str:
    """The report: per scenario and vocabulary split, rows = builder × arm, columns = ρ, hack, irr+."""
    res = out["results"]
    fc: FidelityConfig = out["config"]
    ex = out["extras"]
    lines = [
        f"credit fidelity: {len(fc.seeds)} seeds, {fc.samples} samples per task, held-in {fc.tasks_in} tasks "
        f"({', '.join(HELD_IN)}), held-out {fc.tasks_out} tasks ({HELD_OUT}); mean ± 95% t-interval over seeds",
        "ρ = Spearman(credit, true effect δ) over all calls; hack = reward-hacking rate (metrics.reward_hacking: "
        "mean IG vs mean AE credit per call, 25% margin); hack Σ = the same on each role's summed credit (the old "
        "definition); irr+ = share of positive credit on irrelevant calls; (c0) = the seed's literal formula",
    ]
    header = f"{'builder':<15}{'arm':<25}{'ρ':^17}{'hack':^17}{'hack Σ':^17}{'irr+':^17}"
    for scenario in fc.scenarios:
        for split in ("held-in", "held-out"):
            if not any((scenario, split, b, a) in res for b in BUILDERS for a in ARMS):
                continue
            chains = summarize(ex["chains"].get((scenario, split), []))[0]
            ncal = summarize(ex["calibrated"].get((scenario, split), []))[0]
            lines += [
                "",
                f"== {scenario} / {split}  (prefix_merging chains per session: {chains:.2f}; "
                f"calibrated calls per batch: {ncal:.1f})",
                header,
            ]
            for builder in BUILDERS:
                for arm in ARMS:
                    slot = res.get((scenario, split, builder, arm))
                    if slot is None:
                        continue
                    cells = "".join(f"{_cell(slot[k]):^17}" for k in METRICS)
                    lines.append(f"{builder:<15}{ARM_LABELS[arm]:<25}{cells}")
    lines += ["", _harness_table(ex["harness"], fc)]
    for scenario, omegas in ex["omega"].items():
        mean = {r: sum(o[r] for o in omegas) / len(omegas) for r in omegas[0]}
        lines.append(
            f"ω after {fc.adapt_steps} co-evolution steps ({scenario}, mean over seeds): "
            + ", ".join(f"{r} {v:.3f}" for r, v in mean.items())
        )
    for scenario, checks in ex["vocab"].items():
        calls = sum(int(c["calls"]) for c in checks)
        lines.append(
            f"held-out sessions re-rendered in each held-in vocabulary ({scenario}, {calls} calls): "
            f"role differs in {sum(int(c['role_mismatch']) for c in checks)}, "
            f"max |Δ Â_v| = {max(float(c['max_abs_credit_diff']) for c in checks):.2e}"
        )
    if ex["truth"]:
        t = ex["truth"]
        err = [abs(x["estimate"] - x["exact"]) for x in t]
        within = sum(abs(x["estimate"] - x["exact"]) <= 2.576 * max(x["se"], 1e-9) for x in t)
        lines.append(
            f"ground truth through the runner ({len(t)} calls × {fc.truth_runs} runs per arm): mean |δ̂ − δ| = "
            f"{sum(err) / len(err):.4f}, within the 99% interval: {within}/{len(t)}"
        )
    return "\n".join(lines)
