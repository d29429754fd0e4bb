# SPDX-License-Identifier: Apache-2.0
"""The simulator's structural causal model (docs/credit_sim_model.md §1–3, §5): state, policy, transitions,
exact values and the ground-truth interventional effect of each call.

Abstract only: actions are types (`READ_REL`, `EDIT_FIX`, …); `render.py` turns them into a harness's tool calls
and `records.py` into `CompletionRecord`s. Values are exact (dynamic programming over the finite state, memoised
per scenario, task and skill), never sampled. This module knows nothing of CALL-CREDIT.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

__all__ = [
    "ACTIONS",
    "IRRELEVANT",
    "SCENARIOS",
    "Model",
    "Scenario",
    "SimSession",
    "SkillParams",
    "State",
    "Step",
    "Task",
    "Weights",
    "draw_task",
]

ACTIONS = (
    "SEARCH",
    "LIST",
    "READ_REL",
    "READ_IRR",
    "EDIT_FIX",
    "EDIT_WRONG",
    "EDIT_DIST",
    "TEST",
    "REVERT",
    "SUBMIT",
    "NULL",
)
IRRELEVANT = frozenset({"LIST", "READ_IRR", "EDIT_DIST"})


@dataclass(frozen=True, slots=True)
class SkillParams:
    """What the hidden skill changes: irrelevant-read weight, chance a read-informed edit is right, hidden tests."""

    w_irr: float
    p_fix: float
    h: float


@dataclass(frozen=True, slots=True)
class Weights:
    """The policy's unnormalised weights (§3); scenario-independent defaults."""

    search: float = 1.0
    list: float = 0.2
    read_rel: float = 2.0
    edit_read: float = 2.0
    test_pending: float = 1.5
    test_other: float = 0.1
    revert: float = 3.0
    submit_pass: float = 4.0
    submit_pending: float = 0.4
    submit_failed: float = 0.2
    submit_none: float = 0.02


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    low: SkillParams
    high: SkillParams
    w_blind: float
    w_dist: float
    p_high: float = 0.5
    t_max: int = 12
    weights: Weights = field(default_factory=Weights)


SCENARIOS: dict[str, Scenario] = {
    "basic": Scenario("basic", SkillParams(0.4, 0.75, 0.9), SkillParams(0.4, 0.75, 0.9), 0.5, 0.15),
    "confounded": Scenario("confounded", SkillParams(0.2, 0.5, 0.6), SkillParams(1.5, 0.9, 0.95), 0.5, 0.15),
    "noisy": Scenario("noisy", SkillParams(0.8, 0.5, 0.9), SkillParams(0.8, 0.5, 0.9), 1.0, 0.6),
}


@dataclass(frozen=True, slots=True)
class Task:
    """One GRPO group's task parameters (§1)."""

    p_mention: float
    difficulty: float


def draw_task(rng: random.Random) -> Task:
    return Task(rng.choice((0.2, 0.5, 0.8)), rng.choice((1.0, 0.8)))


@dataclass(frozen=True, slots=True)
class State:
    """s_t = (t, located, read, edit ∈ {none, ok, bad}, tested, skill)."""

    t: int
    located: bool
    read: bool
    edit: str
    tested: bool
    high: bool


@dataclass(slots=True)
class Step:
    """One call: the state before it, the concrete action, and its exact effect δ (filled by `Model.effects`)."""

    state: State
    action: str
    delta: float = 0.0


@dataclass(slots=True)
class SimSession:
    """One sampled session: its steps, skill, hidden-test draw and outcome Y."""

    task: Task
    high: bool
    steps: list[Step]
    hidden_pass: bool
    reward: float


