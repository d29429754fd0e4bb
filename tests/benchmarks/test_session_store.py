# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/session_store.py`'s cases on a tiny session through the real `RecordStore`: every read path returns
the committed records, deltas make the store smaller, and its check catches a record that differs. The full-size
run is `make bench`'s."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from nemo_polar.proxy.deltas import MIN_KEY_IDS
from nemo_polar.proxy.store import record_bytes

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import session_store  # noqa: E402

# the smallest prompt that can be a key, growing 200 ids a call: two deltas, then a new key (past a quarter of it)
CALLS, START, END, ANSWER, SESSIONS = 6, MIN_KEY_IDS, MIN_KEY_IDS + 1000, 64, 2


@pytest.fixture(scope="module")
def sessions() -> dict[bool, list[list[session_store.CompletionRecord]]]:
    """Per `stream`: two tiny sessions' records."""
    return {
        stream: [session_store.session_records(s, CALLS, START, END, ANSWER, stream) for s in range(SESSIONS)]
        for stream in (False, True)
    }


def test_the_session_grows_as_an_agent_session(
    sessions: dict[bool, list[list[session_store.CompletionRecord]]],
) -> None:
    one = sessions[False][0]
    ids = [list(r.prompt_token_ids) for r in one]
    assert [len(i) for i in ids] == [START + 200 * i for i in range(CALLS)]
    for prev, rec, cur in zip(one, one[1:], ids[1:], strict=False):
        assert cur[: len(prev.prompt_token_ids) + ANSWER] == list(prev.prompt_token_ids) + list(
            prev.generation_token_ids
        )
        msgs = rec.original_request["messages"]
        assert msgs[: len(prev.original_request["messages"])] == prev.original_request["messages"]
        assert [m["role"] for m in msgs[-2:]] == ["assistant", "tool"]
        assert (
            msgs[-2]["content"] == prev.response["content"] and msgs[-2]["tool_calls"] == prev.response["tool_calls"]
        )
        # fresh objects per call, as the proxy parses each request anew
        assert msgs is not prev.original_request["messages"] and msgs[0] is not prev.original_request["messages"][0]
        assert rec.request["messages"] is not prev.request["messages"]
    assert len({r.session_id for s in sessions[False] for r in s}) == SESSIONS
    order = session_store.interleave(sessions[False])
    assert [(r.session_id, r.seq) for r in order[:3]] == [("sess-0-0", 0), ("sess-0-1", 0), ("sess-0-0", 1)]


@pytest.mark.parametrize("stream", [False, True], ids=["final", "pending+final"])
def test_deltas_read_back_whole_and_smaller(
    tmp_path: Path, stream: bool, sessions: dict[bool, list[list[session_store.CompletionRecord]]]
) -> None:
    recs = session_store.interleave(sessions[stream])
    # run_case checks every record read back by list_records, get_record and read_records(ids=...)
    whole = session_store.run_case(tmp_path / "whole", recs, SESSIONS, stream, deltas=False)
    deltas = session_store.run_case(tmp_path / "deltas", recs, SESSIONS, stream, deltas=True)
    alone = session_store.run_case(tmp_path / "alone", sessions[stream][0], 1, stream, deltas=True)
    assert whole.delta_records == 0
    assert deltas.delta_records > 0 and alone.delta_records > 0
    assert 0 < deltas.disk_bytes < whole.disk_bytes
    rows = session_store.rows_for("2 sessions", "final", SESSIONS, len(recs), whole, deltas)
    assert rows[0][2] == "whole" and rows[1][2] == "deltas" and "x)" in rows[1][4]


def test_check_names_the_record_that_differs(sessions: dict[bool, list[list[session_store.CompletionRecord]]]) -> None:
    recs = sessions[False][0][:2]
    expected = {r.id: record_bytes(r) for r in recs}
    ids = [r.id for r in recs]
    session_store.check("p", recs, ids, expected)
    changed = dict(expected)
    d = orjson.loads(changed[ids[1]])
    d["original_request"]["messages"].pop()
    changed[ids[1]] = orjson.dumps(d)
    with pytest.raises(session_store.Mismatch, match=f"p: record {ids[1]} differs .* original_request"):
        session_store.check("p", recs, ids, changed)
    with pytest.raises(session_store.Mismatch, match="not found"):
        session_store.check("p", [recs[0], None], ids, expected)
    with pytest.raises(session_store.Mismatch, match="1 records read back, 2 committed"):
        session_store.check("p", recs[:1], ids, expected)


def test_args() -> None:
    q = session_store.parse_args(["--quick"])
    assert (q.calls, q.sessions, q.batch, q.repeat) == (20, 4, 4, 2)
    d = session_store.parse_args([])
    assert (d.calls, d.start, d.end, d.answer, d.sessions, d.batch, d.repeat) == (50, 7000, 30000, 512, 8, 8, 3)
    with pytest.raises(SystemExit):
        session_store.parse_args(["--start", "10", "--end", "5"])


def test_main_fails_on_a_record_read_back_changed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--calls", "3", "--start", "1100", "--end", "1400", "--answer", "16", "--sessions", "2", "--repeat", "1"]
    argv += ["--dir", str(tmp_path)]
    assert session_store.main(argv) == 0
    assert "| 2 sessions, batch 2 | final | deltas |" in capsys.readouterr().out
    real = session_store.read_records

    def changed(directory: Path, **kw: object) -> list[session_store.CompletionRecord]:
        out = real(directory, **kw)  # type: ignore[arg-type]
        out[-1].original_request["messages"].pop()
        return out

    monkeypatch.setattr(session_store, "read_records", changed)
    assert session_store.main(argv) == 1
    err = capsys.readouterr().err
    assert "read_records(ids=...): record" in err and "differs from the one committed in original_request" in err


def test_replay_recommits_a_stores_sessions_per_harness(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sessions: dict[bool, list[list[session_store.CompletionRecord]]],
) -> None:
    """`--replay RUN_DIR`: an existing store's records, grouped by harness (the rollout service's session names),
    committed again through both stores and read back checked."""
    import asyncio
    import dataclasses

    from nemo_polar.proxy.store import RecordStore

    def named(r: session_store.CompletionRecord) -> session_store.CompletionRecord:
        harness = "pi" if r.session_id.endswith("0") else "qwen_code"
        return dataclasses.replace(r, session_id=f"median.{harness}.{r.session_id}.a0")

    recs = [named(r) for s in sessions[False] for r in s]  # copies: the fixture is shared
    store = RecordStore(tmp_path / "run").open()

    async def fill() -> None:
        for r in recs:
            await store.commit(r)

    asyncio.run(fill())
    store.close()
    argv = ["--replay", str(tmp_path / "run"), "--repeat", "1", "--dir", str(tmp_path)]
    assert session_store.main(argv) == 0
    out = capsys.readouterr().out
    for harness in ("pi", "qwen_code"):
        assert f"| run: {harness}, 1 sessions, {CALLS} calls | final | deltas |" in out
    assert (
        session_store.harness_of(recs[0]) == "pi" and session_store.harness_of(sessions[True][0][0]) == "openai_chat"
    )
