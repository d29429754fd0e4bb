# SPDX-License-Identifier: Apache-2.0
"""Regression tests with small `list[int]` literals: each pins one behaviour the reference got wrong.

Toy ChatML ids: IM_START=1, IM_END=2, NL=3, roles SYSTEM=10 USER=11 ASSISTANT=12 TOOL=13; content >= 100.
"""

from __future__ import annotations

import pytest

from nemo_polar.trajectory import (
    FidelityError,
    OptionsError,
    build,
    check_exact,
    register_builder,
    to_gym_records,
    to_message_log,
    traces_to_jsonl,
)
from nemo_polar.types import CompletionRecord, Trace, Trajectory

S, E, NL = 1, 2, 3
SYS, USR, AST, TOOL = 10, 11, 12, 13
P1 = [S, SYS, 100, E, NL, S, USR, 101, E, NL, S, AST]  # system + user + generation prompt


def rec(i: int, prompt: list[int], gen: list[int], **kw: object) -> CompletionRecord:
    return CompletionRecord(
        id=f"r{i}",
        session_id="s",
        seq=i,
        dialect="openai_chat",
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.5 - 0.1 * k for k in range(len(gen))],
        **kw,  # type: ignore[arg-type]
    ).validate()


def trainable(t: Trace) -> list[int]:
    return [x for x, m in zip(t.response_ids, t.loss_mask, strict=True) if m]


# --- exact merging, the newline the model never sampled ------------------------------------------------------


def test_newline_after_im_end_is_interstitial_not_trained() -> None:
    g1 = [200, 201, E]  # the model samples <|im_end|>, never the "\n" the template puts after it
    p2 = [*P1, 200, 201, E, NL, S, TOOL, 300, E, NL, S, AST]
    g2 = [202, E]
    traj = build([rec(0, P1, g1), rec(1, p2, g2)], "prefix_merging")
    (t,) = traj.traces
    assert t.prompt_ids == P1
    assert t.response_ids == [200, 201, E, NL, S, TOOL, 300, E, NL, S, AST, 202, E]
    assert t.loss_mask == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert t.response_logprobs[3:11] == [0.0] * 8 and t.response_logprobs[11:] == [-0.5, -0.6]
    assert t.call_spans == [("r0", 0, 3), ("r1", 11, 13)]
    assert traj.stats.merged == 1 and traj.stats.chains == 1 and traj.stats.trainable_tokens == 5


def test_dropped_newline_in_rerendered_history() -> None:
    """The model sampled "...\\n<|im_end|>"; the template re-renders the turn stripped ("..."<|im_end|>)."""
    g1 = [200, NL, E]
    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    recs = [rec(0, P1, g1), rec(1, p2, [201, E])]
    exact = build(recs, "prefix_merging", eot_token_ids=[E])
    assert exact.stats.chains == 2 and exact.stats.splits["drift"] == 1
    assert exact.traces[1].metadata["split_reason"] == "drift"
    assert exact.traces[1].prompt_ids == p2  # the second call trains on exactly what it saw
    canon = build(recs, "prefix_merging", fidelity="canonical", eot_token_ids=[E])
    assert canon.stats.chains == 1 and canon.stats.drift_tokens == 1 and canon.stats.splits["drift"] == 0
    (t,) = canon.traces
    assert t.response_ids == [200, NL, E, NL, S, TOOL, 300, E, NL, S, AST, 201, E]  # raw tokens, never re-encoded


# --- identical prompts -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fidelity", ["exact", "canonical"])
def test_identical_prompt_siblings_do_not_truncate_a_chain(fidelity: str) -> None:
    a1, b1 = [200, E], [210, E]
    pa = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    pb = [*P1, 210, E, NL, S, TOOL, 301, E, NL, S, AST]
    recs = [rec(0, P1, a1), rec(1, P1, b1), rec(2, pa, [201, E]), rec(3, pb, [211, E])]
    traj = build(recs, "prefix_merging", fidelity=fidelity, eot_token_ids=[E])
    assert traj.stats.chains == 2 and traj.stats.splits["sibling"] == 1 and traj.stats.merged == 2
    assert [t.metadata["records"] for t in traj.traces] == [["r0", "r2"], ["r1", "r3"]]
    assert traj.stats.drift_tokens == 0
    if fidelity == "exact":
        by_id = {r.id: r for r in recs}
        for t in traj.traces:
            check_exact(t, by_id)


