# SPDX-License-Identifier: Apache-2.0
"""Round-trip and validation tests of the core record types (nemo_polar.types)."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_polar.types import (
    CompletionRecord,
    EvalResult,
    SessionResult,
    SplitReason,
    Trace,
    Trajectory,
    TrajectoryStats,
    ValidationError,
    decode_array,
    encode_array,
)

token_ids = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=64)
logprob = st.floats(max_value=0.0, allow_nan=False, allow_infinity=True, width=64)


@st.composite
def records(draw: st.DrawFn) -> CompletionRecord:
    gen = draw(token_ids)
    lps = draw(st.lists(logprob, min_size=len(gen), max_size=len(gen)))
    return CompletionRecord(
        id=draw(st.text(min_size=1, max_size=12)),
        session_id=draw(st.text(min_size=1, max_size=12)),
        seq=draw(st.integers(min_value=0, max_value=10_000)),
        dialect=draw(st.sampled_from(["anthropic_messages", "openai_chat", "openai_responses", "google_genai"])),
        arrived_at=draw(st.floats(min_value=0, max_value=2e9)),
        original_request={"messages": [{"role": "user", "content": draw(st.text(max_size=20))}]},
        request={"messages": [], "sampling": {"temperature": 1.0}},
        response={"content": draw(st.text(max_size=20)), "reasoning": None, "tool_calls": []},
        finish_reason=draw(st.sampled_from(["stop", "length", "tool_calls", None])),
        prompt_token_ids=draw(token_ids),
        generation_token_ids=gen,
        generation_log_probs=lps,
        policy_version=draw(st.one_of(st.none(), st.integers(0, 100))),
        origin=draw(st.sampled_from(["live", "forced", "replayed"])),
        call_kind=draw(st.sampled_from(["main", "subagent", "side"])),
    )


@given(records(), st.booleans())
@settings(max_examples=200, deadline=None)
def test_record_json_round_trip_is_lossless(rec: CompletionRecord, compact: bool) -> None:
    rec.validate()
    back = CompletionRecord.from_json(rec.to_json(compact=compact))
    assert back == rec
    # logprobs survive bit for bit (float64), -inf included
    assert [math.copysign(1, x) for x in back.generation_log_probs] == [
        math.copysign(1, x) for x in rec.generation_log_probs
    ]


def test_compact_json_is_compact() -> None:
    import random

    rng = random.Random(0)  # realistic: a 151k vocabulary and float64 logprobs as vLLM returns them
    rec = CompletionRecord(
        id="r",
        session_id="s",
        seq=0,
        dialect="openai_chat",
        prompt_token_ids=[rng.randrange(151_000) for _ in range(2000)],
        generation_token_ids=[rng.randrange(151_000) for _ in range(64)],
        generation_log_probs=[-rng.random() * 5 for _ in range(64)],
    )
    compact, plain = rec.to_json(compact=True), rec.to_json(compact=False)
    assert len(compact) < len(plain) * 0.9
    assert orjson.loads(compact)["prompt_token_ids"].startswith("b64:i32:")
    assert CompletionRecord.from_json(plain) == CompletionRecord.from_json(compact) == rec


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"generation_log_probs": [-0.1]}, "generation_log_probs has 1 entries for 2"),
        ({"prompt_token_ids": [1, -2]}, "prompt_token_ids[1]"),
        ({"prompt_token_ids": [1, "2"]}, "prompt_token_ids[1]"),
        ({"dialect": "cohere"}, "dialect"),
        ({"origin": "imagined"}, "origin"),
        ({"call_kind": "helper"}, "call_kind"),
        ({"seq": -1}, "seq"),
        ({"id": ""}, "id is empty"),
        ({"generation_log_probs": [0.5, -0.1]}, "<= 0"),
        ({"generation_log_probs": [float("nan"), -0.1]}, "must be a number"),
        ({"upstream": {"usage": {"prompt_tokens": 9, "completion_tokens": 2}}}, "usage.prompt_tokens=9"),
        ({"upstream": {"usage": {"prompt_tokens": 3, "completion_tokens": 5}}}, "usage.completion_tokens=5"),
        ({"error": {"type": "upstream"}}, "failed record"),
        ({"finished_at": float("inf")}, "finished_at"),
    ],
)
def test_record_validation_rejects(changes: dict, fragment: str) -> None:
    base = dict(
        id="r1",
        session_id="s1",
        seq=0,
        dialect="openai_chat",
        prompt_token_ids=[1, 2, 3],
        generation_token_ids=[4, 5],
        generation_log_probs=[-0.1, -0.2],
    )
    base.update(changes)
    with pytest.raises(ValidationError) as ei:
        CompletionRecord(**base).validate()
    assert fragment in str(ei.value)


def test_record_validation_reports_all_errors_at_once() -> None:
    rec = CompletionRecord(
        id="", session_id="", seq=-3, dialect="x", generation_token_ids=[1], generation_log_probs=[]
    )
    with pytest.raises(ValidationError) as ei:
        rec.validate()
    assert len(ei.value.errors) >= 5


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="unknown field"):
        CompletionRecord.from_dict({"id": "a", "session_id": "s", "seq": 0, "dialect": "openai_chat", "tokens": []})


def _trace(**kw) -> Trace:  # type: ignore[no-untyped-def]
    base = dict(
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5, 6],
        loss_mask=[1, 1, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, -0.3],
        call_spans=[("a", 0, 2), ("b", 3, 4)],
    )
    base.update(kw)
    return Trace(**base)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"loss_mask": [1, 1, 0]}, "loss_mask has 3 entries"),
        ({"loss_mask": [1, 1, 2, 1]}, "0 or 1"),
        ({"response_logprobs": [-0.1, -0.2, -0.5, -0.3]}, "must be 0.0 where loss_mask is 0"),
        ({"response_logprobs": [-0.1]}, "response_logprobs has 1 entries"),
        ({"call_spans": [("a", 0, 9)]}, "outside response_ids"),
        ({"call_spans": [("a", 0, 3), ("b", 2, 4)]}, "overlaps"),
        ({"chain_kind": "sidecar"}, "chain_kind"),
        ({"reward": float("inf")}, "reward must be finite"),
    ],
)
def test_trace_validation_rejects(changes: dict, fragment: str) -> None:
    with pytest.raises(ValidationError) as ei:
        _trace(**changes).validate()
    assert fragment in str(ei.value)


def test_session_result_round_trip_nested() -> None:
    traj = Trajectory(
        traces=[_trace(reward=1.0), _trace(chain_kind="side", reward=None)],
        stats=TrajectoryStats(chains=2, records=3, merged=1, trainable_tokens=6, delivered_fraction=0.5),
        timing={"build_s": 0.01},
    )
    traj.stats.splits[SplitReason.SIBLING.value] = 1
    res = SessionResult(
        session_id="s1",
        task_id="t1",
        sample_index=3,
        harness="codex",
        trajectory=traj,
        eval=EvalResult(reward=1.0, resolved=True, metrics={"tests_passed": 3.0}),
        record_ids=["a", "b", "c"],
        metadata={"group_id": "g"},
    )
    res.validate()
    back = SessionResult.from_json(res.to_json())
    assert back == res
    assert back.trajectory.traces[0].call_spans == [("a", 0, 2), ("b", 3, 4)]
    assert back.reward == 1.0


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (EvalResult(reward=float("nan")), "reward must be a finite number"),
        (EvalResult(reward=0.0, mask_sample=True), "mask_sample requires a failure_kind"),
        (EvalResult(reward=1.0, metrics={"x": float("inf")}), "metrics"),
        (Trajectory(status="DONE"), "status"),
        (Trajectory(stats=TrajectoryStats(splits={"weird": 1})), "unknown split reasons"),
        (Trajectory(stats=TrajectoryStats(delivered_fraction=1.5)), "delivered_fraction"),
        (SessionResult(session_id="s", task_id="", eval=EvalResult(reward=float("-inf"))), "task_id is empty"),
    ],
)
def test_other_validation(obj, fragment: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as ei:
        obj.validate()
    assert fragment in str(ei.value)


def test_encode_array_range_and_passthrough() -> None:
    with pytest.raises(ValueError):
        encode_array([2**31], "i32")
    assert decode_array([1, 2]) == [1, 2]
    assert decode_array(encode_array([], "i32")) == []
    with pytest.raises(ValueError):
        decode_array("not-an-array")
