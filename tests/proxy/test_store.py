# SPDX-License-Identifier: Apache-2.0
"""The record store: durable, batched commits; pending rows recovered as failures; sessions persisted."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from nemo_polar.proxy.sessions import SessionManager
from nemo_polar.proxy.store import PAGE_SIZE, RecordStore, record_bytes
from nemo_polar.types import CompletionRecord


def old_store_db(directory, page_size: int | None = None) -> sqlite3.Connection:
    """An empty store database as earlier versions created it (`page_size`: theirs; None: SQLite's default), with
    the schema they used; the open connection is returned for the caller to fill and close."""
    db = sqlite3.connect(directory / "records.sqlite", isolation_level=None)
    if page_size is not None:
        db.execute(f"PRAGMA page_size={page_size}")
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(
        "CREATE TABLE records (id TEXT PRIMARY KEY, session_id TEXT NOT NULL, seq INTEGER NOT NULL,"
        " state TEXT NOT NULL, failed INTEGER NOT NULL, data BLOB NOT NULL);"
        "CREATE INDEX records_by_session ON records (session_id, seq);"
        "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, api_key TEXT NOT NULL UNIQUE,"
        " created_at REAL NOT NULL, data BLOB NOT NULL);"
    )
    return db


def _rec(i: int, session: str = "s1", **kw) -> CompletionRecord:
    return CompletionRecord(
        id=f"r{i}",
        session_id=session,
        seq=i,
        dialect="openai_chat",
        prompt_token_ids=list(range(1000)),
        generation_token_ids=[5, 6, 7],
        generation_log_probs=[-0.5, -0.25, 0.0],
        **kw,
    )


@pytest.mark.parametrize("fsync", [False, True], ids=["inline-normal", "thread-full"])
def test_concurrent_commits_are_batched_and_round_trip(tmp_path, fsync):
    store = RecordStore(tmp_path, fsync=fsync).open()

    async def main():
        await asyncio.gather(*(store.commit(_rec(i)) for i in range(64)))

    asyncio.run(main())
    assert store.writes == 64
    assert store.batches < 64  # commits of concurrent requests share transactions
    got = store.list_records("s1", limit=1000)
    assert [r.seq for r in got] == list(range(64))
    assert got[3].prompt_token_ids == list(range(1000))
    assert got[3].generation_log_probs == [-0.5, -0.25, 0.0]
    assert record_bytes(got[3]) == got[3].to_json(compact=True) or CompletionRecord.from_json(
        record_bytes(got[3])
    ) == CompletionRecord.from_json(got[3].to_json(compact=True))
    page = store.list_records("s1", after_seq=9, limit=5)
    assert [r.seq for r in page] == [10, 11, 12, 13, 14]
    assert store.get_record("r7").id == "r7"
    assert store.get_record("nope") is None
    store.close()
    # data is really on disk: a fresh plain sqlite connection sees it
    conn = sqlite3.connect(tmp_path / "records.sqlite")
    assert conn.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 64
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE  # a new database's pages (store docstring)


def test_pending_rows_become_interrupted_failures_on_reopen(tmp_path):
    store = RecordStore(tmp_path).open()

    async def main():
        pending = CompletionRecord(id="p1", session_id="s1", seq=0, dialect="openai_chat")
        pending.original_request = {"messages": [{"role": "user", "content": "cut"}]}
        pending.request = {"messages": [{"role": "user", "content": "cut"}], "sampling": {}}
        await store.put_pending(pending)
        await store.commit(_rec(1))

    asyncio.run(main())
    assert [r.id for r in store.list_records("s1")] == ["r1"]  # pending rows are not listed
    # the placeholder keeps the caller's request but not its normalised copy (one copy of the prompt on disk)
    placeholder = store.list_records("s1", include_pending=True)[0]
    assert placeholder.original_request["messages"][0]["content"] == "cut" and placeholder.request == {}
    store.close()
    again = RecordStore(tmp_path).open()
    recs = {r.id: r for r in again.list_records("s1")}
    assert recs["p1"].error["type"] == "interrupted"
    assert recs["p1"].original_request["messages"][0]["content"] == "cut"
    assert recs["r1"].error is None
    assert again.session_stats("s1") == {"records": 2, "failed": 1, "next_seq": 2}
    again.close()


def test_sessions_survive_restart_with_counters(tmp_path):
    store = RecordStore(tmp_path).open()
    mgr = SessionManager(store)

    async def main():
        s = await mgr.create(
            task_id="t", sampling={"temperature": 0.5}, plan={"version": 1, "steps": [{"live": True}]}
        )
        await store.commit(_rec(0, session=s.session_id))
        await store.commit(_rec(1, session=s.session_id, call_kind="side"))
        await mgr.close(s.session_id)
        return s

    s = asyncio.run(main())
    store.close()
    store2 = RecordStore(tmp_path).open()
    mgr2 = SessionManager(store2)
    assert mgr2.load() == 1
    s2 = mgr2.by_key(s.api_key)
    assert s2 is not None and s2.session_id == s.session_id
    assert s2.sampling == {"temperature": 0.5} and s2.closed
    assert s2.next_seq == 2 and s2.main_calls == 1
    assert mgr2.by_key("polar-unknown") is None
    store2.close()


def test_a_streams_final_record_updates_its_placeholder_in_place(tmp_path):
    """The final record of a stream rewrites the placeholder's row once written (same rowid, no delete and
    re-insert of its index entries); what is read back is exactly the final record. A placeholder whose row is gone
    still gets its final record's."""
    store = RecordStore(tmp_path).open()
    db = sqlite3.connect(tmp_path / "records.sqlite", isolation_level=None)

    def rowid(rid):
        return db.execute("SELECT rowid FROM records WHERE id = ?", (rid,)).fetchone()

    async def main():
        placeholders = [
            CompletionRecord(id=f"r{i}", session_id="s1", seq=i, dialect="openai_chat", original_request={"i": i})
            for i in range(3)
        ]
        await asyncio.gather(*(store.put_pending(p) for p in placeholders))
        store.write_rows()  # rows follow the frames (store docstring): written now, not within `rows_every_s`
        before = {p.id: rowid(p.id) for p in placeholders}
        await store.commit(_rec(5))  # a later, non-streamed call takes the next rowid
        store.write_rows()
        db.execute("DELETE FROM records WHERE id = 'r2'")  # as if the placeholder had not been written
        await asyncio.gather(*(store.commit(_rec(i, original_request={"i": i})) for i in range(3)))
        store.write_rows()
        return before

    before = asyncio.run(main())
    assert rowid("r0") == before["r0"] and rowid("r1") == before["r1"]  # updated in place
    assert rowid("r2") is not None and rowid("r2") != before["r2"]  # inserted anew
    raw = store.list_records_raw("s1")
    assert raw == [record_bytes(_rec(i, original_request={"i": i})) for i in range(3)] + [record_bytes(_rec(5))]
    assert db.execute("SELECT state, failed FROM records WHERE id = 'r1'").fetchone() == ("done", 0)
    assert store._pending_ids == set()
    db.close()
    store.close()


