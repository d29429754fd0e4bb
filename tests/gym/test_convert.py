# SPDX-License-Identifier: Apache-2.0
"""polar_agent's conversion (`environments/responses_api_agents/polar_agent/convert.py`) and the reproduction of
NeMo RL's contiguity rule, on hand-computed chains (no NeMo Gym needed): the main chain becomes output items that
pass the rule, other chains are reported with their sizes, and the rule really rejects a broken chain."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from nemo_polar.trajectory import build
from nemo_polar.types import CompletionRecord, SessionResult, Trace, Trajectory, TrajectoryStats

from .contiguity import NonContiguous, to_message_log

AGENT_DIR = Path(__file__).resolve().parents[2] / "environments" / "responses_api_agents" / "polar_agent"


def _convert() -> ModuleType:
    spec = importlib.util.spec_from_file_location("polar_agent_convert", AGENT_DIR / "convert.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _result() -> SessionResult:
    # main chain: prompt [1,2,3]; call a samples [10,11]; tool output [20,21] (masked); call b samples [12]
    main = Trace(
        prompt_ids=[1, 2, 3],
        response_ids=[10, 11, 20, 21, 12],
        loss_mask=[1, 1, 0, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, 0.0, -0.3],
        call_spans=[("a", 0, 2), ("b", 4, 5)],
        chain_kind="main",
    )
    side = Trace(prompt_ids=[7], response_ids=[8, 9], loss_mask=[1, 1], response_logprobs=[-1.0, -1.0],
                 call_spans=[("s", 0, 2)], chain_kind="side")  # fmt: skip
    traj = Trajectory(traces=[main, side], stats=TrajectoryStats(chains=2, records=3, trainable_tokens=5,
                                                                 delivered_fraction=0.6))  # fmt: skip
    return SessionResult(session_id="s1", task_id="t", trajectory=traj, record_ids=["a", "s", "b"], harness="pi")


def test_main_chain_items_pass_the_contiguity_rule() -> None:
    conv = _convert()
    res = _result()
    resp = conv.gym_response(res, [], model="m", created_at=0)
    calls = [i for i in resp["output"] if i.get("generation_token_ids")]
    assert [c["generation_token_ids"] for c in calls] == [[10, 11], [12]]
    assert calls[1]["prompt_token_ids"] == [1, 2, 3, 10, 11, 20, 21]
    log = to_message_log({"response": resp})
    assert [m["token_ids"] for m in log] == [[1, 2, 3], [10, 11], [20, 21], [12]]
    summary = conv.polar_summary(res, elapsed_s=1.0)
    assert summary["delivered_fraction"] == 0.6 and summary["delivered_chain"] == "main"
    assert summary["other_chains"] == [{"trace_index": 1, "chain_kind": "side", "calls": 1, "trainable_tokens": 2}]


def test_no_main_chain_delivers_nothing() -> None:
    conv = _convert()
    res = _result()
    res.trajectory.traces = res.trajectory.traces[1:]
    assert conv.gym_response(res, [], model="m", created_at=0)["output"] == []
    assert conv.polar_summary(res, elapsed_s=0.0)["delivered_fraction"] == 0.0
    assert conv.polar_calls(res, [], harness="pi") == []


@pytest.mark.parametrize("breakage", ["dropped_think", "logprob_count"])
def test_the_rule_rejects_a_broken_chain(breakage: str) -> None:
    resp = _convert().gym_response(_result(), [], model="m", created_at=0)
    bad = copy.deepcopy(resp)
    calls = [i for i in bad["output"] if i.get("generation_token_ids")]
    if breakage == "dropped_think":  # the template re-rendered history without a sampled token
        calls[1]["prompt_token_ids"] = [1, 2, 3, 10, 20, 21]
        with pytest.raises(NonContiguous, match="Non-contiguous"):
            to_message_log({"response": bad})
    else:
        calls[0]["generation_log_probs"] = [-0.1]
        with pytest.raises(NonContiguous, match="logprobs"):
            to_message_log({"response": bad})


def _rec(rid: str, seq: int, prompt: list[int], gen: list[int], kind: str = "main", **kw: object) -> CompletionRecord:
    return CompletionRecord(id=rid, session_id="s1", seq=seq, dialect="openai_chat", finish_reason="stop",
                            prompt_token_ids=prompt, generation_token_ids=gen, generation_log_probs=[-0.5] * len(gen),
                            call_kind=kind, **kw)  # fmt: skip


def _session_records() -> list[CompletionRecord]:
    """A main agent of three calls whose third prompt re-renders the first answer (a drift split), a side call, a
    subagent call, and a failed call (not a model call that produced anything)."""
    sys_prompt = list(range(100, 140))
    return [
        _rec("a", 0, [*sys_prompt, 1], [10, 11, 2]),
        _rec("s", 1, [500, 501], [8, 9], "side"),
        _rec("b", 2, [*sys_prompt, 1, 10, 11, 2, 20, 21], [12, 2]),
        _rec("u", 3, [600, 601, 602], [30, 31, 32, 2], "subagent"),
        _rec("c", 4, [*sys_prompt, 1, 10, 99, 2, 20, 21, 12, 2, 22], [13, 14, 2]),
        _rec("x", 5, [700], [], error={"kind": "upstream", "message": "502"}),
    ]


def _built(records: list[CompletionRecord], **options: object) -> SessionResult:
    traj = build(records, "prefix_merging", eot_token_ids=[2], **options)
    return SessionResult(session_id="s1", task_id="t", trajectory=traj, record_ids=[r.id for r in records])


def test_delivery_counts_what_the_one_record_carries_and_every_chain_left_out() -> None:
    conv = _convert()
    records = _session_records()
    res = _built(records)
    d = conv.delivery(res, records)
    assert (d["calls"], d["delivered_calls"]) == (5, 2)  # a, b of a, b, c, s, u (the failed call is no call)
    assert (d["generated_tokens"], d["delivered_generated_tokens"]) == (3 + 2 + 3 + 2 + 4, 3 + 2)
    # trainable: the main chain's and the drifted main chain's and the subagent's; side calls are masked by default
    assert (d["trainable_tokens"], d["delivered_trainable_tokens"]) == (5 + 3 + 4, 5)
    left = {c["chain"]: (c["calls"], c["generated_tokens"], c["trainable_tokens"]) for c in d["chains"]
            if not c["delivered"]}  # fmt: skip
    assert left == {"main (drift)": (1, 3, 3), "side": (1, 2, 0), "subagent": (1, 4, 4)}
    metrics = conv.delivery_metrics(d)
    assert metrics == {
        "polar_delivered_calls_fraction": 2 / 5,
        "polar_delivered_tokens_fraction": 5 / 14,
        "polar_delivered_trainable_fraction": 5 / 12,
        "polar_undelivered_calls": 3,
        "polar_undelivered_tokens": 9,
    }
    assert metrics["polar_delivered_trainable_fraction"] == res.trajectory.stats.delivered_fraction
    note = conv.undelivered_note(d, session_id="s1")
    assert note is not None and "2 of 5 calls" in note and "35.7 % of generated tokens" in note
    assert "subagent: 1 calls, 4 generated / 4 trainable tokens" in note and "main (drift)" in note
    assert conv.polar_summary(res, elapsed_s=0.0, records=records)["delivery"] == d


def test_dropped_side_calls_are_counted_and_a_whole_main_chain_leaves_nothing_out() -> None:
    conv = _convert()
    records = _session_records()
    d = conv.delivery(_built(records, side_calls="drop"), records)
    dropped = [c for c in d["chains"] if c["chain"] == "dropped"]
    assert dropped == [{"trace_index": None, "chain": "dropped", "delivered": False, "calls": 1,
                        "generated_tokens": 2, "trainable_tokens": 0}]  # fmt: skip
    only_main = [r for r in records if r.id in ("a", "b")]
    d = conv.delivery(_built(only_main), only_main)
    assert conv.undelivered_note(d, session_id="s1") is None
    assert conv.delivery_metrics(d)["polar_delivered_tokens_fraction"] == 1.0
    assert conv.delivery_metrics(d)["polar_undelivered_calls"] == 0
