# SPDX-License-Identifier: Apache-2.0
"""Scripted coding-agent sessions as real `CompletionRecord`s, and hand-built per_request / prefix_merging
trajectories over them, for the CALL-CREDIT tests and the benchmark.

A session is a list of steps `(tool, arguments, observation)` (tool None + `{"content": …}` for a tool-less
reply). Records carry the normalised OpenAI-Chat history the proxy would store: each request repeats the
previous messages plus the tool results of the previous call. Token ids are synthetic but consistent (the
generation of call k is `len` ids; the prompt of call k+1 extends the prompt of call k by the generation and
an interstitial block), so spans and masks are exact. The trajectory builders here are a stand-in for
`nemo_polar.trajectory` (not released yet) and follow the Trace layout of docs/contracts.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nemo_polar.credit.graph import CallGraph, CallNode, Edge

from nemo_polar.types import CompletionRecord, Trace, Trajectory, TrajectoryStats

Step = tuple[str | None, dict[str, Any], str | None]


def make_session(
    steps: Sequence[Step],
    *,
    session_id: str = "s0",
    task: str = "Fix the bug.",
    gen_len: int | Sequence[int] = 5,
    inter_len: int = 3,
    with_ids: bool = True,
) -> list[CompletionRecord]:
    """Records of one main-agent session following `steps` (the last record has no tool calls)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": task},
    ]
    prompt_ids = list(range(1000, 1010))
    recs = []
    next_tok = 1
    for k, (tool, args, obs) in enumerate(steps):
        n = gen_len if isinstance(gen_len, int) else gen_len[k]
        gen = list(range(next_tok, next_tok + n))
        next_tok += n
        if tool is None:
            response = {"content": args.get("content", ""), "reasoning": None, "tool_calls": []}
        else:
            cid = f"call_{session_id}_{k}" if with_ids else None
            response = {
                "content": "",
                "reasoning": None,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}
                ],
            }
        recs.append(
            CompletionRecord(
                id=f"{session_id}-r{k}",
                session_id=session_id,
                seq=k,
                dialect="openai_chat",
                request={"messages": [dict(m) for m in messages]},
                response=response,
                finish_reason="tool_calls" if tool else "stop",
                prompt_token_ids=list(prompt_ids),
                generation_token_ids=gen,
                generation_log_probs=[-0.5] * n,
            )
        )
        assistant: dict[str, Any] = {"role": "assistant", "content": response["content"]}
        if response["tool_calls"]:
            assistant["tool_calls"] = response["tool_calls"]
        messages.append(assistant)
        if obs is not None:
            if tool is None:
                messages.append({"role": "user", "content": obs})
            else:
                m: dict[str, Any] = {"role": "tool", "content": obs}
                if with_ids:
                    m["tool_call_id"] = response["tool_calls"][0]["id"]
                messages.append(m)
        inter = list(range(50000 + 100 * k, 50000 + 100 * k + inter_len))
        prompt_ids = prompt_ids + gen + inter
    # a final text-only reply closes the session
    return recs


def per_request_trajectory(records: Sequence[CompletionRecord], reward: float | None = None) -> Trajectory:
    traces = [
        Trace(
            prompt_ids=list(r.prompt_token_ids),
            response_ids=list(r.generation_token_ids),
            loss_mask=[1] * len(r.generation_token_ids),
            response_logprobs=list(r.generation_log_probs),
            call_spans=[(r.id, 0, len(r.generation_token_ids))],
            reward=reward,
        )
        for r in records
    ]
    return Trajectory(traces=traces, stats=TrajectoryStats(chains=len(traces), records=len(records)))