@pytest.mark.parametrize("page_size", [8192, 16384])
def test_a_store_created_with_other_pages_keeps_them_and_reads_back(tmp_path, page_size):
    """A store made before the current page size (SQLite's 4 KiB default, then 8 KiB) opens as it is: its records
    and a killed run's placeholder read back, and new writes (placeholder, then final) go into the same file."""
    db = old_store_db(tmp_path, page_size)
    placeholder = CompletionRecord(id="p0", session_id="s1", seq=0, dialect="openai_chat", original_request={"a": 1})
    db.execute(
        "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?)",
        ("p0", "s1", 0, "pending", 0, record_bytes(placeholder, pending=True)),
    )
    db.execute("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?)", ("r1", "s1", 1, "done", 0, record_bytes(_rec(1))))
    db.close()
    store = RecordStore(tmp_path).open()

    async def main():
        streamed = _rec(2)
        await store.put_pending(streamed)
        await store.commit(streamed)

    asyncio.run(main())
    got = store.list_records("s1")
    assert [r.id for r in got] == ["p0", "r1", "r2"]
    assert got[0].error["type"] == "interrupted" and got[0].original_request == {"a": 1}
    assert got[1] == _rec(1) and got[2] == _rec(2)
    store.close()
    with sqlite3.connect(tmp_path / "records.sqlite") as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == page_size


