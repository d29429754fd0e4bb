# SPDX-License-Identifier: Apache-2.0
"""`polar export sft` is rejection sampling: accepted sessions only by default, the threshold in its output,
`--all` for the rest. The run directory is written by hand (records.jsonl, trajectories.jsonl) with the real
trajectory builder; the command is the real `polar` parser."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from nemo_polar.collect import cli
from nemo_polar.trajectory import build
from nemo_polar.types import CompletionRecord, EvalResult, SessionResult


def _session(sid: str, reward: float) -> tuple[SessionResult, list[CompletionRecord]]:
    messages = [{"role": "user", "content": f"task of {sid}"}]
    rec = CompletionRecord(
        id=f"{sid}-r0",
        session_id=sid,
        seq=0,
        dialect="openai_chat",
        arrived_at=1000.0,
        finished_at=1001.0,
        request={"messages": messages},
        response={"content": f"answer of {sid}"},
        finish_reason="stop",
        prompt_token_ids=[1, 2, 3],
        generation_token_ids=[4, 5],
        generation_log_probs=[-0.1, -0.2],
        call_kind="main",
    )
    traj = build([rec], builder="per_request", reward=reward)
    result = SessionResult(
        session_id=sid,
        task_id=f"task.{sid}",
        harness="pi",
        trajectory=traj,
        eval=EvalResult(reward=reward, resolved=reward >= 1.0),
        record_ids=[rec.id],
    )
    return result, [rec]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    rd = tmp_path / "run"
    rd.mkdir()
    sessions = [_session("good", 1.0), _session("half", 0.5), _session("bad", 0.0)]
    (rd / "trajectories.jsonl").write_bytes(b"".join(s.to_json() + b"\n" for s, _ in sessions))
    (rd / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for _, recs in sessions for r in recs))
    return rd


def _export(run_dir: Path, out: Path, *flags: str) -> int:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["export", "sft", str(run_dir), "--out", str(out), *flags])
    return int(args.func(args))


def _sessions(out: Path) -> list[str]:
    return [json.loads(x)["metadata"]["session_id"] for x in out.read_text().splitlines()]


def test_default_exports_accepted_sessions_only_and_says_the_threshold(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sft.jsonl"
    assert _export(run_dir, out) == 0
    assert _sessions(out) == ["good"]
    printed = capsys.readouterr().out
    assert "reward >= 1" in printed and "2 rejected" in printed and "--all" in printed
    assert json.loads(out.read_text())["metadata"]["accepted"] is True


def test_threshold_and_all(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sft.jsonl"
    assert _export(run_dir, out, "--accept-threshold", "0.5") == 0
    assert sorted(_sessions(out)) == ["good", "half"]
    assert "reward >= 0.5" in capsys.readouterr().out
    assert _export(run_dir, out, "--all") == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(x["metadata"]["session_id"] for x in lines) == ["bad", "good", "half"]
    assert {x["metadata"]["session_id"]: x["metadata"]["accepted"] for x in lines} == {
        "good": True,
        "half": False,
        "bad": False,
    }