class Model:
    """Policy, transitions and exact values for one scenario and task."""

    def __init__(self, scenario: Scenario, task: Task):
        self.sc = scenario
        self.task = task
        self._v: dict[State, float] = {}

    def skill(self, high: bool) -> SkillParams:
        return self.sc.high if high else self.sc.low

    def initial(self, located: bool, high: bool) -> State:
        return State(0, located, False, "none", False, high)

    def policy(self, s: State) -> list[tuple[str, float]]:
        """π(a | s) over concrete actions (`EDIT_R` already resolved into EDIT_FIX / EDIT_WRONG)."""
        w, sk = self.sc.weights, self.skill(s.high)
        out: list[tuple[str, float]] = []
        if not s.located:
            out.append(("SEARCH", w.search))
        out.append(("LIST", w.list))
        if s.located and not s.read:
            out.append(("READ_REL", w.read_rel))
        out.append(("READ_IRR", sk.w_irr))
        if s.located and s.edit == "none":
            w_edit = w.edit_read if s.read else self.sc.w_blind
            p_fix = (sk.p_fix * self.task.difficulty) if s.read else 0.0
            out.append(("EDIT_FIX", w_edit * p_fix))
            out.append(("EDIT_WRONG", w_edit * (1.0 - p_fix)))
        out.append(("EDIT_DIST", self.sc.w_dist))
        pending = s.edit != "none" and not s.tested
        out.append(("TEST", w.test_pending if pending else w.test_other))
        failed = s.tested and s.edit == "bad"
        if failed:
            out.append(("REVERT", w.revert))
        if s.tested and s.edit == "ok":
            ws = w.submit_pass
        elif pending:
            ws = w.submit_pending
        elif failed:
            ws = w.submit_failed
        else:
            ws = w.submit_none
        out.append(("SUBMIT", ws))
        total = sum(x for _, x in out)
        return [(a, x / total) for a, x in out if x > 0]

    def apply(self, s: State, a: str) -> State:
        """The state after action `a` (SUBMIT is handled by the caller: it ends the session)."""
        t = s.t + 1
        if a == "SEARCH":
            return replace(s, t=t, located=True)
        if a == "READ_REL":
            return replace(s, t=t, read=True)
        if a == "EDIT_FIX":
            return replace(s, t=t, edit="ok", tested=False)
        if a == "EDIT_WRONG":
            return replace(s, t=t, edit="bad", tested=False)
        if a == "TEST":
            return replace(s, t=t, tested=True)
        if a == "REVERT":
            return replace(s, t=t, edit="none", tested=False)
        return replace(s, t=t)  # LIST, READ_IRR, EDIT_DIST, NULL

    def terminal(self, s: State) -> float:
        """E[Y] when the session ends in `s`: 1[edit = ok] · h(skill)."""
        return self.skill(s.high).h if s.edit == "ok" else 0.0

    def value(self, s: State) -> float:
        """V(s) = Σ_a π(a|s) Q(s, a), exactly."""
        v = self._v.get(s)
        if v is None:
            if s.t >= self.sc.t_max:
                v = self.terminal(s)
            else:
                v = sum(p * self.q(s, a) for a, p in self.policy(s))
            self._v[s] = v
        return v

    def q(self, s: State, a: str) -> float:
        """Q(s, a) = E[Y | s, do(A = a)], the rest resampled."""
        if a == "SUBMIT":
            return self.terminal(s)
        return self.value(self.apply(s, a))

    def effect(self, s: State, a: str) -> float:
        """δ = Q(s, a) − Q(s, NULL): the call as made versus the same step spent on a reply with no action."""
        return self.q(s, a) - self.q(s, "NULL")

    def effects(self, session: SimSession) -> list[float]:
        for st in session.steps:
            st.delta = self.effect(st.state, st.action)
        return [st.delta for st in session.steps]

    # -- sampling ---------------------------------------------------------------------------------------------

    def sample_action(self, s: State, rng: random.Random) -> str:
        r = rng.random()
        acc = 0.0
        pol = self.policy(s)
        for a, p in pol:
            acc += p
            if r < acc:
                return a
        return pol[-1][0]

    def rollout(self, s: State, rng: random.Random, first: str | None = None) -> tuple[list[Step], State, bool]:
        """Continue from `s` (optionally forcing the first action); returns (steps, final state, submitted)."""
        steps: list[Step] = []
        a = first
        while s.t < self.sc.t_max:
            if a is None:
                a = self.sample_action(s, rng)
            steps.append(Step(s, a))
            if a == "SUBMIT":
                return steps, s, True
            s = self.apply(s, a)
            a = None
        return steps, s, False

    def outcome(self, final: State, rng: random.Random) -> tuple[bool, float]:
        hidden = rng.random() < self.skill(final.high).h
        return hidden, 1.0 if (final.edit == "ok" and hidden) else 0.0

    def sample(self, rng: random.Random, *, high: bool | None = None) -> SimSession:
        """One session: skill, start state, the agent's calls, the hidden tests and Y; effects filled in."""
        if high is None:
            high = rng.random() < self.sc.p_high
        located = rng.random() < self.task.p_mention
        steps, final, _ = self.rollout(self.initial(located, high), rng)
        hidden, y = self.outcome(final, rng)
        sess = SimSession(self.task, high, steps, hidden, y)
        self.effects(sess)
        return sess
