# SPDX-License-Identifier: Apache-2.0
"""Rows follow the frames (proxy/store.py's docstring): a committed record is readable at once, by `read_records`
and by every store object, before its row is written; its row comes within `rows_every_s`, or when a read needs it;
a process killed before writing its rows loses none of them; and the payload file's scan finds every intact frame
past torn bytes and padding."""

from __future__ import annotations

import asyncio
import os
import sqlite3

import orjson

from nemo_polar.proxy.payloads import PayloadFile
from nemo_polar.proxy.store import DB_NAME, PAYLOADS_NAME, WRITERS_DIR, RecordStore, read_records
from tests.proxy.test_store_payloads import _child, _rec


def _table(directory) -> dict[str, str]:
    """The `records` table itself, as any SQLite reader sees it: id -> state."""
    with sqlite3.connect(f"file:{directory / DB_NAME}?mode=ro", uri=True) as db:
        return dict(db.execute("SELECT id, state FROM records"))


def test_a_committed_record_is_read_before_its_row_is_written(tmp_path):
    store = RecordStore(tmp_path).open()
    store.rows_every_s = 3600.0  # no row unless a read or close asks for it

    async def main():
        await asyncio.gather(*(store.commit(_rec(i)) for i in range(3)))
        await store.put_pending(_rec(3))

    asyncio.run(main())
    assert _table(tmp_path) == {}  # committed: the frames are written, the rows are owed
    assert read_records(tmp_path) == [_rec(i) for i in range(3)]  # the frames past this writer's `since`
    assert [r.id for r in read_records(tmp_path, include_pending=True)] == ["r0", "r1", "r2", "r3"]
    assert store.get_record("r1") == _rec(1)  # a read through the store writes the rows first
    assert _table(tmp_path) == {"r0": "done", "r1": "done", "r2": "done", "r3": "pending"}
    assert read_records(tmp_path) == [_rec(i) for i in range(3)]  # rows and frames: each record once
    store.close()


def test_the_rows_owed_are_written_within_the_window_and_a_quick_stream_writes_one_row(tmp_path):
    store = RecordStore(tmp_path).open()
    store.rows_every_s = 0.05
    db = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
    written: list[str] = []
    assert store._inline_conn is not None
    store._inline_conn.set_trace_callback(written.append)

    async def main():
        await store.put_pending(_rec(0))
        await store.commit(_rec(0))  # the stream's final record within the window: its placeholder's row is skipped
        await store.commit(_rec(1))
        assert dict(db.execute("SELECT id, state FROM records")) == {}
        await asyncio.sleep(0.3)

    asyncio.run(main())
    assert dict(db.execute("SELECT id, state FROM records")) == {"r0": "done", "r1": "done"}
    assert sum("INSERT INTO records" in sql for sql in written) == 2  # one row each, one transaction
    assert sum(sql == "BEGIN IMMEDIATE" for sql in written) == 1
    db.close()
    store.close()


def test_another_store_objects_fresh_records_are_read_here(tmp_path):
    a = RecordStore(tmp_path).open()
    b = RecordStore(tmp_path).open()
    a.rows_every_s = b.rows_every_s = 3600.0

    async def main():
        await asyncio.gather(*(a.commit(_rec(i)) for i in range(2)))
        await a.put_pending(_rec(2))

    asyncio.run(main())
    assert b.get_record("r1") == _rec(1)  # b writes the rows a owes before it reads
    assert [r.id for r in b.list_records("s1", include_pending=True)] == ["r0", "r1", "r2"]
    assert b.session_stats("s1") == {"records": 3, "failed": 0, "next_seq": 3}

    async def finish():
        await a.commit(_rec(2))

    asyncio.run(finish())
    assert b.get_record("r2") == _rec(2)  # a's final record replaces the placeholder row b wrote
    locks = tmp_path / WRITERS_DIR
    assert _writers(tmp_path) == 2 and len(os.listdir(locks)) == 2  # both alive: a holds its lock
    a.close()
    assert _table(tmp_path) == {"r0": "done", "r1": "done", "r2": "done"}
    assert _writers(tmp_path) == 1 and len(os.listdir(locks)) == 1
    b.close()
    assert _writers(tmp_path) == 0 and os.listdir(locks) == []


def _writers(directory) -> int:
    with sqlite3.connect(f"file:{directory / DB_NAME}?mode=ro", uri=True) as db:
        return db.execute("SELECT COUNT(*) FROM writers").fetchone()[0]