def test_three_identical_prompts_make_three_chains() -> None:
    recs = [rec(i, P1, [200 + i, E]) for i in range(3)]
    traj = build(recs, "prefix_merging")
    assert traj.stats.chains == 3 and traj.stats.splits["sibling"] == 2 and traj.stats.merged == 0


# --- truncation ------------------------------------------------------------------------------------------------


def test_turn_truncated_without_eot_continues_exactly() -> None:
    g1 = [200, 201]  # finish_reason=length: no <|im_end|> sampled
    p2 = [*P1, 200, 201, E, NL, S, USR, 102, E, NL, S, AST]
    recs = [rec(0, P1, g1, finish_reason="length"), rec(1, p2, [202, E])]
    for fidelity in ("exact", "canonical"):
        traj = build(recs, "prefix_merging", fidelity=fidelity, eot_token_ids=[E])
        (t,) = traj.traces
        # the template's <|im_end|> closes the truncated turn as interstitial: mask 0, logprob 0, not guessed
        assert t.response_ids == [200, 201, E, NL, S, USR, 102, E, NL, S, AST, 202, E]
        assert t.loss_mask == [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
        assert traj.stats.drift_tokens == 0 and traj.stats.trainable_tokens == 4


def test_truncated_turn_retried_is_counted() -> None:
    recs = [rec(0, P1, [200, 201], finish_reason="length"), rec(1, P1, [210, E], finish_reason="stop")]
    traj = build(recs, "prefix_merging")
    assert traj.stats.splits["truncated"] == 1 and traj.stats.chains == 2


def test_canonical_without_terminator_in_tail_splits_no_eot() -> None:
    p2 = [*P1, 200, 201, NL, S, USR, 102, NL, S, AST]  # a template that closes turns without the terminator
    recs = [rec(0, P1, [200, 201, E]), rec(1, p2, [202])]
    traj = build(recs, "prefix_merging", fidelity="canonical", eot_token_ids=[E])
    assert traj.stats.splits["no_eot"] == 1 and traj.stats.chains == 2


# --- multi-token terminators -----------------------------------------------------------------------------------

E1, E2 = 7, 8  # a two-token end of turn


def test_multi_token_terminator_canonical_splice() -> None:
    p1 = [S, USR, 101, E1, E2, S, AST]
    g1 = [200, 201, E1, E2]
    p2 = [*p1, 200, 201, E1, E2, NL, S, USR, 102, E1, E2, S, AST]
    traj = build(
        [rec(0, p1, g1), rec(1, p2, [202, E1, E2])], "prefix_merging", fidelity="canonical", eot_token_ids=[[E1, E2]]
    )
    (t,) = traj.traces
    assert t.response_ids == [200, 201, E1, E2, NL, S, USR, 102, E1, E2, S, AST, 202, E1, E2]
    assert t.loss_mask == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert traj.stats.drift_tokens == 0


def test_multi_token_terminator_first_token_alone_is_not_a_terminator() -> None:
    """E1 inside the re-rendered content is not the two-token terminator: the splice waits for E1 E2."""
    p1 = [S, USR, 101, E1, E2, S, AST]
    g1 = [200, E1, 201, E1, E2]
    p2 = [*p1, 200, E1, 201, E1, E2, NL, S, AST]
    traj = build(
        [rec(0, p1, g1), rec(1, p2, [202, E1, E2])], "prefix_merging", fidelity="canonical", eot_token_ids=[[E1, E2]]
    )
    assert traj.stats.chains == 1 and traj.stats.drift_tokens == 0
    assert traj.traces[0].response_ids[:6] == [200, E1, 201, E1, E2, NL]


def test_alternative_terminators() -> None:
    eot, eom = 5, 6
    p1 = [S, USR, 101, eot, S, AST]
    p2 = [*p1, 200, eom, S, TOOL, 300, eot, S, AST]
    recs = [rec(0, p1, [200, eom]), rec(1, p2, [201, eot])]
    for eots in ([eot, eom], [[eot], [eom]]):  # a flat list lists alternatives, like vLLM's stop_token_ids
        traj = build(recs, "prefix_merging", fidelity="canonical", eot_token_ids=eots)
        assert traj.stats.chains == 1 and traj.stats.drift_tokens == 0
    # read as ONE two-token terminator, [eot, eom] never occurs: nothing to splice at
    assert build(recs, "prefix_merging", fidelity="canonical", eot_token_ids=[[eot, eom]]).stats.splits["no_eot"] == 1


# --- failed, forced, side, compaction, subagents -------------------------------------------------------------


def test_failed_record_skipped_without_breaking_the_chain() -> None:
    failed = CompletionRecord(id="f", session_id="s", seq=1, dialect="openai_chat", error={"status": 503})
    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    traj = build([rec(0, P1, [200, E]), failed, rec(2, p2, [201, E])], "prefix_merging")
    assert traj.stats.chains == 1 and traj.stats.records == 2 and traj.status == "COMPLETED"
    only_failed = build([failed], "prefix_merging")
    assert only_failed.status == "ERROR" and only_failed.traces == []


def test_forced_call_masked_by_default_and_kept_on_request() -> None:
    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    recs = [rec(0, P1, [200, E], origin="forced"), rec(1, p2, [201, E])]
    masked = build(recs, "prefix_merging")
    assert masked.traces[0].loss_mask[:2] == [0, 0] and masked.stats.splits["forced_masked"] == 1
    assert masked.stats.policy_tokens == {"forced_masked": 2} and masked.stats.trainable_tokens == 2
    kept = build(recs, "prefix_merging", forced_policy="keep")
    assert kept.stats.trainable_tokens == 4 and kept.stats.splits["forced_masked"] == 0


def test_side_call_replaying_main_history_never_consumes_the_main_tip() -> None:
    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    side_p = [*P1, 200, E, NL, S, USR, 999, E, NL, S, AST]  # e.g. a router that replays the conversation
    recs = [rec(0, P1, [200, E]), rec(1, side_p, [42, E], call_kind="side"), rec(2, p2, [201, E])]
    traj = build(recs, "prefix_merging", reward=1.0)
    assert [t.chain_kind for t in traj.traces] == ["main", "side"]
    main, side = traj.traces
    assert main.metadata["records"] == ["r0", "r2"] and side.trainable_tokens == 0
    assert main.reward == 1.0 and side.reward is None  # never trained with the task reward by accident
    assert traj.stats.policy_tokens == {"side_masked": 2}
    kept = build(recs, "prefix_merging", reward=1.0, side_calls="keep", side_reward=0.0)
    assert kept.traces[1].reward == 0.0 and kept.traces[1].trainable_tokens == 2
    dropped = build(recs, "prefix_merging", side_calls="drop")
    assert dropped.stats.chains == 1 and dropped.stats.policy_tokens == {"side_dropped": 2}


def test_classifier_option_overrides_call_kind() -> None:
    recs = [rec(0, P1, [200, E]), rec(1, [S, USR, 555, E, NL, S, AST], [42, E])]
    traj = build(recs, "prefix_merging", classifier=lambda r: "side" if r.prompt_token_ids[2] == 555 else None)
    assert [t.chain_kind for t in traj.traces] == ["main", "side"]
    with pytest.raises(ValueError, match="classifier returned"):
        build(recs, "prefix_merging", classifier=lambda r: "bogus")


def test_compaction_and_subagent_fingerprints() -> None:
    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    compacted = [S, SYS, 100, E, NL, S, USR, 777, 778, E, NL, S, AST]  # same system turn, summary as user
    sub = [S, SYS, 500, E, NL, S, USR, 501, E, NL, S, AST]  # a main-labelled call with another system turn
    recs = [rec(0, P1, [200, E]), rec(1, p2, [201, E]), rec(2, sub, [600, E]), rec(3, compacted, [202, E])]
    traj = build(recs, "prefix_merging", eot_token_ids=[E])
    assert [t.chain_kind for t in traj.traces] == ["main", "subagent", "post_compaction"]
    assert traj.stats.splits["compaction"] == 1
    # the same from message-level system prompts, with no terminator configured
    msgs = {0: "sys A", 1: "sys A", 2: "sys B", 3: "sys A"}
    for r in recs:
        r.request = {"messages": [{"role": "system", "content": msgs[r.seq]}, {"role": "user", "content": "x"}]}
    traj = build(recs, "prefix_merging")
    assert [t.chain_kind for t in traj.traces] == ["main", "subagent", "post_compaction"]


def test_rerendered_generation_prompt_is_drift() -> None:
    """Qwen3 thinking-off shape: the prompt ends in an empty think block that the history re-render drops."""
    think = [60, NL, NL, 61, NL, NL]
    p1 = [*P1, *think]
    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST, *think]
    recs = [rec(0, p1, [200, E]), rec(1, p2, [201, E])]
    # drift_window_tokens: how much of a prompt's tail may be re-rendered (real prompts are far longer than 32)
    traj = build(recs, "prefix_merging", eot_token_ids=[E], drift_window_tokens=8)
    assert traj.stats.splits["drift"] == 1 and traj.traces[1].metadata["related_record"] == "r0"
    unrelated = build(recs, "prefix_merging", eot_token_ids=[E], drift_window_tokens=0)
    assert unrelated.stats.splits["drift"] == 0  # without the window it is only told as a new conversation
    canon = build(recs, "prefix_merging", fidelity="canonical", eot_token_ids=[E], drift_window_tokens=8)
    assert canon.stats.splits["drift"] == 1  # the previous prompt is not a prefix either: counted, not merged


