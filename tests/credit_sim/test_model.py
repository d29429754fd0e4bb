# SPDX-License-Identifier: Apache-2.0
"""The simulator's ground truth against hand computation on a tiny model, and the structural claims of
docs/credit_sim_model.md §5 over every state of the shipped scenarios."""

from __future__ import annotations

import itertools
import random

import pytest

from polar_lab.credit_sim.model import IRRELEVANT, SCENARIOS, Model, Scenario, SkillParams, State, Task, Weights

# A tiny model: two calls, the agent starts located; it may read R, read an irrelevant file, or edit R
# (blind edits are always wrong); a read-informed edit is right half the time; hidden tests pass with 0.8.
TINY_W = Weights(
    search=0.0, list=0.0, read_rel=1.0, edit_read=1.0, test_pending=0.0, test_other=0.0, revert=0.0,
    submit_pass=0.0, submit_pending=0.0, submit_failed=0.0, submit_none=0.0,
)  # fmt: skip
TINY_SKILL = SkillParams(w_irr=1.0, p_fix=0.5, h=0.8)
TINY = Scenario("tiny", TINY_SKILL, TINY_SKILL, w_blind=1.0, w_dist=0.0, t_max=2, weights=TINY_W)


def tiny() -> Model:
    return Model(TINY, Task(p_mention=1.0, difficulty=1.0))


def test_tiny_policy_by_hand() -> None:
    m = tiny()
    s0 = m.initial(located=True, high=False)
    assert dict(m.policy(s0)) == pytest.approx({"READ_REL": 1 / 3, "READ_IRR": 1 / 3, "EDIT_WRONG": 1 / 3})
    s_read = State(1, True, True, "none", False, False)
    assert dict(m.policy(s_read)) == pytest.approx({"READ_IRR": 0.5, "EDIT_FIX": 0.25, "EDIT_WRONG": 0.25})


def test_tiny_ground_truth_by_hand() -> None:
    m = tiny()
    s0 = m.initial(located=True, high=False)
    # after reading R (t=1): the last call fixes with prob 1/4, then the hidden tests pass with 0.8 → 0.2
    s_read = State(1, True, True, "none", False, False)
    assert m.value(s_read) == pytest.approx(0.25 * 0.8)
    # without the read nothing can succeed in the remaining call
    assert m.value(State(1, True, False, "none", False, False)) == 0.0
    assert m.value(s0) == pytest.approx(0.2 / 3)
    assert m.effect(s0, "READ_REL") == pytest.approx(0.2)
    assert m.effect(s0, "READ_IRR") == 0.0
    assert m.effect(s0, "EDIT_WRONG") == 0.0  # nothing could have been fixed anyway
    assert m.effect(s_read, "EDIT_FIX") == pytest.approx(0.8)
    assert m.effect(s_read, "EDIT_WRONG") == 0.0
    # with two calls left after the read: fixing now beats the NULL step (which leaves one try at 1/4)
    s_read0 = State(0, True, True, "none", False, False)
    assert m.value(State(1, True, True, "ok", False, False)) == pytest.approx(0.8)
    assert m.effect(s_read0, "EDIT_FIX") == pytest.approx(0.8 - 0.2)
    assert m.effect(s_read0, "EDIT_WRONG") == pytest.approx(0.0 - 0.2)
    assert m.effect(s_read0, "READ_IRR") == 0.0


def test_tiny_value_matches_monte_carlo() -> None:
    m = tiny()
    rng = random.Random(7)
    n = 6000
    ys = [m.sample(rng).reward for _ in range(n)]
    mean = sum(ys) / n
    se = (mean * (1 - mean) / n) ** 0.5
    assert abs(mean - 0.2 / 3) < 4 * se
    # the recorded effects of sampled sessions are the exact ones
    s = m.sample(random.Random(3))
    assert [st.delta for st in s.steps] == [m.effect(st.state, st.action) for st in s.steps]


def _all_states(sc: Scenario) -> list[State]:
    out = []
    for t, loc, read, edit, tested, high in itertools.product(
        range(sc.t_max), (False, True), (False, True), ("none", "ok", "bad"), (False, True), (False, True)
    ):
        out.append(State(t, loc, read, edit, tested, high))
    return out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_structural_signs_in_every_state(name: str) -> None:
    sc = SCENARIOS[name]
    for task in (Task(0.2, 1.0), Task(0.8, 0.8)):
        m = Model(sc, task)
        for s in _all_states(sc):
            pol = dict(m.policy(s))
            assert sum(pol.values()) == pytest.approx(1.0)
            for a in pol:
                d = m.effect(s, a)
                if a in IRRELEVANT:
                    assert d == 0.0, (s, a)
                elif a == "EDIT_WRONG":
                    assert d <= 1e-12, (s, a, d)
                elif a in ("READ_REL", "SEARCH", "EDIT_FIX", "REVERT"):
                    assert d >= -1e-12, (s, a, d)
            if not s.read:
                assert pol.get("EDIT_FIX", 0.0) == 0.0  # the fix works only if R was read


def test_confounded_skill_raises_irrelevant_reads_and_success() -> None:
    sc = SCENARIOS["confounded"]
    m = Model(sc, Task(0.5, 1.0))
    lo, hi = m.initial(True, False), m.initial(True, True)
    assert dict(m.policy(hi))["READ_IRR"] > dict(m.policy(lo))["READ_IRR"]
    assert m.value(hi) > m.value(lo)
    basic = Model(SCENARIOS["basic"], Task(0.5, 1.0))
    assert basic.value(basic.initial(True, True)) == basic.value(basic.initial(True, False))