def test_a_killed_writers_rows_are_written_by_the_next_open(tmp_path):
    child = _child(tmp_path, "k", 6, hold=True)  # commits 6 records and admits a 7th call, then waits to be killed
    try:
        assert child.stdout.readline().strip() == "committed"
        with sqlite3.connect(f"file:{tmp_path / DB_NAME}?mode=ro", uri=True) as db:
            (writers,) = db.execute("SELECT COUNT(*) FROM writers").fetchone()
        assert writers == 1
        assert read_records(tmp_path) == [_rec(i, "k") for i in range(6)]
    finally:
        child.kill()
        child.wait(timeout=30)
    store = RecordStore(tmp_path).open()  # the dead writer's rows, then its placeholder as an interrupted failure
    table = _table(tmp_path)
    assert {f"k-r{i}" for i in range(7)} <= set(table) and set(table.values()) == {"done"}
    assert store.get_record("k-r6").error["type"] == "interrupted"
    with sqlite3.connect(f"file:{tmp_path / DB_NAME}?mode=ro", uri=True) as db:
        assert db.execute("SELECT pid FROM writers").fetchall() == [(os.getpid(),)]  # only this one's
    store.close()
    assert read_records(tmp_path)[:6] == [_rec(i, "k") for i in range(6)]


def test_the_scan_finds_every_intact_frame_past_torn_bytes_and_padding(tmp_path):
    pf = PayloadFile(tmp_path / PAYLOADS_NAME, writable=True, direct_io=False)
    first = pf.append([b'{"a":1}', [b'{"b":', b"2}"]], [b'["a"]', b'["b"]'])
    with open(pf.path, "ab") as f:  # a writer killed in its write, then a direct write's padding
        f.write(b"PLRR\x40\x00\x00\x00torn" + b"\0" * 3000)
    plain = pf.append([b'{"plain":true}'])  # a frame without a meta is passed over
    last = pf.append([b'{"c":3}' * 100], [b'["c"]'])
    found = list(pf.scan(0))
    assert [meta for meta, _ in found] == [b'["a"]', b'["b"]', b'["c"]']
    assert [ref for _, ref in found] == [*first, *last]
    assert pf.resolve("b", found[1][1]) == b'{"b":2}' and pf.resolve("p", plain[0]) == b'{"plain":true}'
    assert list(pf.scan(len(b'{"a":1}'))) == found[1:]  # from inside a frame: the next one on
    assert [orjson.loads(m) for m, _ in pf.scan(os.path.getsize(pf.path) - 5)] == []
    pf.close()


def test_a_placeholder_and_its_final_in_one_batch_leave_the_final(tmp_path):
    """A small placeholder (kept in its row) and its large final record (a frame) in one writer-thread batch: the
    last op of a record is the one written, whatever is framed."""
    store = RecordStore(tmp_path, fsync=True).open()
    small = _rec(0, tokens=10)
    ops = [store._record_op(small, "pending"), store._record_op(_rec(0), "done", update=True)]
    loop = asyncio.new_event_loop()
    futs = [loop.create_future() for _ in ops]
    store._write_batch(store._side, [(op, None, fut) for op, fut in zip(ops, futs, strict=True)])
    assert all(f.done() and f.exception() is None for f in futs)
    assert read_records(tmp_path) == [_rec(0)] and store.get_record("r0") == _rec(0)
    assert _table(tmp_path) == {"r0": "done"}
    store.close()
    loop.close()


def test_a_live_writers_final_replaces_the_failure_an_open_made_of_its_placeholder(tmp_path):
    a = RecordStore(tmp_path).open()
    a.rows_every_s = 3600.0

    async def admit():
        await a.put_pending(_rec(0))

    asyncio.run(admit())
    a.write_rows()
    b = RecordStore(tmp_path).open()  # takes a's pending row for a killed run's: an interrupted failure
    assert b.get_record("r0").error["type"] == "interrupted"

    async def finish():
        await a.commit(_rec(0))

    asyncio.run(finish())  # a's final record: a frame whose row a still owes
    assert read_records(tmp_path) == [_rec(0)]
    assert b.get_record("r0") == _rec(0)  # b writes a's row over the failure
    a.close()
    b.close()
    assert read_records(tmp_path) == [_rec(0)]