# --- per_request, registry, options ----------------------------------------------------------------------------


def test_per_request_one_trace_per_successful_record() -> None:
    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    failed = CompletionRecord(id="f", session_id="s", seq=5, dialect="openai_chat", error={"status": 500})
    traj = build([rec(1, p2, [201, E]), rec(0, P1, [200, E]), failed], "per_request", reward=0.5)
    assert [t.call_spans[0][0] for t in traj.traces] == ["r0", "r1"]
    assert traj.traces[1].prompt_ids == p2 and traj.traces[1].loss_mask == [1, 1]
    assert traj.stats.chains == 2 and traj.stats.merged == 0 and traj.stats.trainable_tokens == 4
    assert traj.stats.delivered_fraction == 0.5 and all(t.reward == 0.5 for t in traj.traces)


def _custom(records: object, options: object) -> Trajectory:
    return Trajectory(status="TIMEOUT")


def test_registry_and_dotted_paths() -> None:
    assert build([], f"{__name__}._custom").status == "TIMEOUT"
    assert build([], f"{__name__}:_custom").status == "TIMEOUT"
    register_builder("custom_test_builder", _custom, replace=True)
    assert build([], "custom_test_builder").status == "TIMEOUT"
    with pytest.raises(ValueError, match="already registered"):
        register_builder("per_request", _custom)
    with pytest.raises(KeyError, match="unknown builder"):
        build([], "nope")
    with pytest.raises(KeyError, match=r"cannot load builder 'no_such_module\.fn'"):
        build([], "no_such_module.fn")


