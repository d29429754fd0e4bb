# SPDX-License-Identifier: Apache-2.0
"""The record store's rows after its frames: what a reader sees of records whose rows are not written yet, and the
writers that owe them (`proxy/store.py`'s docstring, "Rows follow the frames").

A record's payload frame carries its row's fields (`PayloadFile.append(metas=)`), so the frames past a writer's
`since` (the `writers` table: every frame of that writer whose row is not in `records` lies at or after it; NULL while
it owes none) are all it takes to rebuild the rows it has not written: `tail_rows` reads them, `read_store` lays them
over the table, `index_tail` writes them for another writer (a store object reading what other processes committed
moments ago, and for a process that died before writing them). Rows written from frames never undo a newer row: a
frame adds a row that is missing, finishes a pending one, or replaces a failure with the call's successful final
record (`UPSERT_IF_NEWER`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from nemo_polar.proxy.deltas import DeltaError, is_delta, resolve
from nemo_polar.proxy.payloads import _REF, PayloadFile, StoreCorrupt
from nemo_polar.proxy.record_json import record_bytes
from nemo_polar.types import CompletionRecord

__all__ = [
    "SCHEMA",
    "UPSERT",
    "UPSERT_IF_NEWER",
    "apply_op",
    "checkpoint",
    "conn_data",
    "hold_writer",
    "index_tail",
    "interrupted",
    "read_store",
    "records",
    "release_writer",
    "tail_rows",
    "whole",
    "whole_op",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    failed INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_session ON records (session_id, seq);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    api_key TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS writers (
    writer TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    since INTEGER
);
"""
_COLUMNS = "INSERT INTO records (id, session_id, seq, state, failed, data) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(id)"
_SET = (
    " DO UPDATE SET session_id = excluded.session_id, seq = excluded.seq, state = excluded.state,"
    " failed = excluded.failed, data = excluded.data"
)
UPSERT = _COLUMNS + _SET  # the writer's own rows: the last write wins (a placeholder's row updated in place)
# rows from other writers' frames: a missing row, a pending one, or a failure that the call's successful final record
# replaces (an open took a live writer's placeholder row for an interrupted call: `interrupted`)
UPSERT_IF_NEWER = (
    _COLUMNS
    + _SET
    + (" WHERE records.state = 'pending' OR (excluded.state = 'done' AND records.failed = 1 AND excluded.failed = 0)")
)

log = logging.getLogger(__name__)

Row = tuple[str, int, str, int, bytes]  # session_id, seq, state, failed, data


