# SPDX-License-Identifier: Apache-2.0
"""`polar credit RUN_DIR` on a run directory built here (records as JSONL or SQLite)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_polar.cli import main
from nemo_polar.proxy.store import RecordStore
from nemo_polar.types import EvalResult, SessionResult

from .sessions import bugfix_steps, make_session, per_request_trajectory, prefix_merged_trajectory


def _run_dir(tmp: Path, store: str = "jsonl") -> Path:
    rd = tmp / "run"
    rd.mkdir()
    sessions = []
    records = []
    full = bugfix_steps()
    lazy = [s for s in full if s[0] != "Edit"]  # reads and tests, never edits: fails
    for i, (steps, reward, builder) in enumerate(
        [
            (full, 1.0, prefix_merged_trajectory),
            (lazy, 0.0, per_request_trajectory),
            (full, 1.0, per_request_trajectory),
            (full, 0.0, prefix_merged_trajectory),
        ]
    ):
        sid = f"sess{i}"
        recs = make_session(steps, session_id=sid)
        records += recs
        sessions.append(
            SessionResult(
                session_id=sid,
                task_id=f"task{i // 2}",
                sample_index=i % 2,
                harness="claude_code" if i < 2 else "codex",
                trajectory=builder(recs, reward),
                eval=EvalResult(reward=reward),
                record_ids=[r.id for r in recs],
                metadata={"group_id": f"g{i // 2}"},
            )
        )
    (rd / "trajectories.jsonl").write_bytes(b"".join(s.to_json() + b"\n" for s in sessions))
    if store == "jsonl":
        (rd / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in records))
    else:  # the proxy's own store, written through its API (credit reads it through the store's read API)
        store = RecordStore(rd).open()

        async def put() -> None:
            for r in records:
                await store.commit(r)

        try:
            asyncio.run(put())
        finally:
            store.close()
    return rd


@pytest.mark.parametrize("store", ["jsonl", "sqlite"])
def test_polar_credit_writes_credit_jsonl(tmp_path: Path, store: str, capsys: pytest.CaptureFixture[str]) -> None:
    rd = _run_dir(tmp_path, store)
    assert main(["credit", str(rd)]) == 0
    out = capsys.readouterr().out
    assert "Reward-hacking rate" in out and "Weaknesses" in out and "claude_code" in out
    lines = [json.loads(x) for x in (rd / "credit.jsonl").read_text().splitlines()]
    assert [x["session_id"] for x in lines] == ["sess0", "sess1", "sess2", "sess3"]
    s0 = lines[0]
    assert s0["reward"] == 1.0 and s0["advantage"] > 0 and s0["group_id"] == "g0"
    assert [c["role"] for c in s0["calls"]] == ["IG", "IG", "IG", "IG", "AE", "RV", "AE", "RV", "OTHER"]
    assert 1 in s0["calls"][4]["parents"] and s0["calls"][4]["record_id"] == "sess0-r4"
    assert all(c["evidence"] for c in s0["calls"])
    assert sum(c["credit"] for c in s0["calls"]) / len(s0["calls"]) == pytest.approx(s0["advantage"])
    assert lines[1]["advantage"] < 0 and all(c["credit"] <= 0 for c in lines[1]["calls"])
    # same task reward in group g1 (1.0 vs 0.0) but another harness
    assert lines[2]["harness"] == "codex" and lines[2]["advantage"] > 0


def test_polar_credit_json_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rd = _run_dir(tmp_path)
    assert main(["credit", str(rd), "--json", "--out", "c2.jsonl"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (rd / "c2.jsonl").exists()
    assert summary["sessions"] == 4 and summary["calls"] == 9 * 3 + 7
    assert summary["reward_hacking"]["n_successful"] == 2
    assert summary["reward_hacking"]["rate"] <= summary["reward_hacking_broadcast"]["rate"]
    weak = summary["weaknesses"]["claude_code"]
    assert weak["unused_reads"]["count"] >= 2 and weak["reads"] >= 8
    assert set(summary["role_distributions"]) == {"claude_code", "codex"}


def test_polar_credit_config_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rd = _run_dir(tmp_path)
    cfg = tmp_path / "cc.yaml"
    cfg.write_text("propagation:\n  rescale: none\n  gamma: 0.5\nfusion:\n  alpha: 1.0\n")
    assert main(["credit", str(rd), "--config", str(cfg), "--json"]) == 0
    capsys.readouterr()
    line = json.loads((rd / "credit.jsonl").read_text().splitlines()[0])
    assert line["scale"] == 1.0
    bad = tmp_path / "bad.json"
    bad.write_text('{"propagation": {"gamma": 2, "nope": 1}}')
    assert main(["credit", str(rd), "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "gamma" in err and "nope" in err  # every error reported at once
    assert main(["credit", str(tmp_path / "missing")]) == 2


def test_polar_console_script(tmp_path: Path) -> None:
    rd = _run_dir(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_polar.cli", "credit", str(rd), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["sessions"] == 4


def test_polar_run_layout_with_the_real_store_and_builder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The layout `polar run` writes: one Trace per line, the proxy's records.sqlite, summary.json."""
    from nemo_polar.trajectory import build
    from nemo_polar.trajectory.export import traces_to_jsonl

    rd = tmp_path / "run"
    recs = make_session(bugfix_steps(), session_id="live1")
    store = RecordStore(rd).open()

    async def put() -> None:
        for r in recs:
            await store.commit(r)
        await store.put_session("live1", "secret", 0.0, {"harness": "claude_code"})

    try:
        asyncio.run(put())
    finally:
        store.close()
    (rd / "trajectories.jsonl").write_bytes(traces_to_jsonl(build(recs, builder="prefix_merging", reward=1.0)))
    (rd / "summary.json").write_text(json.dumps({"harness": "claude_code", "session_id": "live1"}))
    assert main(["credit", str(rd), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sessions"] == 1 and summary["calls"] == len(recs)
    (line,) = [json.loads(x) for x in (rd / "credit.jsonl").read_text().splitlines()]
    assert line["session_id"] == "live1" and line["harness"] == "claude_code" and line["reward"] == 1.0
    assert [c["role"] for c in line["calls"]] == ["IG", "IG", "IG", "IG", "AE", "RV", "AE", "RV", "OTHER"]


def test_export_dpo_pairs_from_calibrated_calls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`export_dpo` (`polar export dpo`): the decisive edit of each successful session replaced by a wrong one
    (Δ = 1 > θ_AE) gives a pair chosen = the recorded edit, rejected = the counterfactual."""
    from nemo_polar.credit.cli import export_dpo
    from nemo_polar.credit.config import CallCreditConfig

    from .cf_runner import InProcessRunner

    src = "/repo/src/utils/dates.py"
    initial = {src: "def parse_date(s):\n    return datetime.datetime.strptime(s, FMT).date()\n"}
    wrong = {"tool": "Edit", "arguments": {"file_path": src, "old_string": "strptime", "new_string": "strftime"}}
    rd = _run_dir(tmp_path)
    cfg = CallCreditConfig.model_validate(
        {"counterfactual": {"budget": 4, "alternative": "plan", "max_per_trajectory": 2}}
    )
    plans = {f"sess{i}-r{k}": wrong for i in (0, 2) for k in (4, 6)}
    runner = InProcessRunner(initial, lambda files: ".strip()" in files.get(src, ""))
    out = tmp_path / "dpo.jsonl"
    n = export_dpo(rd, out, cfg, runner=runner, plans=plans)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert n == len(rows) >= 1
    for row in rows:
        assert row["role"] == "AE" and row["delta"] == 1.0 and not row["swapped"]
        assert row["rejected"]["tool_calls"] and row["chosen"] != row["rejected"]
    # without measurements there is nothing to export: a clear error, and the CLI refuses without a URL
    with pytest.raises(ValueError, match="no counterfactual measurements"):
        export_dpo(rd, out, CallCreditConfig())
    assert main(["credit", str(rd), "--dpo", str(out)]) == 2
    assert main(["credit", str(rd), "--counterfactual", "http://127.0.0.1:9"]) == 2
    assert "off by default" in capsys.readouterr().err