def test_options_report_every_error_at_once() -> None:
    with pytest.raises(OptionsError) as info:
        build([], "prefix_merging", fidelity="lossy", side_calls="train", forced_policy="sometimes", colour=1)
    text = str(info.value)
    for key in ("fidelity", "side_calls", "forced_policy", "colour"):
        assert key in text
    with pytest.raises(OptionsError, match="eot_token_ids"):
        build([], "prefix_merging", fidelity="canonical")
    with pytest.raises(OptionsError, match="reward"):
        build([], "prefix_merging", reward=float("nan"))


def test_check_exact_catches_a_wrong_context() -> None:
    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    recs = [rec(0, P1, [200, E]), rec(1, p2, [201, E])]
    (t,) = build(recs, "prefix_merging").traces
    t.response_ids[4] = 999  # corrupt one interstitial token
    with pytest.raises(FidelityError, match="left context"):
        check_exact(t, {r.id: r for r in recs})


# --- command line ----------------------------------------------------------------------------------------------


def test_polar_build_cli(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from nemo_polar.cli import main

    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"".join(r.to_json() + b"\n" for r in [rec(0, P1, [200, E]), rec(1, p2, [201, E])]))
    out = tmp_path / "traces.jsonl"
    assert main(["build", str(path), "--eot", str(E), "-o", str(out)]) == 0
    (line,) = out.read_bytes().splitlines()
    t = Trace.from_json(line)
    assert t.call_spans == [("r0", 0, 2), ("r1", 10, 12)]
    assert "chains=1 merged=1" in capsys.readouterr().err
    assert main(["build", str(path), "--builder", "per_request", "--format", "gym", "-o", str(out)]) == 0
    assert len(out.read_bytes().splitlines()) == 2
    assert main(["build", str(path), "--fidelity", "canonical"]) == 2  # canonical without --eot: refused
    assert main(["build", str(path), "--fidelity", "canonical", "--eot", "99", f"{E},{NL}", "-o", str(out)]) == 0
    assert "chains=1 merged=1" in capsys.readouterr().err  # E,NL (two tokens) closes r0's turn in p2
    assert main(["build", str(tmp_path / "missing.jsonl")]) == 2


