# SPDX-License-Identifier: Apache-2.0
"""`SimulatorRunner`: the simulator's `CounterfactualRunner` (the core's protocol), re-simulating from call k.

It serves `calibrate()` and the ground-truth cross-check (docs/credit_sim_model.md §5). For a request it builds
the plan exactly as the core prescribes (`counterfactual.replay_plan`): the `{"replay": id}` steps must name the
session's recorded calls before k, in order; the substituted step is then played in the simulator's state s_k:

- `{"replay": record_id}` of call k itself (alternative `plan`): the call as recorded;
- `{"text": …}` (alternative `plan`): a reply with no action (`NULL`);
- `{"next_best": {"seed", "exclude_record"}}` (the core's default): n = 4 seeded samples from the agent's policy in
  s_k, the first that differs from the recorded action (`NULL` if none does);
- `{"second_best": {"exclude_record"}}`: the policy's most likely action in s_k other than the recorded one;

followed by live continuation (the agent's policy), and the reward is drawn from the structural equations. It is
the simulator's runner, not the rollout service's: sessions are looked up by `session_id` in the simulator's own
registry, never replayed through a proxy.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_polar.credit.counterfactual import CounterfactualOutcome, CounterfactualRequest, replay_plan

from .model import Model, SimSession

__all__ = ["SimulatorRunner"]


@dataclass(slots=True)
class _Entry:
    model: Model
    session: SimSession
    record_ids: list[str]


class SimulatorRunner:
    """Re-simulates a registered session from call k with a substituted action (see the module docstring)."""

    def __init__(self, seed: int = 0, n_next_best: int = 4):
        self.seed = seed
        self.n_next_best = n_next_best
        self._sessions: dict[str, _Entry] = {}
        self.calls = 0

    def register(self, session_id: str, model: Model, session: SimSession, record_ids: list[str]) -> None:
        if len(record_ids) != len(session.steps):
            raise ValueError(f"{session_id}: {len(record_ids)} records for {len(session.steps)} simulated calls")
        self._sessions[session_id] = _Entry(model, session, list(record_ids))

    def _rng(self, request: CounterfactualRequest, extra: str = "") -> random.Random:
        key = f"{self.seed}|{request.session_id}|{request.call_index}|{request.variant}|{request.alternative.seed}|{extra}"
        return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))

    def substitute(self, request: CounterfactualRequest, step: Mapping[str, Any], rng: random.Random) -> str:
        """The simulator action that plays the plan's substituted step at call k."""
        e = self._sessions[request.session_id]
        k = request.call_index
        recorded = e.session.steps[k]
        if "replay" in step:
            if step["replay"] != e.record_ids[k]:
                raise ValueError("a replay step at k must name call k's own record")
            return recorded.action
        if "text" in step:
            return "NULL"
        if "second_best" in step:
            # the model's second-most-likely output: the most likely action of the policy in s_k other than the
            # recorded one (the simulator's analogue of the second-ranked first token, then greedy)
            ranked = sorted(e.model.policy(recorded.state), key=lambda ap: -ap[1])
            return next((a for a, _ in ranked if a != recorded.action), "NULL")
        if "next_best" in step:
            for _ in range(self.n_next_best):
                a = e.model.sample_action(recorded.state, rng)
                if a != recorded.action:
                    return a
            return "NULL"
        raise ValueError(f"the simulator's runner cannot play step {dict(step)!r}")

    def simulate(self, request: CounterfactualRequest, extra: str = "") -> tuple[str, float]:
        """(substituted action, R(τ′)) for one request."""
        e = self._sessions.get(request.session_id)
        if e is None:
            raise KeyError(f"session {request.session_id} is not registered with the simulator's runner")
        plan = replay_plan(request.records, request.record_id, request.alternative)
        steps = plan["steps"]
        k = request.call_index
        replayed = [s["replay"] for s in steps[:-2]]
        if replayed != e.record_ids[:k] or e.record_ids[k] != request.record_id:
            raise ValueError(f"{request.session_id}: the plan does not replay the recorded calls before {k}")
        rng = self._rng(request, extra)
        action = self.substitute(request, steps[-2], rng)
        state = e.session.steps[k].state
        _, final, _ = e.model.rollout(state, rng, first=action)
        _, reward = e.model.outcome(final, rng)
        self.calls += 1
        return action, reward

    async def run(self, request: CounterfactualRequest) -> CounterfactualOutcome:
        action, reward = self.simulate(request)
        return CounterfactualOutcome(
            reward=reward, action={"simulated_action": action}, metadata={"runner": "simulator"}
        )
