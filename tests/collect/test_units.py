# SPDX-License-Identifier: Apache-2.0
"""The collect package's pure parts on a hand-written session: task expansion, the SFT conversation (validated
with the official `openai` SDK's message types), summary numbers, and the HTML report (real trajectory builder and
real CALL-CREDIT on the records; the DOM read with the standard library's parser). No server, no model."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.collect import expand_tasks, render_report, sft_lines, summarize
from nemo_polar.collect.collect import LIVE_PLAN, example_tasks
from nemo_polar.collect.export import conversation
from nemo_polar.trajectory import build
from nemo_polar.types import CompletionRecord, EvalResult, SessionResult

SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": [{"type": "text", "text": "Fix median() "}, {"type": "text", "text": "please."}]}
CALL_CAT = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "cat stats.py"}'}}
CALL_EDIT = {
    "id": "c2",
    "type": "function",
    "function": {"name": "edit", "arguments": {"path": "stats.py", "old": "a", "new": "b"}},
}


def _rec(seq: int, messages: list[dict[str, Any]], response: dict[str, Any], kind: str = "main") -> CompletionRecord:
    base = 100 * (seq + 1)
    return CompletionRecord(
        id=f"r{seq}",
        session_id="s1",
        seq=seq,
        dialect="openai_chat",
        arrived_at=1000.0 + 2 * seq,
        finished_at=1001.0 + 2 * seq,
        request={"messages": messages, "tools": [{"type": "function", "function": {"name": "bash"}}]},
        response=response,
        finish_reason="tool_calls" if response.get("tool_calls") else "stop",
        prompt_token_ids=list(range(base, base + 5)),
        generation_token_ids=[7, 8, 9],
        generation_log_probs=[-0.1, -0.2, -0.3],
        call_kind=kind,
    )


def _session() -> tuple[SessionResult, list[CompletionRecord]]:
    m0 = [SYSTEM, USER]
    a0 = {"role": "assistant", "content": "", "tool_calls": [CALL_CAT]}
    m1 = [*m0, a0, {"role": "tool", "tool_call_id": "c1", "content": "def median(values): ..."}]
    a1 = {"role": "assistant", "content": None, "tool_calls": [CALL_EDIT]}
    m2 = [*m1, a1, {"role": "tool", "tool_call_id": "c2", "content": "edited stats.py"}]
    records = [
        _rec(0, m0, {"content": "", "tool_calls": [CALL_CAT]}),
        _rec(1, m1, {"content": None, "tool_calls": [CALL_EDIT]}),
        _rec(2, [{"role": "user", "content": "title for this chat?"}], {"content": "Median fix"}, kind="side"),
        _rec(3, m2, {"content": "Fixed.", "reasoning": "all good", "tool_calls": []}),
    ]
    traj = build(records, builder="per_request", reward=1.0)
    s = SessionResult(
        session_id="s1",
        task_id="median.pi",
        harness="pi",
        trajectory=traj,
        eval=EvalResult(reward=1.0, resolved=True),
        record_ids=[r.id for r in records],
        metadata={"repo": "org/stats", "group_id": "median.pi"},
    )
    return s, records


def test_expand_tasks_one_task_per_harness_with_cycled_plans() -> None:
    (base,) = example_tasks(["median"], plans=("fix_plan", "live"))
    tasks = expand_tasks([base], harnesses=["pi", "qwen_code"], samples=3, builder="per_request")
    assert [t.task_id for t in tasks] == ["median.pi", "median.qwen_code"]
    for t, h in zip(tasks, ["pi", "qwen_code"], strict=True):
        assert t.agent.harness == h and t.num_samples == 3 and t.builder.name == "per_request"
        assert t.plans is not None and t.plans[1] == LIVE_PLAN and t.plans[0] == t.plans[2] == base.plans[0]  # type: ignore[index]
        assert t.metadata.group_id == t.task_id and t.metadata.repo == "polar-example/median"
        assert t.evaluator.name == "swe_tests" and t.runtime.source == "example:median"


def test_conversation_is_openai_chat_messages() -> None:
    from openai.types.chat import ChatCompletionMessageParam
    from pydantic import TypeAdapter

    _, records = _session()
    msgs = conversation(records[3])
    TypeAdapter(list[ChatCompletionMessageParam]).validate_python(msgs)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert msgs[1]["content"] == "Fix median() please."  # text parts joined
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "cat stats.py"}'}
    assert msgs[4]["content"] is None and json.loads(msgs[4]["tool_calls"][0]["function"]["arguments"])["new"] == "b"
    assert msgs[5] == {"role": "tool", "tool_call_id": "c2", "content": "edited stats.py"}
    assert msgs[6] == {"role": "assistant", "content": "Fixed."}  # no non-schema keys (reasoning) leak in


def test_sft_lines_main_conversation_all_chains_and_tokens() -> None:
    s, records = _session()
    (line,) = sft_lines(s, records, tokens=True)
    assert line["metadata"]["record_id"] == "r3" and line["metadata"]["reward"] == 1.0
    assert len(line["messages"]) == 7 and line["tools"]
    trace = next(t for t in s.trajectory.traces if t.call_spans[0][0] == "r3")
    assert line["tokens"]["response_ids"] == trace.response_ids and line["tokens"]["loss_mask"] == trace.loss_mask
    every = sft_lines(s, records, all_chains=True)
    assert len(every) == len(s.trajectory.traces) == 4
    side = [x for x in every if x["metadata"]["chain_kind"] == "side"]
    assert len(side) == 1 and side[0]["messages"][-1] == {"role": "assistant", "content": "Median fix"}


def test_summary_numbers() -> None:
    s, records = _session()
    failed = SessionResult(
        session_id="s2",
        task_id="median.qwen_code",
        harness="qwen_code",
        status="ERROR",
        eval=EvalResult(reward=0.0, mask_sample=True, failure_kind="init_failed"),
        metadata={"repo": "org/stats"},
    )
    summary = summarize([s, failed], {"s1": records}, accept_threshold=1.0)
    pi = summary["by_harness"]["pi"]
    assert pi["attempts"] == 1 and pi["accepted"] == 1 and pi["acceptance_rate"] == 1.0
    assert pi["mean_turns"] == 3  # three main calls; the side call is not a turn
    assert pi["messages_per_session"] == 7
    assert pi["trainable_tokens"] == sum(t.trainable_tokens for t in s.trajectory.traces) > 0
    assert summary["by_harness"]["qwen_code"] == {**summary["by_harness"]["qwen_code"], "accepted": 0, "errors": 1}
    repo = summary["by_repo"]["org/stats"]
    assert repo["attempts"] == 2 and repo["accepted"] == 1 and repo["acceptance_rate"] == 0.5
    assert summary["by_harness_repo"]["pi"]["org/stats"]["accepted"] == 1


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for cls in a.get("class", "").split():
            self.found.append((cls, a))


def test_report_shows_lanes_roles_credit_and_tokens(tmp_path: Path) -> None:
    from nemo_polar.credit.runio import credit_run_dir

    s, records = _session()
    (tmp_path / "trajectories.jsonl").write_bytes(s.to_json(compact=False) + b"\n")
    (tmp_path / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in records))
    credit_run_dir(tmp_path)
    html = render_report(tmp_path)
    assert "<script" not in html and "https://" not in html and "http://" not in html
    dom = _Dom()
    dom.feed(html)
    sessions = [a for c, a in dom.found if c == "session"]
    assert [(a["data-session-id"], a["data-harness"], a["data-reward"]) for a in sessions] == [("s1", "pi", "1.0")]
    calls = [a for c, a in dom.found if c == "call"]
    credit = {c["record_id"]: c for c in json.loads((tmp_path / "credit.jsonl").read_text())["calls"]}
    assert sorted(a["data-record-id"] for a in calls) == ["r0", "r1", "r2", "r3"]
    for a in calls:
        assert a["data-role"] == credit[a["data-record-id"]]["role"] in ("IG", "AE", "RV", "OTHER")
        assert float(a["data-credit"]) == pytest.approx(credit[a["data-record-id"]]["credit"])
    assert {a["data-record-id"]: a["data-chain"] for a in calls}["r2"] == "side"
    lanes = [a["data-chain"] for c, a in dom.found if c == "lane"]
    assert lanes[0] == "main" and "side" in lanes
    toks = [c for c, _ in dom.found if c in ("trainable", "masked")]
    assert "trainable" in toks


def test_report_decodes_tokens_with_a_tokenizer(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(1000)}, unk_token="w0"))
    tok.decoder = tokenizers.decoders.WordPiece()
    tok.save(str(tmp_path / "tokenizer.json"))
    s, records = _session()
    run = tmp_path / "run"
    run.mkdir()
    (run / "trajectories.jsonl").write_bytes(s.to_json(compact=False) + b"\n")
    (run / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in records))
    html = render_report(run, tokenizer=tmp_path)
    assert "w7 w8 w9" in html  # the sampled ids, decoded, in a trainable run
    assert "no credit.jsonl" in html


def test_progress_display_renders_stages_rewards_and_eta() -> None:
    import io

    from rich.console import Console

    from nemo_polar.collect.progress import CollectProgress

    buf = io.StringIO()
    s, _ = _session()
    with CollectProgress(Console(file=buf, force_terminal=True, width=160), live=True) as p:
        p.start(total=4, done=1)
        p.stages({"init": 1, "running": 1, "postrun": 0, "records": 3})
        p.result(s, generated_tokens=12)
        assert p.eta_s() is not None and p.tokens == 12
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    for text in ("resuming: 1/4", "RUNNING", "2/4 sessions finished", "finished median.pi#0 [pi] COMPLETED", "1.000"):
        assert text in out, text
