# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/delivered_fraction.py` without CLIs or vLLM: its plans, and its rows and tables from a session built
by the real builders out of hand-made records (the measurement itself needs real CLIs and vLLM: `make bench`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nemo_polar.trajectory import build
from nemo_polar.types import CompletionRecord, SessionResult

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import delivered_fraction  # noqa: E402


def test_plans_spawn_a_subagent_for_claude_code_and_keep_a_live_main_call() -> None:
    qwen = delivered_fraction.plan_for("qwen_code", "median")
    claude = delivered_fraction.plan_for("claude_code", "median")
    assert qwen["side"] == claude["side"] == "live"
    assert qwen["steps"][-2:] == [{"live": True}, {"text": "done"}]
    assert claude["steps"][0]["tool"] == "Agent" and claude["steps"][1:] == qwen["steps"]
    task = delivered_fraction.make_task("median", "claude_code", task_id="df-x")
    assert task.plans == [claude] and task.builder.name == "prefix_merging"


def _rec(rid: str, seq: int, prompt: list[int], gen: list[int], kind: str = "main") -> CompletionRecord:
    return CompletionRecord(id=rid, session_id="s", seq=seq, dialect="openai_chat", finish_reason="stop",
                            prompt_token_ids=prompt, generation_token_ids=gen, generation_log_probs=[-0.5] * len(gen),
                            call_kind=kind)  # fmt: skip


def test_rows_and_tables_from_a_built_session(capsys: pytest.CaptureFixture[str]) -> None:
    conv = delivered_fraction.convert_module()
    system = list(range(100, 140))
    records = [
        _rec("a", 0, [*system, 1], [10, 11, 2]),
        _rec("u", 1, [600, 601], [30, 31, 2], "subagent"),
        _rec("b", 2, [*system, 1, 10, 11, 2, 20], [12, 2]),
    ]
    result = SessionResult(session_id="s", task_id="t", trajectory=build(records, "prefix_merging"))
    before = delivered_fraction.session_rows(conv, "before", "claude_code", result, records, 1.0)
    assert [r["config"] for r in before] == ["before", "before, per_request"]
    merged, per_request = before
    assert (merged["delivered_calls"], merged["calls"], merged["main_traces"]) == (2, 3, 1)
    assert (merged["delivered_generated_tokens"], merged["generated_tokens"]) == (5, 8)
    assert (per_request["delivered_calls"], per_request["main_traces"]) == (1, 2)  # per_request: call 1 only
    assert merged["metrics"]["polar_undelivered_tokens"] == 3
    delivered_fraction.report(before)
    out = capsys.readouterr().out
    assert "| claude_code | before | 1 | 2/3 (66.7 %) | 5/8 (62.5 %) |" in out
    assert "| claude_code | before | subagent | 1 | 33.3 % | 3 (37.5 %) |" in out
