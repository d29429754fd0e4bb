# SPDX-License-Identifier: Apache-2.0
"""The simulator's causal model is frozen (docs/credit_sim_model.md): a hash per scenario of everything the model
decides — its parameters, the policy π(a|s), the exact value V(s) and every effect δ over every state of every task
— must not change. A new scenario may be added (it gets its own pinned hash); an existing one may not be edited.

If this test fails, the model changed: revert the change, or add the variant as a new, dated scenario (and a new
section of docs/credit_sim_model.md) with its own entry here."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json

from polar_lab.credit_sim.model import ACTIONS, IRRELEVANT, SCENARIOS, Model, Scenario, State, Task

# sha256 of `fingerprint(scenario)`; pinned when the scenario was added
PINNED = {
    "basic": "c098540e020bfd356eb985cdf23f0bb00e345c04778f6837560c379857eace99",
    "confounded": "f053f0b699137b0706f75d4d7e70ceb00160c8a9e28a0bf7584a23e4de1282d2",
    "noisy": "89b64e4f211cc1aae2eb2811946ecf253de1e82b7154dc204e00117afbdba62c",
}
TASKS = [Task(p, d) for p in (0.2, 0.5, 0.8) for d in (1.0, 0.8)]  # the grid `draw_task` draws from


def _num(x: float) -> str:
    return f"{x:.10e}"  # 11 significant digits: exact DP, robust to the last bits


def fingerprint(sc: Scenario) -> str:
    """sha256 over the scenario's parameters, the action set and, per task and state, π(·|s), V(s) and δ(s, a)."""
    doc: dict[str, object] = {
        "scenario": json.loads(json.dumps(dataclasses.asdict(sc))),
        "actions": list(ACTIONS),
        "irrelevant": sorted(IRRELEVANT),
        "tasks": [],
    }
    for task in TASKS:
        m = Model(sc, task)
        rows = []
        for t, located, read, edit, tested, high in itertools.product(
            range(sc.t_max + 1), (False, True), (False, True), ("none", "ok", "bad"), (False, True), (False, True)
        ):
            s = State(t, located, read, edit, tested, high)
            pol = m.policy(s) if t < sc.t_max else []
            rows.append(
                [
                    [t, located, read, edit, tested, high],
                    _num(m.value(s)),
                    [[a, _num(p), _num(m.effect(s, a))] for a, p in pol],
                ]
            )
        doc["tasks"].append({"task": dataclasses.asdict(task), "states": rows})  # type: ignore[union-attr]
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def test_every_scenario_is_pinned() -> None:
    assert set(PINNED) == set(SCENARIOS), "a new scenario needs its hash in PINNED (an existing one stays)"


def test_frozen_causal_model() -> None:
    got = {name: fingerprint(sc) for name, sc in SCENARIOS.items()}
    changed = {name: got[name] for name in PINNED if got.get(name) != PINNED[name]}
    assert not changed, f"the frozen causal model changed for {sorted(changed)}: {changed}"


def test_fingerprint_sees_a_change() -> None:
    sc = SCENARIOS["basic"]
    edited = dataclasses.replace(sc, w_dist=sc.w_dist + 0.01)
    assert fingerprint(edited) != fingerprint(sc)
    weights = dataclasses.replace(sc.weights, revert=sc.weights.revert * 2)
    assert fingerprint(dataclasses.replace(sc, weights=weights)) != fingerprint(sc)