# --- exports with content --------------------------------------------------------------------------------------


def test_gym_items_mirror_calls_and_fold_masked_ones() -> None:
    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    p3 = [*p2, 201, E, NL, S, TOOL, 301, E, NL, S, AST]
    r0 = rec(
        0,
        P1,
        [200, E],
        response={
            "content": "",
            "reasoning": "look first",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}
            ],
        },
    )
    r1 = rec(1, p2, [201, E], origin="forced")  # masked: its tokens travel in the next prompt delta
    r2 = rec(
        2,
        p3,
        [202, E],
        response={"content": "done", "tool_calls": []},
        request={
            "messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c2", "content": "ok"}]
        },
    )
    traj = build([r0, r1, r2], "prefix_merging")
    (row,) = to_gym_records(traj, [r0, r1, r2])
    items = row["response"]["output"]
    assert [it["type"] for it in items] == ["reasoning", "function_call", "function_call_output", "message"]
    assert items[1]["name"] == "shell" and items[1]["generation_token_ids"] == [200, E]
    assert items[2] == {"type": "function_call_output", "call_id": "c2", "output": "ok"}
    assert items[3]["prompt_token_ids"] == p3 and items[3]["generation_token_ids"] == [202, E]
    assert "generation_token_ids" not in items[0]
    log = to_message_log(traj.traces[0], as_tensors=True)
    assert [m["role"] for m in log] == ["user", "assistant", "user", "assistant"]
    assert log[2]["token_ids"].tolist() == p3[len(P1) + 2 :] and not log[2]["token_loss_mask"].any()
    assert log[3]["token_loss_mask"].tolist() == [1, 1] and log[3]["generation_logprobs"].dtype.is_floating_point
    lines = traces_to_jsonl(traj).splitlines()
    assert Trace.from_json(lines[0]).response_ids == traj.traces[0].response_ids


def test_canonical_never_falls_back_to_an_older_shorter_tip() -> None:
    p2 = [*P1, 200, E, NL, S, TOOL, 300, E, NL, S, AST]
    p3 = [*p2, 201, NL, S, USR, 102, NL, S, AST]  # continues r1's turn, but no terminator after it
    recs = [rec(0, P1, [200, E]), rec(1, P1, [210, E]), rec(2, p2, [201, E]), rec(3, p3, [202, E])]
    traj = build(recs, "prefix_merging", fidelity="canonical", eot_token_ids=[E])
    # r3 must not be spliced onto the sibling chain r1 (whose prompt P1 also prefixes p3, with a terminator later)
    assert traj.stats.splits["no_eot"] == 1 and traj.stats.splits["sibling"] == 1
    assert [t.metadata["records"] for t in traj.traces] == [["r0", "r2"], ["r1"], ["r3"]]
