# SPDX-License-Identifier: Apache-2.0
"""FAKE (the rollout service's replay does not exist yet): an in-process `CounterfactualRunner`.

It executes a session against a tiny in-memory workspace: `Edit` calls apply `old_string → new_string` to
files (a non-matching `old_string` fails, as Claude Code's Edit does), `Write` replaces a file, other tools
change nothing. It follows `counterfactual.replay_plan`: the recorded calls before k are replayed as
recorded, the alternative is applied at k, and "continue live" is played by a deterministic stand-in policy
that repeats the recorded later actions. `next_best` draws `n` candidate edits with a seeded RNG from a
candidate pool and keeps the first that differs from the recorded action (the pool stands in for the
model's samples). The reward is the evaluator's: 1.0 if `check(files)` holds, else 0.0.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nemo_polar.credit.counterfactual import CounterfactualOutcome, CounterfactualRequest, replay_plan

from nemo_polar.types import CompletionRecord


def _action_of(rec: CompletionRecord) -> tuple[str, dict[str, Any]] | None:
    calls = rec.response.get("tool_calls") or []
    if not calls:
        return None
    fn = calls[0]["function"]
    return fn["name"], json.loads(fn["arguments"])


def apply_action(files: dict[str, str], tool: str, args: Mapping[str, Any]) -> None:
    if tool == "Edit":
        path = args["file_path"]
        text = files.get(path, "")
        if args["old_string"] in text:
            files[path] = text.replace(args["old_string"], args["new_string"], 1)
    elif tool == "Write":
        files[args["file_path"]] = args["content"]


class InProcessRunner:
    """FAKE runner over an in-memory workspace (see the module docstring)."""

    def __init__(
        self,
        initial: Mapping[str, str],
        check: Callable[[Mapping[str, str]], bool],
        candidates: Sequence[dict[str, Any]] = (),
        n: int = 4,
    ):
        self.initial = dict(initial)
        self.check = check
        self.candidates = list(candidates)
        self.n = n
        self.plans: list[dict[str, Any]] = []
        self.replayed: list[list[CompletionRecord]] = []

    def reward_of(self, records: Sequence[CompletionRecord]) -> float:
        files = dict(self.initial)
        for r in sorted(records, key=lambda x: x.seq):
            act = _action_of(r)
            if act:
                apply_action(files, *act)
        return 1.0 if self.check(files) else 0.0

    async def run(self, request: CounterfactualRequest) -> CounterfactualOutcome:
        plan = replay_plan(request.records, request.record_id, request.alternative)
        self.plans.append(plan)
        by_id = {r.id: r for r in request.records}
        main = sorted((r for r in request.records if r.call_kind == "main"), key=lambda r: r.seq)
        files = dict(self.initial)
        replayed = []
        for step in plan["steps"]:
            if "replay" in step:
                rec = by_id[step["replay"]]
                replayed.append(rec)
                act = _action_of(rec)
                if act:
                    apply_action(files, *act)
            elif "tool" in step:
                apply_action(files, step["tool"], step["arguments"])
                chosen = {"tool": step["tool"], "arguments": step["arguments"]}
            elif "next_best" in step:
                original = _action_of(by_id[step["next_best"]["exclude_record"]])
                rng = random.Random(step["next_best"]["seed"])
                pool = [rng.choice(self.candidates) for _ in range(self.n)] if self.candidates else []
                differing = [c for c in pool if (c["tool"], c["arguments"]) != original]
                if not differing:
                    raise RuntimeError("no non-identical sample")
                chosen = differing[0]
                apply_action(files, chosen["tool"], chosen["arguments"])
            elif step.get("live"):
                k = len(replayed)
                for rec in main[k + 1 :]:  # the stand-in policy repeats the recorded later actions
                    act = _action_of(rec)
                    if act:
                        apply_action(files, *act)
        self.replayed.append(replayed)
        action = {
            "content": "",
            "tool_calls": [
                {
                    "id": "cf",
                    "type": "function",
                    "function": {"name": chosen["tool"], "arguments": json.dumps(chosen["arguments"])},
                }
            ],
        }
        return CounterfactualOutcome(reward=1.0 if self.check(files) else 0.0, action=action, token_ids=[7, 7, 7])