def prefix_merged_trajectory(records: Sequence[CompletionRecord], reward: float | None = None) -> Trajectory:
    """One chain: prompt of call 0, then per call its generation (mask 1) and the next prompt's delta (mask 0)."""
    first = list(records[0].prompt_token_ids)
    resp: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    spans = []
    for k, r in enumerate(records):
        start = len(resp)
        resp += r.generation_token_ids
        mask += [1] * len(r.generation_token_ids)
        lps += r.generation_log_probs
        spans.append((r.id, start, len(resp)))
        if k + 1 < len(records):
            nxt = records[k + 1].prompt_token_ids
            delta = nxt[len(first) + len(resp) :]
            resp += delta
            mask += [0] * len(delta)
            lps += [0.0] * len(delta)
    tr = Trace(
        prompt_ids=first, response_ids=resp, loss_mask=mask, response_logprobs=lps, call_spans=spans, reward=reward
    )
    return Trajectory(traces=[tr], stats=TrajectoryStats(chains=1, records=len(records), merged=len(records) - 1))


PYTEST_FAIL = (
    "F.\n=================================== FAILURES ===================================\n"
    "________________________________ test_strip ________________________________\n"
    "    def test_strip():\n>       assert parse_date(' 2024-01-01').year == 2024\n"
    "src/utils/dates.py:6: in parse_date\nE   ValueError: time data ' 2024-01-01' does not match format\n"
    "FAILED tests/test_dates.py::test_strip - ValueError\n1 failed, 1 passed in 0.05s"
)
PYTEST_PASS = "..\n2 passed in 0.04s"


def bugfix_steps(harness: str = "claude_code") -> list[Step]:
    """A typical successful session: search, read, unrelated reads, edit, failing test, fix, passing test."""
    if harness == "claude_code":
        return [
            ("Grep", {"pattern": "def parse_date", "path": "src"}, "src/utils/dates.py:5:def parse_date(s):"),
            (
                "Read",
                {"file_path": "/repo/src/utils/dates.py"},
                "     1\timport datetime\n     2\tFMT = '%Y-%m-%d'\n     5\tdef parse_date(s):\n"
                "     6\t    return datetime.datetime.strptime(s, FMT).date()\n",
            ),
            ("Read", {"file_path": "/repo/README.md"}, "     1\t# dates\n     2\tA tiny library.\n"),
            ("Bash", {"command": "ls docs"}, "index.md\nusage.md"),
            (
                "Edit",
                {
                    "file_path": "/repo/src/utils/dates.py",
                    "old_string": "strptime(s, FMT)",
                    "new_string": "strptime(s.strip(), FMT)",
                },
                "The file /repo/src/utils/dates.py has been updated.",
            ),
            ("Bash", {"command": "python -m pytest tests/test_dates.py -q"}, PYTEST_FAIL),
            (
                "Edit",
                {"file_path": "/repo/src/utils/dates.py", "old_string": "s.strip()", "new_string": "str(s).strip()"},
                "The file /repo/src/utils/dates.py has been updated.",
            ),
            ("Bash", {"command": "python -m pytest tests/test_dates.py -q"}, PYTEST_PASS),
            (None, {"content": "Fixed parse_date to strip whitespace."}, None),
        ]
    raise ValueError(harness)


def synthetic_graph(
    roles: Sequence[str],
    edges: Sequence[tuple[int, int]],
    *,
    session_id: str = "g",
    harness: str | None = "claude_code",
    n_tokens: Sequence[int] | None = None,
    outcomes: Sequence[str | None] | None = None,
) -> CallGraph:
    """A `CallGraph` given directly by roles and edges (for the math tests)."""
    nodes = [
        CallNode(
            index=k,
            record_id=f"{session_id}-r{k}",
            seq=k,
            call_kind="main",
            role=r,
            evidence=["synthetic"],
            ambiguous=False,
            source="rule",
            n_tokens=n_tokens[k] if n_tokens else 5,
            paths_read=[],
            paths_written=[],
            test_targets=[],
            scoped=False,
            test_outcome=outcomes[k] if outcomes else None,
            summary=f"{r} call {k}",
        )
        for k, r in enumerate(roles)
    ]
    return CallGraph(session_id, harness, nodes, [Edge(i, j, ["path"], []) for i, j in edges])