def hold_writer(locks: Path, writer: str) -> int:
    """Take `writer`'s lock: a file in `locks` under an exclusive `flock` for as long as the returned descriptor is
    open (a process that dies lets go of it), taken before the writer's row is written, so a writer with a row whose
    lock is free has exited (`_alive`). Unlike a pid it holds across pid namespaces and reused pids."""
    locks.mkdir(exist_ok=True)
    fd = os.open(locks / writer, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def release_writer(locks: Path, writer: str, fd: int) -> None:
    """Let go of `hold_writer`'s lock (after the writer's row is gone) and remove its file."""
    with contextlib.suppress(OSError):
        os.unlink(locks / writer)
    os.close(fd)


def _alive(locks: Path, writer: str) -> bool:
    try:
        fd = os.open(locks / writer, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(locks / writer)
    return False


def tail_rows(conn: sqlite3.Connection, payloads: PayloadFile, *, exclude: str | None = None) -> dict[str, Row]:
    """The rows that writers owe (all but `exclude`), from their frames past their `since`, by record id: a record's
    last final frame, else its last placeholder; {} where no writer owes rows (or the store predates the `writers`
    table). Only the frames of a writer that owes rows are taken: a writer with `fsync` never does (its rows are
    written before its commits return), so a frame of a commit it then fails is never taken from here."""
    try:
        owing = dict(
            conn.execute("SELECT writer, since FROM writers WHERE since IS NOT NULL AND writer != ?", (exclude or "",))
        )
    except sqlite3.OperationalError:
        return {}
    out: dict[str, Row] = {}
    if not owing:
        return out
    for meta, ref in payloads.scan(min(owing.values())):
        try:
            rid, session_id, seq, state, failed, writer = orjson.loads(meta)
        except (orjson.JSONDecodeError, ValueError, TypeError):
            continue
        if _REF.unpack(ref)[1] < owing.get(writer, 1 << 63):
            continue  # not owed: a frame of a writer that owes none, or from before its `since`
        if state == "done" or out.get(rid, ("", 0, "pending"))[2] != "done":
            out[rid] = (session_id, seq, state, failed, ref)
    return out


def index_tail(conn: sqlite3.Connection, payloads: PayloadFile, me: str, locks: Path) -> int:
    """Write the rows other writers owe (`tail_rows`), never undoing a newer row; how many frames that took. Then
    forget the writers whose process has exited (their frames are all in `records` now)."""
    # the dead first: every frame of a writer found dead was written before the scan, so the scan has it
    writers = conn.execute("SELECT writer FROM writers WHERE writer != ?", (me,)).fetchall()
    dead = [(w,) for (w,) in writers if not _alive(locks, w)]
    rows = tail_rows(conn, payloads, exclude=me)
    if not rows and not dead:
        return 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(UPSERT_IF_NEWER, [(rid, *row) for rid, row in rows.items()])
        conn.executemany("DELETE FROM writers WHERE writer = ?", dead)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(rows)


def read_store(
    path: Path, payloads: PayloadFile, *, include_pending: bool = False, ids: Iterable[str] | None = None
) -> list[CompletionRecord]:
    """`proxy.store.read_records` of the database at `path` with its payload file: the rows, with the frames past
    every writer's `since` laid over them (a live writer's records that have no row yet)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        conn.execute("BEGIN")  # one snapshot: the rows, the writers' `since` and the bases their deltas refer to
        sql = "SELECT id, session_id, seq, state, failed, data FROM records"
        if ids is None:
            rows = conn.execute(sql).fetchall()
        else:  # only those rows; a delta's base is looked up by id (`data`)
            ids = list(ids)
            one = sql + " WHERE id = ?"
            rows = [row for rid in dict.fromkeys(ids) if (row := conn.execute(one, (rid,)).fetchone())]
        table: dict[str, Row] = {rid: (sid, seq, state, failed, data) for rid, sid, seq, state, failed, data in rows}
        tail = tail_rows(conn, payloads)
        asked = set(ids or ())
        for rid, row in tail.items():
            if (ids is None or rid in asked) and _newer(table.get(rid), row):
                table[rid] = row
        wanted = [rid for rid, row in table.items() if include_pending or row[2] == "done"]
        if ids is None:
            wanted.sort(key=lambda rid: (table[rid][0], table[rid][1]))
        else:
            keep = set(wanted)
            wanted = [rid for rid in ids if rid in keep]
        from_conn = conn_data(conn)

        def data(rid: str) -> bytes | None:  # a delta's base: the newest of its row and its frame
            row = table.get(rid) or tail.get(rid)
            return row[4] if row is not None else from_conn(rid)

        return records(payloads, [(rid, table[rid][4]) for rid in wanted], data)
    finally:
        conn.close()


def _newer(row: Row | None, frame: Row) -> bool:
    """Whether a frame's row replaces `row` (`UPSERT_IF_NEWER`'s rule)."""
    return row is None or row[2] == "pending" or (frame[2] == "done" and bool(row[3]) and not frame[3])


def whole(
    payloads: PayloadFile, rid: str, data: bytes, bases: OrderedDict[str, bytes], row_data: Any
) -> bytes | dict[str, Any]:
    """A row's record, whole: its stored JSON, or a session delta resolved against its base (`proxy/deltas.py`)
    and parsed; `row_data(id)` is the `data` of another record's row (None: no such record); `bases` keeps the last
    few bases across the rows of one read."""
    stored = payloads.resolve(rid, data)
    if not is_delta(stored):
        return stored

    def fetch(bid: str) -> bytes | None:
        base = row_data(bid)
        return None if base is None else payloads.resolve(bid, base)

    try:
        return resolve(stored, fetch, bases)
    except DeltaError as exc:
        raise StoreCorrupt(f"record {rid}: a session delta that cannot be resolved: {exc}") from exc


def records(payloads: PayloadFile, rows: Iterable[tuple[str, bytes]], row_data: Any) -> list[CompletionRecord]:
    """The records of `rows` (id, row `data`), whole (`whole`)."""
    bases: OrderedDict[str, bytes] = OrderedDict()
    wholes = (whole(payloads, rid, data, bases, row_data) for rid, data in rows)
    return [CompletionRecord.from_json(w) if isinstance(w, bytes) else CompletionRecord.from_dict(w) for w in wholes]


def conn_data(conn: sqlite3.Connection) -> Callable[[str], bytes | None]:
    """Another record's row `data` by id, read through `conn` (a delta's base; None: no such record)."""

    def data(rid: str) -> bytes | None:
        row = conn.execute("SELECT data FROM records WHERE id = ?", (rid,)).fetchone()
        return None if row is None else row[0]

    return data


def interrupted(conn: sqlite3.Connection, payloads: PayloadFile) -> int:
    """Turn the pending rows a killed process left into failure records (`error.type == "interrupted"`, with the
    original request their placeholder kept); how many."""
    rows = conn.execute("SELECT id, session_id, seq, data FROM records WHERE state = 'pending'").fetchall()
    if not rows:
        return 0
    conn.execute("BEGIN")
    bases: OrderedDict[str, bytes] = OrderedDict()
    for rid, session_id, seq, data in rows:
        message = "the proxy stopped before this call's reply was complete"
        try:
            stored = whole(payloads, rid, data, bases, conn_data(conn))
            rec = orjson.loads(stored) if isinstance(stored, bytes) else stored
        except StoreCorrupt as exc:  # a power loss took the placeholder's frame: what the row itself says
            rec = {"id": rid, "session_id": session_id, "seq": seq, "dialect": ""}
            message += f"; its placeholder is lost ({exc})"
        rec["error"] = {"type": "interrupted", "message": message, "detected_at": time.time()}
        conn.execute("UPDATE records SET state = 'done', failed = 1, data = ? WHERE id = ?", (orjson.dumps(rec), rid))
    conn.execute("COMMIT")
    return len(rows)


def checkpoint(conn: sqlite3.Connection, pin: sqlite3.Connection, payloads: PayloadFile, keep: int | None) -> None:
    """Copy committed WAL frames into the database, never a row whose payload frame is not on disk: a read
    transaction on `pin` stops the checkpoint at the commits made before it began (it may not overwrite pages
    that snapshot reads), whose frames were all written before they committed; the payload file is synced, then
    the checkpoint runs. Then the payload file's pages more than `keep` bytes behind the synced end leave the page
    cache (None: the OS decides)."""
    try:
        pin.execute("BEGIN")
        pin.execute("SELECT 1 FROM records LIMIT 1").fetchall()
        synced = payloads.sync()
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except (sqlite3.Error, OSError) as exc:  # busy, or the sync failed: nothing copied, try again next round
        log.debug("checkpoint skipped: %s", exc)
        return
    finally:
        if pin.in_transaction:
            pin.execute("COMMIT")
    if keep is not None:
        try:
            payloads.drop_cached(synced - keep)
        except OSError as exc:  # the cache stays as it is: only memory, never a record, is at stake
            log.debug("payload pages not dropped: %s", exc)


def whole_op(op: tuple[Any, ...]) -> tuple[Any, ...]:
    """A store's record op written whole (its delta's base was lost with a failed batch)."""
    return (*op[:6], record_bytes(op[8], pending=op[4] == "pending"), *op[7:9], None)


def apply_op(conn: sqlite3.Connection, op: tuple[Any, ...]) -> None:
    """A store op kept in SQLite itself (a record in its row, a session) as its statements."""
    if op[0] == "record":
        _, rid, session_id, seq, state, failed, data, update = op[:8]
        # a placeholder's row is updated in place: its index entries stay, where INSERT OR REPLACE deletes the
        # row and both index entries and inserts them again (a 1k-prompt stream at concurrency 1: ~25 % less
        # CPU). No such row (the placeholder's write failed): a plain insert.
        if update and (
            conn.execute(
                "UPDATE records SET state = ?, failed = ?, data = ? WHERE id = ? AND session_id = ? AND seq = ?",
                (state, failed, data, rid, session_id, seq),
            ).rowcount
        ):
            return
        conn.execute(
            "INSERT OR REPLACE INTO records (id, session_id, seq, state, failed, data) VALUES (?, ?, ?, ?, ?, ?)",
            (rid, session_id, seq, state, failed, data),
        )
    elif op[0] == "session":
        conn.execute(
            "INSERT OR REPLACE INTO sessions (session_id, api_key, created_at, data) VALUES (?, ?, ?, ?)", op[1:]
        )
    else:  # pragma: no cover - programming error
        raise ValueError(f"unknown store op {op[0]!r}")
