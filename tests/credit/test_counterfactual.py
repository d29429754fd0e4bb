# SPDX-License-Identifier: Apache-2.0
"""Counterfactual calibration with an in-process runner (the rollout-service runner comes later), DPO pairs,
IG damping and the RV self-correction reward."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from nemo_polar.credit import (
    CounterfactualRunner,
    annotate,
    assign,
    calibrate,
    dpo_pairs,
    rv_rewards,
    sampling_weights,
    select_calls,
    write_dpo_jsonl,
)
from nemo_polar.credit.config import CallCreditConfig, CounterfactualConfig, CurationConfig
from nemo_polar.credit.counterfactual import Alternative, CounterfactualOutcome, CounterfactualRequest, replay_plan

from .cf_runner import InProcessRunner
from .sessions import bugfix_steps, make_session, synthetic_graph

SRC = "/repo/src/utils/dates.py"
INITIAL = {SRC: "def parse_date(s):\n    return datetime.datetime.strptime(s, FMT).date()\n"}


def fixed(files: dict[str, str]) -> bool:
    return ".strip()" in files.get(SRC, "")


def _batch() -> tuple[list, list, list]:
    good = make_session(bugfix_steps(), session_id="good")
    bad_steps = [s for s in bugfix_steps() if s[0] != "Edit"]  # never edits: fails
    bad = make_session(bad_steps, session_id="bad")
    runner = InProcessRunner(INITIAL, fixed)
    rewards = [runner.reward_of(good), runner.reward_of(bad)]
    assert rewards == [1.0, 0.0]
    graphs = [annotate(r, harness="claude_code") for r in (good, bad)]
    return graphs, rewards, [good, bad]


def test_runner_satisfies_the_protocol() -> None:
    assert isinstance(InProcessRunner(INITIAL, fixed), CounterfactualRunner)


def test_replay_plan_replays_recorded_calls_then_substitutes() -> None:
    recs = make_session(bugfix_steps())
    step = {"tool": "Edit", "arguments": {"file_path": SRC, "old_string": "x", "new_string": "y"}}
    plan = replay_plan(recs, recs[4].id, Alternative("plan", step))
    assert plan["steps"][:4] == [{"replay": r.id} for r in recs[:4]]
    assert plan["steps"][4] == step and plan["steps"][5] == {"live": True}
    nb = replay_plan(recs, recs[4].id, Alternative("next_best", seed=3))
    assert nb["steps"][4] == {"next_best": {"seed": 3, "exclude_record": recs[4].id}}
    with pytest.raises(ValueError):
        replay_plan(recs, "nope", Alternative("plan", step))


def test_replay_plan_inline_records_and_recorded_continuation() -> None:
    recs = make_session(bugfix_steps())
    step = {"tool": "Edit", "arguments": {"file_path": SRC, "old_string": "x", "new_string": "y"}}
    plan = replay_plan(recs, recs[4].id, Alternative("plan", step, then="recorded"), inline=True)
    assert [s.get("replay") for s in plan["steps"]] == [r.id for r in recs[:4]] + [None] + [r.id for r in recs[5:]] + [
        None
    ]
    assert plan["steps"][4] == step and plan["steps"][-1] == {"live": True}
    first = plan["steps"][0]["record"]
    assert first["generation_token_ids"] == recs[0].generation_token_ids and first["response"] == recs[0].response
    nb = replay_plan(recs, recs[4].id, Alternative("next_best", seed=2, n=3, temperature=0.5), inline=True)
    assert nb["steps"][4]["next_best"] == {
        "seed": 2,
        "exclude_record": recs[4].id,
        "n": 3,
        "temperature": 0.5,
        "exclude_response": recs[4].response,
    }
    with pytest.raises(ValueError):
        replay_plan(recs, recs[4].id, Alternative("plan", step, then="later"))


def test_selection_within_budget() -> None:
    graphs, rewards, _ = _batch()
    assigns = assign(graphs, rewards)
    cfg = CounterfactualConfig(budget=5, max_per_trajectory=2)
    chosen = select_calls(graphs, assigns, cfg)
    assert chosen and all(t == 0 for t, _ in chosen)  # only the successful trajectory
    assert {k for _, k in chosen} == {4, 6}  # its two AE calls, highest credit first
    assert float(assigns[0].credit[chosen[0][1]]) >= float(assigns[0].credit[chosen[1][1]])
    assert len(select_calls(graphs, assigns, cfg.model_copy(update={"budget": 1}))) == 1
    failing = [synthetic_graph(["IG", "AE"], [(0, 1)], session_id=f"f{i}") for i in range(2)]
    fa = assign(failing, [0.0, 1.0])
    assert select_calls(failing, fa, cfg) == [(1, 1)]
    assert set(select_calls(failing, fa, cfg.model_copy(update={"only_successful": False}))) == {(0, 1), (1, 1)}


def test_plan_alternative_wrong_decisive_edit_gives_delta_one_and_moves_credit() -> None:
    graphs, rewards, records = _batch()
    assigns = assign(graphs, rewards)
    before = assigns[0].credit.clone()
    wrong = {
        "tool": "Edit",
        "arguments": {"file_path": SRC, "old_string": "strptime(s, FMT)", "new_string": "strptime(s, FMT2)"},
    }
    noop = {"tool": "Edit", "arguments": {"file_path": SRC, "old_string": "zzz", "new_string": "zzz"}}
    runner = InProcessRunner(INITIAL, fixed)
    cfg = CounterfactualConfig(alternative="plan", budget=4, max_per_trajectory=2)
    ms = asyncio.run(calibrate(graphs, assigns, records, runner, cfg, plans={(0, 4): wrong, (0, 6): noop}))
    deltas = {m.call_index: m.delta for m in ms}
    assert deltas == {4: 1.0, 6: 0.0}
    # replayed prompts are the recorded ones, call for call
    for plan, replayed in zip(runner.plans, runner.replayed, strict=True):
        k = len([s for s in plan["steps"] if "replay" in s])
        assert [r.id for r in replayed] == [r.id for r in records[0][:k]]
        assert [r.prompt_token_ids for r in replayed] == [r.prompt_token_ids for r in records[0][:k]]
    after = assigns[0].credit
    assert float(after[4]) == pytest.approx(float(before[4]) * 1.5)  # scale: 1 + β(Δ − δ₀) = 1.5
    assert float(after[6]) == pytest.approx(float(before[6]) * 0.5)
    assert torch.equal(after[:4], before[:4])
    assert assigns[0].calibrated == {4: 1.0, 6: 0.0}
    # the factors follow the calibrated credit, so factor-based metrics (reward hacking) see the calibration
    torch.testing.assert_close(assigns[0].factor * assigns[0].advantage, after)


def test_correction_modes() -> None:
    g = synthetic_graph(["IG", "AE"], [(0, 1)])
    for mode, expect in (
        ("replace", lambda a: a.advantage * a.scale * 1.0),
        ("additive", lambda a: float(a.credit[1]) + abs(a.advantage)),
    ):
        a = assign([g, g], [1.0, 0.0])[0]
        from nemo_polar.credit.counterfactual import corrected_credit

        assert corrected_credit(a, 1, 1.0, CounterfactualConfig(mode=mode)) == pytest.approx(expect(a))


def test_next_best_uses_seeded_sampling() -> None:
    graphs, rewards, records = _batch()
    cfg = CounterfactualConfig(alternative="next_best", budget=1, seed=11)
    [(t, k)] = select_calls(graphs, assign(graphs, rewards), cfg)
    assert graphs[t].nodes[k].role == "AE"
    recorded = json.loads(records[t][k].response["tool_calls"][0]["function"]["arguments"])
    candidates = [
        {"tool": "Edit", "arguments": recorded},  # identical to the recorded call: never chosen
        {"tool": "Edit", "arguments": {"file_path": SRC, "old_string": "(s, FMT)", "new_string": "(s.strip(), FMT)"}},
        {"tool": "Edit", "arguments": {"file_path": SRC, "old_string": "(s, FMT)", "new_string": "(s, 'x')"}},
    ]

    def run(seed: int) -> list:
        runner = InProcessRunner(INITIAL, fixed, candidates=candidates)
        assigns = assign(graphs, rewards)
        return asyncio.run(
            calibrate(graphs, assigns, records, runner, cfg.model_copy(update={"seed": seed}), k_variants=3)
        )

    a, b = run(11), run(11)
    assert [m.outcome.action for m in a] == [m.outcome.action for m in b]  # same seed, same samples
    assert len(a) == 3 and [m.variant for m in a] == [0, 1, 2]
    for m in a:
        args = json.loads(m.outcome.action["tool_calls"][0]["function"]["arguments"])
        assert args != recorded
    assert any(run(s)[0].outcome.action != a[0].outcome.action for s in range(12, 30))


class _Failing:
    async def run(self, request: CounterfactualRequest) -> CounterfactualOutcome:
        raise RuntimeError("replay failed")


class _Slow:
    async def run(self, request: CounterfactualRequest) -> CounterfactualOutcome:
        await asyncio.sleep(10)
        return CounterfactualOutcome(reward=0.0)


@pytest.mark.parametrize("runner", [_Failing(), _Slow()])
def test_failed_or_timed_out_runs_are_skipped(runner: CounterfactualRunner) -> None:
    graphs, rewards, records = _batch()
    assigns = assign(graphs, rewards)
    before = assigns[0].credit.clone()
    ms = asyncio.run(calibrate(graphs, assigns, records, runner, CounterfactualConfig(budget=8, timeout_s=0.2)))
    assert ms == [] and torch.equal(assigns[0].credit, before)


def test_dpo_jsonl(tmp_path: Path) -> None:
    graphs, rewards, records = _batch()
    assigns = assign(graphs, rewards)
    wrong = {
        "tool": "Edit",
        "arguments": {"file_path": SRC, "old_string": "strptime(s, FMT)", "new_string": "strptime(s, FMT2)"},
    }
    noop = {"tool": "Edit", "arguments": {"file_path": SRC, "old_string": "zzz", "new_string": "zzz"}}
    runner = InProcessRunner(INITIAL, fixed)
    cfg = CounterfactualConfig(alternative="plan", budget=4, max_per_trajectory=2)
    ms = asyncio.run(calibrate(graphs, assigns, records, runner, cfg, plans={(0, 4): wrong, (0, 6): noop}))
    rows = dpo_pairs(ms, records[0], CurationConfig(theta_ae=0.5))
    assert len(rows) == 1  # only Δ = 1 > θ_AE; Δ = 0 gives no pair
    path = tmp_path / "dpo.jsonl"
    assert write_dpo_jsonl(rows, path) == 1
    (line,) = path.read_text().splitlines()
    row = json.loads(line)
    assert row["record_id"] == records[0][4].id and row["delta"] == 1.0
    assert row["chosen"]["tool_calls"] == records[0][4].response["tool_calls"]
    assert json.loads(row["rejected"]["tool_calls"][0]["function"]["arguments"]) == wrong["arguments"]
    assert row["prompt"] == records[0][4].request["messages"]
    assert row["prompt_token_ids"] == records[0][4].prompt_token_ids
    assert row["chosen_token_ids"] == records[0][4].generation_token_ids and row["rejected_token_ids"] == [7, 7, 7]
    swapped = dpo_pairs(ms, records[0], CurationConfig(theta_ae=-0.5))
    assert len(swapped) == 2


def test_rv_self_correction_reward() -> None:
    g = synthetic_graph(
        ["AE", "RV", "AE", "RV", "RV", "RV"],
        [(0, 1), (1, 2), (2, 3)],
        outcomes=[None, "failed", None, "passed", "failed", None],
    )
    # call 1 failed and the edit of call 2 depends on it (identified); call 4 failed and nothing fixed it
    assert rv_rewards(g).tolist() == [0.0, -1.0, 0.0, 1.0, 0.0, 0.0]
    cfg = CurationConfig(rv_fail_identified=1.0, rv_fail_unidentified=-0.5)
    assert rv_rewards(g, cfg).tolist() == [0.0, 1.0, 0.0, 1.0, -0.5, 0.0]
    g2 = synthetic_graph(["RV", "AE"], [], outcomes=["failed", None])
    assert rv_rewards(g2).tolist() == [0.0, 0.0]
    assert rv_rewards(g2, CurationConfig(identified_by="any_after")).tolist() == [-1.0, 0.0]


def test_low_credit_ig_calls_are_damped() -> None:
    graphs, rewards, _ = _batch()
    a = assign(graphs, rewards)[0]
    cfg = CurationConfig(theta_ig=0.5, ig_damping=0.25)
    w = sampling_weights(graphs[0], a, cfg)
    for k, n in enumerate(graphs[0].nodes):
        if n.role == "IG" and float(a.factor[k]) < 0.5:
            assert w[k] == 0.25
        else:
            assert w[k] == 1.0
    assert (w == 0.25).any() and (w == 1.0).any()
    # a measured effect overrides the share
    low = next(k for k in range(len(w)) if w[k] == 0.25)
    assert sampling_weights(graphs[0], a, cfg, deltas={low: 1.0})[low] == 1.0


def test_sampling_weights_reach_the_tokens() -> None:
    from nemo_polar.credit import token_advantages
    from nemo_polar.credit.config import FusionConfig

    from .sessions import prefix_merged_trajectory

    graphs, rewards, records = _batch()
    a = assign(graphs, rewards)[0]
    w = sampling_weights(graphs[0], a, CurationConfig(theta_ig=0.5))
    traj = prefix_merged_trajectory(records[0])
    cfg = CallCreditConfig(fusion=FusionConfig(alpha=0.5, apply_sampling_weights=True))
    (with_w,) = token_advantages(traj, graphs[0], a, cfg, call_weights=w)
    (without,) = token_advantages(traj, graphs[0], a, CallCreditConfig(fusion=FusionConfig(alpha=0.5)))
    for rid, s, e in traj.traces[0].call_spans:
        k = graphs[0].index_of()[rid]
        torch.testing.assert_close(with_w[s:e], without[s:e] * float(w[k]))


def test_calibration_is_off_by_default() -> None:
    graphs, rewards, _ = _batch()
    assert select_calls(graphs, assign(graphs, rewards), CounterfactualConfig()) == []


def test_uncertain_selection_uses_the_observational_estimate() -> None:
    from nemo_polar.credit.counterfactual import observational_delta

    graphs, rewards, _ = _batch()
    # one group: the good session edited dates.py, the bad one edited nothing → Δ̂ = 1 − 0 for both edits
    assigns = assign(graphs, rewards, group_ids=["t", "t"])
    edits = [k for k, n in enumerate(graphs[0].nodes) if n.role == "AE"]
    assert [observational_delta(graphs, assigns, 0, k) for k in edits] == [1.0, 1.0]
    # the most-credited edit agrees with the estimate (relative credit 1): the other one is the uncertain call
    cfg = CounterfactualConfig(budget=1, select="uncertain")
    [(t, k)] = select_calls(graphs, assigns, cfg)
    top = int(assigns[0].factor.argmax())
    assert (t, k) == (0, next(e for e in edits if e != top))
    # without a comparison trajectory in the group there is no estimate: maximal uncertainty
    alone = assign(graphs, rewards, group_ids=["t", "u"])
    assert observational_delta(graphs, alone, 0, edits[0]) is None


def test_second_best_plan_step() -> None:
    recs = make_session(bugfix_steps())
    plan = replay_plan(recs, recs[4].id, Alternative("second_best"))
    assert plan["steps"][4] == {"second_best": {"exclude_record": recs[4].id}}
    assert plan["steps"][:4] == [{"replay": r.id} for r in recs[:4]] and plan["steps"][5] == {"live": True}
