# SPDX-License-Identifier: Apache-2.0
"""The simulator's `CounterfactualRunner`: its re-simulated δ agrees with the exact one, and it serves the
core's `calibrate()` (default `next_best`)."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from nemo_polar.credit import CallCreditConfig, CounterfactualRunner, annotate, assign, calibrate
from nemo_polar.credit.counterfactual import Alternative, CounterfactualRequest

from polar_lab.credit_sim.model import SCENARIOS, Model, Task
from polar_lab.credit_sim.records import session_records
from polar_lab.credit_sim.render import make_repo
from polar_lab.credit_sim.runner import SimulatorRunner

from .test_model import tiny


def _registered(model: Model, seed: int, n: int = 1, min_len: int = 1) -> tuple[SimulatorRunner, list, list]:
    runner = SimulatorRunner(seed=seed)
    rng = random.Random(seed)
    sessions, records = [], []
    while len(sessions) < n:
        s = model.sample(rng)
        if len(s.steps) < min_len:
            continue
        sid = f"r{seed}-{len(sessions)}"
        recs = session_records(s, make_repo(random.Random(seed), True), "claude_code", None, session_id=sid, seed=seed)
        runner.register(sid, model, s, [r.id for r in recs])
        sessions.append(s)
        records.append(recs)
    return runner, sessions, records


def _estimate(runner: SimulatorRunner, recs: list, k: int, runs: int) -> tuple[float, float]:
    arms = []
    for step in ({"replay": recs[k].id}, {"text": "(no action)"}):
        ys = [
            runner.simulate(
                CounterfactualRequest(recs[0].session_id, recs, k, recs[k].id, Alternative("plan", step), v)
            )[1]
            for v in range(runs)
        ]
        arms.append(ys)
    means = [sum(a) / runs for a in arms]
    var = sum(m * (1 - m) / runs for m in means)
    return means[0] - means[1], math.sqrt(var)


def test_runner_is_a_counterfactual_runner() -> None:
    assert isinstance(SimulatorRunner(), CounterfactualRunner)


def test_runner_delta_matches_exact_on_tiny_model() -> None:
    m = tiny()
    runner, sessions, records = _registered(m, seed=1, n=3, min_len=2)
    for s, recs in zip(sessions, records, strict=True):
        for k, st in enumerate(s.steps):
            est, se = _estimate(runner, recs, k, 1500)
            assert abs(est - st.delta) < 4 * se + 1e-9, (k, st.action, est, st.delta)


def test_runner_delta_matches_exact_on_a_scenario() -> None:
    m = Model(SCENARIOS["noisy"], Task(0.5, 1.0))
    runner, sessions, records = _registered(m, seed=2, n=1, min_len=6)
    s, recs = sessions[0], records[0]
    for k in range(min(len(s.steps), 6)):
        est, se = _estimate(runner, recs, k, 800)
        assert abs(est - s.steps[k].delta) < 4 * se + 1e-9, (k, s.steps[k].action, est, s.steps[k].delta)


def test_runner_refuses_a_plan_that_does_not_replay_the_recording() -> None:
    m = tiny()
    runner, _, records = _registered(m, seed=3, min_len=2)
    recs = records[0]
    with pytest.raises(ValueError):
        runner.simulate(
            CounterfactualRequest(recs[0].session_id, recs, 1, recs[1].id, Alternative("plan", {"replay": recs[0].id}))
        )
    with pytest.raises(KeyError):
        runner.simulate(CounterfactualRequest("nobody", recs, 0, recs[0].id, Alternative("plan", {"text": "x"})))


def test_next_best_differs_from_the_recorded_action() -> None:
    m = Model(SCENARIOS["basic"], Task(0.5, 1.0))
    runner, sessions, records = _registered(m, seed=4, min_len=3)
    s, recs = sessions[0], records[0]
    for k, st in enumerate(s.steps):
        for v in range(20):
            req = CounterfactualRequest(recs[0].session_id, recs, k, recs[k].id, Alternative("next_best", None, v), v)
            assert runner.simulate(req)[0] != st.action


def test_calibrate_through_the_runner() -> None:
    m = Model(SCENARIOS["basic"], Task(0.8, 1.0))
    runner, sessions, records = _registered(m, seed=5, n=8, min_len=2)
    cfg = CallCreditConfig.model_validate({"counterfactual": {"budget": 8}})  # calibration is off by default
    graphs = [annotate(r, harness="claude_code") for r in records]
    rewards = [s.reward for s in sessions]
    out = assign(graphs, rewards, cfg)
    before = [a.credit.clone() for a in out]
    ms = asyncio.run(calibrate(graphs, out, records, runner, cfg.counterfactual))
    n_success = sum(1 for r in rewards if r >= 1.0)
    assert len(ms) == min(n_success, cfg.counterfactual.budget) or n_success == 0
    for meas in ms:
        assert meas.role == "AE" and meas.outcome.metadata["runner"] == "simulator"
        t, k = meas.trajectory, meas.call_index
        assert out[t].calibrated[k] == meas.delta
        if out[t].advantage != 0 and meas.delta != 0.5:
            assert float(out[t].credit[k]) != float(before[t][k])


@pytest.mark.parametrize("select", ["credit", "uncertain"])
def test_second_best_is_the_most_likely_other_action(select: str) -> None:
    m = Model(SCENARIOS["basic"], Task(0.8, 1.0))
    runner, sessions, records = _registered(m, seed=5, n=8, min_len=2)
    cfg = CallCreditConfig.model_validate(
        {"counterfactual": {"budget": 8, "alternative": "second_best", "select": select}}
    )
    graphs = [annotate(r, harness="claude_code") for r in records]
    out = assign(graphs, [s.reward for s in sessions], cfg)
    ms = asyncio.run(calibrate(graphs, out, records, runner, cfg.counterfactual, apply=False))
    assert ms, "no successful session to calibrate"
    for meas in ms:
        step = sessions[meas.trajectory].steps[meas.call_index]
        ranked = sorted(m.policy(step.state), key=lambda ap: -ap[1])
        expected = next(a for a, _ in ranked if a != step.action)
        assert meas.outcome.action == {"simulated_action": expected}
