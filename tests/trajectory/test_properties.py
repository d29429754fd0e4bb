# SPDX-License-Identifier: Apache-2.0
"""Property-based tests of the builders over generated sessions (hypothesis).

Sessions interleave a main agent, subagents (including identical-prompt twins), side calls (some replaying the
main history), compactions, truncated turns (continued or retried), failed calls with retries, forced calls,
n>1 siblings and re-rendered (drifted) history. Invariants (issue 5, "Done when"):
- every sampled token is trainable exactly once across traces unless a policy masked/dropped it (counted);
- exact mode: every call's left context equals its record's prompt, its span its sampled tokens, logprobs aligned;
- per_request and prefix_merging train the same multiset of sampled tokens;
- the exact builder recovers the generator's ground truth: chain count, split reasons, chain kinds.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_polar.trajectory import build, check_exact, to_gym_records, to_message_log
from nemo_polar.types import CompletionRecord, Trajectory

from .sessions import IM_END, SessionSim

ACTIONS = [
    "turn",
    "turn",
    "turn",
    "drift",
    "trunc",
    "trunc_retry",
    "sibling",
    "forced",
    "fail",
    "compact",
    "spawn",
    "spawn_twins",
    "side",
    "side_replay",
]


def run(actions: list[tuple[str, int]]) -> SessionSim:
    sim = SessionSim()
    for name, k in actions:
        agents = sim.agents
        agent = agents[k % len(agents)]
        if name == "turn":
            sim.turn(agent)
        elif name == "drift":
            sim.turn(agent, drift=True)
        elif name == "trunc":
            sim.turn(agent, truncated=True)
        elif name == "trunc_retry":
            sim.truncated_retry(agent)
        elif name == "sibling":
            sim.siblings(agent)
        elif name == "forced":
            sim.turn(agent, forced=True)
        elif name == "fail":
            sim.failed_then_retry(agent)
        elif name == "compact":
            sim.compact()
        elif name == "spawn":
            sim.spawn_subagent()
        elif name == "spawn_twins":
            sim.spawn_subagent(twins=True)
        elif name == "side":
            sim.side_call(replay_main=False)
        elif name == "side_replay":
            sim.side_call(replay_main=True)
    return sim


sessions = st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(0, 7)), min_size=1, max_size=30).map(run)

OPTS = {"eot_token_ids": [IM_END], "drift_window_tokens": 0}


def trained(traj: Trajectory) -> Counter[tuple[str, int, int, float]]:
    """(record id, offset in its generation, token, logprob) of every trainable token."""
    out: Counter[tuple[str, int, int, float]] = Counter()
    for t in traj.traces:
        for rid, s, e in t.call_spans:
            for i in range(s, e):
                if t.loss_mask[i]:
                    out[(rid, i - s, t.response_ids[i], t.response_logprobs[i])] += 1
    return out


def check_common(traj: Trajectory, records: list[CompletionRecord], *, side_calls: str, forced_policy: str) -> None:
    traj.validate()
    ok = [r for r in records if r.error is None]
    by_id = {r.id: r for r in ok}
    placed: Counter[str] = Counter()
    for t in traj.traces:
        covered = [False] * len(t.response_ids)
        for rid, s, e in t.call_spans:
            placed[rid] += 1
            rec = by_id[rid]
            assert t.response_ids[s:e] == rec.generation_token_ids
            masked = (rec.origin != "live" and forced_policy == "mask") or (
                rec.call_kind == "side" and side_calls != "keep"
            )
            if masked:
                assert t.loss_mask[s:e] == [0] * (e - s)
                assert t.response_logprobs[s:e] == [0.0] * (e - s)
            else:
                assert t.loss_mask[s:e] == [1] * (e - s)
                assert t.response_logprobs[s:e] == rec.generation_log_probs
            covered[s:e] = [True] * (e - s)
        for i, c in enumerate(covered):  # interstitial tokens: never trained, logprob 0
            if not c:
                assert t.loss_mask[i] == 0 and t.response_logprobs[i] == 0.0
    for r in ok:
        expected = 0 if (r.call_kind == "side" and side_calls == "drop") else 1
        assert placed[r.id] == expected, r.id
    # every sampled token is trainable once, or counted by the policy that kept it out
    total = sum(len(r.generation_token_ids) for r in ok)
    assert traj.stats.trainable_tokens + sum(traj.stats.policy_tokens.values()) == total
    counts = trained(traj)
    assert all(v == 1 for v in counts.values())
    assert traj.stats.trainable_tokens == sum(counts.values())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions, st.sampled_from(["keep", "mask", "drop"]), st.sampled_from(["mask", "keep"]))
def test_invariants_all_builders(sim: SessionSim, side_calls: str, forced_policy: str) -> None:
    recs = sim.records
    kw = {**OPTS, "side_calls": side_calls, "forced_policy": forced_policy}
    per = build(recs, "per_request", **kw)
    exact = build(recs, "prefix_merging", verify=True, **kw)
    canon = build(recs, "prefix_merging", fidelity="canonical", **kw)
    for traj in (per, exact, canon):
        check_common(traj, recs, side_calls=side_calls, forced_policy=forced_policy)
    # same multiset of trained sampled tokens, whatever the builder
    assert trained(per) == trained(exact) == trained(canon)
    by_id = {r.id: r for r in recs}
    for t in exact.traces:
        check_exact(t, by_id)
        prompt_len = len(t.prompt_ids)
        for rid, s, _e in t.call_spans:  # the left context has exactly the length of the prompt the model saw
            assert prompt_len + s == len(by_id[rid].prompt_token_ids)
    assert canon.stats.splits["drift"] == 0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions)
def test_exact_recovers_ground_truth(sim: SessionSim) -> None:
    traj = build(sim.records, "prefix_merging", **OPTS)
    st_ = traj.stats
    assert st_.chains == sim.chains
    for reason in ("drift", "sibling", "truncated", "compaction"):
        assert st_.splits[reason] == sim.splits[reason], reason
    assert st_.splits["no_eot"] == 0
    assert st_.splits["forced_masked"] == sim.forced
    assert st_.records == len([r for r in sim.records if r.error is None])
    assert st_.merged == st_.records - st_.chains
    starts = {t.call_spans[0][0]: t.chain_kind for t in traj.traces}
    assert set(starts) == sim.starts
    for rid, kind in starts.items():
        assert kind == sim.kind_of[rid], rid
    if traj.traces and any(t.chain_kind == "main" for t in traj.traces):
        assert traj.traces[0].chain_kind == "main"  # main chain first
    # dropping side calls removes exactly the side chains
    dropped = build(sim.records, "prefix_merging", side_calls="drop", **OPTS)
    assert dropped.stats.chains == sim.chains - sim.side_chains


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions)
def test_canonical_counts_drift_instead_of_splitting(sim: SessionSim) -> None:
    traj = build(sim.records, "prefix_merging", fidelity="canonical", **OPTS)
    assert traj.stats.chains == sim.chains - sim.splits["drift"]
    assert traj.stats.drift_tokens == sim.canonical_drift
    for reason in ("sibling", "truncated", "compaction"):
        assert traj.stats.splits[reason] == sim.splits[reason], reason


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions, st.sampled_from(["per_request", "prefix_merging"]))
def test_exports_are_contiguous_chains(sim: SessionSim, builder: str) -> None:
    traj = build(sim.records, builder, **OPTS)
    rows = to_gym_records(traj, sim.records)
    assert len(rows) == len(traj.traces)
    for row, t in zip(rows, traj.traces, strict=True):
        calls = [it for it in row["response"]["output"] if "generation_token_ids" in it]
        seen: list[int] | None = None
        for it in calls:  # NeMo RL: each call's prompt starts with everything seen so far
            assert len(it["generation_token_ids"]) == len(it["generation_log_probs"])
            if seen is not None:
                assert it["prompt_token_ids"][: len(seen)] == seen
            seen = it["prompt_token_ids"] + it["generation_token_ids"]
        log = to_message_log(t)
        assert [m["role"] for m in log] == ["user", "assistant"] * (len(log) // 2)
        flat = [x for m in log for x in m["token_ids"]]
        full = t.prompt_ids + t.response_ids
        assert flat == full[: len(flat)]
        trained_in_log = sum(sum(m["token_loss_mask"]) for m in log)
        assert trained_in_log == t.trainable_tokens
        assert len([m for m in log if m["role"] == "assistant"]) == len(calls)