def test_a_writer_that_owes_no_row_makes_no_reader_scan(tmp_path):
    idle = RecordStore(tmp_path).open()
    a = RecordStore(tmp_path).open()
    a.rows_every_s = 3600.0

    async def main():
        await asyncio.gather(*(a.commit(_rec(i)) for i in range(3)))

    asyncio.run(main())
    with sqlite3.connect(f"file:{tmp_path / DB_NAME}?mode=ro", uri=True) as db:
        assert sorted(s is None for (s,) in db.execute("SELECT since FROM writers")) == [False, True]
    a.write_rows()
    with sqlite3.connect(f"file:{tmp_path / DB_NAME}?mode=ro", uri=True) as db:
        assert [s for (s,) in db.execute("SELECT since FROM writers")] == [None, None]  # nothing to look for
    assert read_records(tmp_path) == [_rec(i) for i in range(3)]
    idle.close()
    a.close()


def test_a_frame_whose_fsynced_commit_failed_is_read_by_no_one(tmp_path, monkeypatch):
    """With `fsync`, a frame written and then not synced, or synced and then not given its row, is a failed commit:
    it is voided, so neither `read_records` nor the next open takes it."""
    store = RecordStore(tmp_path, fsync=True).open()
    other = RecordStore(tmp_path).open()  # owes a row from an earlier offset: its readers scan past the failed frames
    other.rows_every_s = 3600.0
    real_sync = store._payloads.sync
    calls = {"n": 0}

    def sync_once_failing() -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(5, "Input/output error")
        return real_sync()

    async def commit(s: RecordStore, rec) -> BaseException | None:
        try:
            await s.commit(rec)
        except OSError as exc:
            return exc
        return None

    async def main():
        assert await commit(other, _rec(0)) is None
        monkeypatch.setattr(store._payloads, "sync", sync_once_failing)
        assert isinstance(await commit(store, _rec(1)), OSError)  # the frame's sync failed
        monkeypatch.setattr("nemo_polar.proxy.store.UPSERT", "NOT SQL")
        assert isinstance(await commit(store, _rec(2)), OSError)  # synced, but its row's transaction failed
        monkeypatch.undo()
        assert await commit(store, _rec(3)) is None

    asyncio.run(main())
    assert [r.id for r in read_records(tmp_path)] == ["r0", "r3"]
    store.close()
    other.close()
    again = RecordStore(tmp_path).open()
    assert again.get_record("r1") is None and again.get_record("r2") is None and again.get_record("r3") == _rec(3)
    again.close()


def test_a_since_that_could_not_be_written_is_written_before_the_next_frame(tmp_path):
    store = RecordStore(tmp_path).open()
    store.rows_every_s = 3600.0
    assert store._inline_conn is not None
    store._inline_conn.execute("PRAGMA busy_timeout=50")
    blocker = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)

    async def main():
        blocker.execute("BEGIN IMMEDIATE")  # another writer's transaction: this one cannot write its `since`
        try:
            await store.commit(_rec(0))
        except OSError:
            pass
        else:
            raise AssertionError("the commit cannot have been made without its since")
        blocker.execute("COMMIT")
        await store.commit(_rec(1))

    asyncio.run(main())
    assert blocker.execute("SELECT since FROM writers").fetchone()[0] is not None
    assert read_records(tmp_path) == [_rec(1)]  # the frame past it, while its row is owed
    blocker.close()
    store.close()


def test_a_frame_of_a_commit_that_fails_is_not_taken_by_another_reader_meanwhile(tmp_path):
    """An `fsync` writer owes no row, so another store object reading while its commit is failing does not take
    the frame (a row pointing to a frame voided afterwards would make every read of the store fail)."""
    a = RecordStore(tmp_path, fsync=True).open()
    b = RecordStore(tmp_path).open()
    c = RecordStore(tmp_path).open()
    c.rows_every_s = 3600.0
    real_sync = a._payloads.sync

    def sync_failing() -> int:
        b.write_rows()  # another reader while the frame is on its way to the disk
        raise OSError(5, "Input/output error")

    async def main():
        await c.commit(_rec(0))  # c owes a row from an offset before a's frame
        a._payloads.sync = sync_failing
        try:
            await a.commit(_rec(1))
        except OSError:
            pass
        a._payloads.sync = real_sync
        await a.commit(_rec(2))

    asyncio.run(main())
    assert [r.id for r in read_records(tmp_path)] == ["r0", "r2"]
    assert [r.id for r in b.list_records("s1")] == ["r0", "r2"]
    for s in (a, b, c):
        s.close()