@pytest.mark.parametrize("at_once", [True, False], ids=["at-once", "next-turn"])
def test_a_commit_written_at_once_takes_no_loop_turn_and_never_overtakes_a_queued_op(tmp_path, at_once):
    store = RecordStore(tmp_path).open()
    if at_once:
        store.write_at_once = lambda: True

    async def main():
        turns: list[str] = []
        asyncio.get_running_loop().call_soon(turns.append, "turn")
        await store.commit(_rec(1))
        assert turns == ([] if at_once else ["turn"])  # at once: committed without yielding to the event loop
        assert store.batches == 1
        pending = store.put_pending(_rec(3))  # a placeholder too: at once within the call, else at the next turn
        assert pending.done() == at_once and store.batches == (2 if at_once else 1)
        await store.commit(_rec(3))
        await pending
        assert store.batches == (3 if at_once else 2)  # next turn: the placeholder shared its final record's batch
        answers = iter([False, True])
        store.write_at_once = lambda: next(answers)  # the placeholder queued, its final record asked to go at once
        pending = store.put_pending(_rec(2))
        await store.commit(_rec(2))  # shares the queued batch: a placeholder is never written after its final record
        await pending
        assert store.batches == (4 if at_once else 3)

    asyncio.run(main())
    got = store.list_records("s1")  # done records only: the placeholders were replaced
    assert [(r.seq, r.error) for r in got] == [(1, None), (2, None), (3, None)]
    assert store.get_record("r2").prompt_token_ids == list(range(1000))
    store.close()


@pytest.mark.parametrize("at_once", [True, False], ids=["at-once", "next-turn"])
def test_a_lone_commit_whose_frame_fails_fails_alone_and_the_next_one_is_kept(tmp_path, monkeypatch, at_once):
    """A frame written within the call (`write_at_once`, a record of its own: `RecordStore._write_one`) fails as a
    batch does: the caller gets the retryable `StoreWriteError`, nothing of it is read back, a delta against it is
    written whole, and the store goes on."""
    from nemo_polar.proxy import payloads
    from nemo_polar.proxy.store import StoreWriteError

    store = RecordStore(tmp_path).open()
    store.write_at_once = lambda: at_once
    real = payloads.os.pwritev
    longer = _rec(2)
    longer.prompt_token_ids = list(range(1100))

    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    async def main():
        monkeypatch.setattr(payloads.os, "pwritev", full)
        with pytest.raises(StoreWriteError, match="No space left"):
            await store.commit(_rec(1))
        monkeypatch.setattr(payloads.os, "pwritev", real)
        await store.commit(longer)  # its prompt extends r1's: written whole, not against r1
        await store.commit(_rec(3))

    asyncio.run(main())
    assert store.get_record("r1") is None and "r1" in store._lost
    assert store.get_record("r2") == longer and store.delta_records == 0
    assert [r.id for r in store.list_records("s1")] == ["r2", "r3"] and store.batches == 3
    store.close()


def test_rows_owed_get_their_timer_even_when_a_lone_commit_fails(tmp_path, monkeypatch):
    """A record's row is owed, its timer died with the loop it was armed on; a lone commit on a new loop fails: the
    rows owed are still written within `rows_every_s`, as a failed batch arms them too."""
    from nemo_polar.proxy import payloads
    from nemo_polar.proxy.store import StoreWriteError

    store = RecordStore(tmp_path).open()
    store.write_at_once = lambda: True
    store.rows_every_s = 0.05

    async def first():
        await store.commit(_rec(1))  # its row owed, the timer armed on this loop, which ends before it fires

    async def second():
        monkeypatch.setattr(payloads.os, "pwritev", lambda *a: (_ for _ in ()).throw(OSError(28, "disk full")))
        with pytest.raises(StoreWriteError):
            await store.commit(_rec(2))
        monkeypatch.undo()
        await asyncio.sleep(0.3)

    asyncio.run(first())
    asyncio.run(second())
    with sqlite3.connect(tmp_path / "records.sqlite") as db:
        assert db.execute("SELECT id FROM records").fetchall() == [("r1",)]
    assert store._rows == {}
    store.close()
