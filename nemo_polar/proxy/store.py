# SPDX-License-Identifier: Apache-2.0
"""The proxy's durable record store: one SQLite database (WAL) per store directory, with an append-only payload file.

`RecordStore.commit(record)` returns once the record is on disk; the proxy awaits it before the reply's terminal
part leaves (docs/contracts.md, "Durability"). Concurrent commits are batched: everything submitted in one turn of the
event loop is written together, so 64 concurrent replies cost one write, not 64 (and one alone is written at once:
`write_at_once`). A batch that waits for the disk (a direct write; every batch with `fsync`) is written by the writer
thread instead, and the batches after it follow it there, in order, while the loop serves other calls
(`store_writer`). Token arrays are stored compactly (`CompletionRecord.to_json(compact=True)`: base64 int32/float64).

Layout. `records.sqlite` holds one small row per record (id, session, seq, state) and the sessions; the payload file
`records.sqlite-payloads` beside it each record's JSON of more than `INLINE_MAX` bytes as a frame (`proxy/payloads.py`:
a header, the row's fields, the bytes), to which the row's `data` holds a 17-byte reference; a smaller record's JSON
stays in `data`, as every record of a store written before the payload file does. Out of SQLite a large record is
written once (not into overflow pages, the WAL, then the database; docs/performance.md, "Records"). Every read checks
the frame against the reference: a torn, truncated or missing payload is `StoreCorrupt` naming the record. The file
only grows (a placeholder's frame, and bytes of a write that failed or died, are garbage no row points to): copy or
archive the directory, not the database alone.

Rows follow the frames. A record with a frame is committed when its frame is written (in the OS; fsynced first with
`fsync`); its row is written later with the others owed, in one transaction within `ROWS_EVERY_S` (or at `ROWS_MAX`
owed, or before any read through this object: `write_rows`), and a stream finished within that window never writes
its placeholder's row (docs/performance.md, "Rows after their frames"). Nothing is hidden meanwhile: a frame carries
its row's fields, and the `writers` table says where each open store object's rowless frames begin (`since`, NULL
while it owes no row), so `read_records` lays the frames past it over the table, a store object writes the rows
others owe before it reads, and `open` writes those a killed process owed before its pending rows become failures
(`store_rows`). With `fsync` the rows are written before `commit` returns.

Writers. Several processes may write one store (a rollout server and its gateways, tools): frames are appended under
an exclusive `flock` of the payload file (`PayloadFile`), so two writers never take the same offset. Without `fsync`
the frames are in the OS when `commit` returns, so a killed process loses nothing it committed; with `fsync` they are
fsynced first (a frame whose commit then fails is voided). Only the checkpointer thread checkpoints, syncing the
payload file first (`store_rows.checkpoint`), so no row reaches the database file before its payload is on disk.

A record may first be written as *pending* (`put_pending`) when a call is admitted; `commit` replaces it with the
final record (a row written in place). The placeholder holds what identifies the call and the caller's original
request, not the normalised `request` (a second copy of the same prompt). On `open`, pending rows left by a killed
process become failure records (`error.type == "interrupted"`, with the original request).

New databases use 4 KiB pages (SQLite's default; an existing database keeps its own). Session deltas
(`proxy/deltas.py`, on by default): a record whose prompt extends an earlier one of its session is written as what
is new against that record, written whole; every read here resolves it, so readers only ever see whole records.
Sessions are persisted in the same database (a JSON blob per session) so they survive a restart.
This module does no HTTP and knows nothing of dialects.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from nemo_polar.errors import PolarError
from nemo_polar.proxy.deltas import SessionDeltas, parts_size, share_request, stored_parts
from nemo_polar.proxy.payloads import PAGE_CACHE_MB, PayloadFile, StoreCorrupt
from nemo_polar.proxy.record_json import record_bytes, record_dict
from nemo_polar.proxy.store_rows import (
    SCHEMA,
    UPSERT,
    apply_op,
    checkpoint,
    conn_data,
    hold_writer,
    index_tail,
    interrupted,
    read_store,
    records,
    release_writer,
    whole_op,
)
from nemo_polar.proxy.store_rows import whole as whole_of
from nemo_polar.proxy.store_writer import WriterThread, resolve, resolve_all
from nemo_polar.types import CompletionRecord

__all__ = ["DB_NAME", "PAYLOADS_NAME", "RecordStore", "StoreClosed", "StoreCorrupt", "read_records", "record_bytes"]

log = logging.getLogger(__name__)

PAGE_SIZE = 4096  # bytes per SQLite page of a new database (module docstring)
# a record's JSON of up to this many bytes (a page) stays in its row: JSON of 1.6-6 KB costs within ±10 % either way
# committed alone and 25-30 % less in the payload file in batches of 16, 12 KB already 25 % less alone
DB_NAME = "records.sqlite"
PAYLOADS_NAME = DB_NAME + "-payloads"  # the append-only payload file beside it (module docstring)
WRITERS_DIR = DB_NAME + "-writers"  # a lock file per open store object (`store_rows.hold_writer`)
INLINE_MAX = 4096
ROWS_EVERY_S = 0.05  # the longest a framed record waits for its row (module docstring, "Rows follow the frames")
ROWS_MAX = 4096  # rows owed that are written at once, whatever the time


class StoreClosed(PolarError, RuntimeError):
    """A write was attempted on a closed store."""


class StoreWriteError(PolarError, OSError):
    """The store could not write (disk full, I/O error): nothing of that batch was kept; the call may be retried."""


class RecordStore:
    """SQLite-WAL store of `CompletionRecord`s and sessions with batched, durable commits.

    Args:
        directory: the store directory (created); the database is `directory/records.sqlite`, the payload file
            `directory/records.sqlite-payloads` (module docstring).
        fsync: `True` uses `synchronous=FULL`: every batch is fsynced (survives power loss) by a writer thread, so
            the event loop never waits on the disk; the batch's payload frames are fsynced before its commit. `False`
            (default) uses `NORMAL`, which in WAL mode still survives a killed process (the durability rule: the
            committed WAL frames and payload frames are in the OS before `commit` returns); batches are then written
            on the event loop itself (no fsync, ~0.1 ms), avoiding thread hand-offs.
        max_batch: most writes folded into one transaction.
        session_deltas: write a record whose prompt extends an earlier one of its session as a delta against it
            (`proxy/deltas.py`; every read resolves it). `False` writes every record whole.
        page_cache_mb: how much of the payload file's end stays in the OS's page cache: after each checkpoint's
            sync, older pages are dropped (`PayloadFile.drop_cached`), so the file's cached part stays this size and
            its writes reuse memory freed moments before. `None` leaves the page cache to the OS.
        direct_io: write the payload file's frames with O_DIRECT, past the page cache (`PayloadFile`): `None` (the
            default) where the file system is a local block one, `True` wherever the file system takes it, `False`
            never.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        fsync: bool = False,
        max_batch: int = 1024,
        session_deltas: bool = True,
        page_cache_mb: int | None = PAGE_CACHE_MB,
        direct_io: bool | None = None,
    ):
        if page_cache_mb is not None and page_cache_mb < 0:
            raise ValueError(f"page_cache_mb must be >= 0 or None, not {page_cache_mb}")
        self.directory = Path(directory)
        self.path = self.directory / DB_NAME
        self._payloads = PayloadFile(self.directory / PAYLOADS_NAME, writable=True, direct_io=direct_io)
        self._fsync = fsync
        self._keep_cached = None if page_cache_mb is None else page_cache_mb << 20
        self._max_batch = max_batch
        self._thread: WriterThread | None = None  # batches written off the event loop (`store_writer`)
        self._inline_conn: sqlite3.Connection | None = None
        self._inline_batch: list[Any] = []
        self._ckpt_thread: threading.Thread | None = None
        self._ckpt_stop = threading.Event()
        self.checkpoint_every_s = 1.0
        self._reader: sqlite3.Connection | None = None
        self._pending_ids: set[str] = set()  # placeholders submitted and not yet replaced by their final record
        self._deltas = SessionDeltas() if session_deltas else None
        self._lost: set[str] = set()  # ids of records whose batch failed: a delta against one is written whole
        # rows of framed records not written yet (module docstring, "Rows follow the frames"), by record id
        self._rows: dict[str, tuple[Any, ...]] = {}
        self._lock = threading.Lock()  # the frames' rows, their connection and `_side`
        self._writer_id = uuid.uuid4().hex
        self._side: sqlite3.Connection | None = None  # registration, other writers' rows, the rows of `close`
        self._locks = self.directory / WRITERS_DIR
        self._lock_fd = -1  # this writer's lock while it is open (`store_rows.hold_writer`)
        self._since: int | None = None  # this writer's `since` as last written (None: no row owed)
        self._timer_loop: asyncio.AbstractEventLoop | None = None  # the loop a row flush is due on
        self.rows_every_s = ROWS_EVERY_S
        self._closed = True
        self.batches = 0
        self.writes = 0
        self.delta_records = 0  # records written as session deltas
        # asked by `commit` and `put_pending` (no `fsync`): True writes at once, not at the loop's next turn, if nothing
        # is queued; the proxy's is True while it has one call in flight: nothing to share a batch (docs/performance.md)
        self.write_at_once: Callable[[], bool] = bool  # bool(): never

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def open(self) -> RecordStore:
        """Create the schema, recover pending rows of a previous process, start the writer thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        # frames a killed writer left in the page cache reach the disk before any checkpoint here (closing the last
        # connection is one) can copy their rows into the database
        self._payloads.sync()
        conn = self._side = self._connect()
        conn.executescript(SCHEMA)
        self._lock_fd = hold_writer(self._locks, self._writer_id)
        try:  # registered before its first frame: every frame of this store object without its row is past `since`
            self._since = None  # no row owed: no frame to look for (`_frame` sets it before this writer's next)
            conn.execute("INSERT INTO writers VALUES (?, ?, NULL)", (self._writer_id, os.getpid()))
            index_tail(conn, self._payloads, self._writer_id, self._locks)  # a killed writer's rows; then its pending
            recovered = interrupted(conn, self._payloads)
        except BaseException:
            conn.close()
            self._side = None
            release_writer(self._locks, self._writer_id, self._lock_fd)
            raise
        if recovered:
            log.warning(
                "store %s: %d interrupted call(s) of a previous run recorded as failures", self.path, recovered
            )
        self._reader = self._connect(readonly=True)
        self._closed = False
        self._thread = WriterThread(self._connect, self._write_batch, self._max_batch)
        self._thread.start()
        if not self._fsync:
            self._inline_conn = self._connect()
        # WAL checkpoints (which fsync) run in a background thread, never on the event loop nor in a commit
        self._ckpt_stop.clear()
        self._ckpt_thread = threading.Thread(target=self._checkpointer, name="polar-store-ckpt", daemon=True)
        self._ckpt_thread.start()
        return self

    def _checkpointer(self) -> None:
        conn = self._connect()
        pin = self._connect(readonly=True)
        while not self._ckpt_stop.wait(self.checkpoint_every_s):
            checkpoint(conn, pin, self._payloads, self._keep_cached)
        checkpoint(conn, pin, self._payloads, self._keep_cached)
        pin.close()
        conn.close()

    def close(self) -> None:
        """Flush pending writes and stop the writer thread."""
        if self._closed:
            return
        self._closed = True
        if self._inline_conn is not None:
            self._flush_inline()
            self._inline_conn.close()
            self._inline_conn = None
        if self._thread is not None:
            self._thread.stop(timeout_s=30)  # after what it was given
        with self._lock:
            side, self._side = self._side, None
            if side is not None:
                try:
                    self._write_rows(side, [], gone=self._thread is None or not self._thread.alive())
                except (sqlite3.Error, OSError) as exc:  # the frames are kept: the next store to open writes them
                    log.warning("store %s: rows not written on close (%s); the next open writes them", self.path, exc)
                side.close()
                release_writer(self._locks, self._writer_id, self._lock_fd)
        self._ckpt_stop.set()
        if self._ckpt_thread is not None:
            self._ckpt_thread.join(timeout=30)
        # closing the last connection to the database checkpoints it: every frame on disk first
        self._payloads.sync()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._payloads.close()

    def _connect(self, *, readonly: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect only while the database is still empty
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if self._fsync else 'NORMAL'}")
        conn.execute("PRAGMA wal_autocheckpoint=0")  # only the checkpointer checkpoints (`_checkpoint`)
        if readonly:
            conn.execute("PRAGMA query_only=1")
        return conn

    # -- writes ------------------------------------------------------------------------------------------------------

    def _submit(self, op: tuple[Any, ...], now: bool = False) -> asyncio.Future[None]:
        if self._closed:
            raise StoreClosed(f"store {self.path} is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        thread = self._thread
        assert thread is not None
        if self._inline_conn is not None and now and not self._inline_batch and not thread.busy:  # nothing queued
            if type(op[6]) is list and len(self._rows) < ROWS_MAX - 1 and not (self._lost and op[9] in self._lost):
                self._write_one(self._inline_conn, op, fut, loop)  # a frame alone: nothing to fold
            else:
                self._write_batch(self._inline_conn, [(op, None, fut)])  # written within the call
        elif self._inline_conn is not None:
            # everything submitted during this loop iteration is committed together at the start of the next one
            if not self._inline_batch:
                loop.call_soon(self._flush_inline)
            self._inline_batch.append((op, None, fut))
        else:
            thread.put([(op, loop, fut)])
        return fut

    def _flush_inline(self) -> None:
        batch, self._inline_batch = self._inline_batch, []
        if not batch or self._inline_conn is None:
            return
        records = [op[6] for op, _, _ in batch if op[0] == "record"]
        size = sum(len(d) if type(d) is bytes else parts_size(d) for d in records)
        if self._thread is not None and (self._thread.busy or self._payloads.direct_for(size, len(records))):
            self._thread.put([(op, fut.get_loop(), fut) for op, _, fut in batch])  # the disk's wait off the loop
        else:
            self._write_batch(self._inline_conn, batch)

    def _record_op(self, record: CompletionRecord, state: str, *, update: bool = False) -> tuple[Any, ...]:
        # serialised here, on the caller's thread: the writer thread then only runs SQL (which releases the GIL)
        pending = state == "pending"
        out = record_dict(record, pending=pending)
        shared = share_request(out)  # the request's lists that are the caller's, written once (proxy/deltas.py)
        if self._deltas is None:
            parts, base = stored_parts(out, shared), None
        else:
            parts, base = self._deltas.encode(out, record, pending=pending, shared=shared)
        # a payload frame's buffers go to the payload file as they are; a row's JSON is one bytes object
        data: bytes | list[Any] = parts if parts_size(parts) > INLINE_MAX else b"".join(parts)
        failed = 0 if record.error is None else 1
        return ("record", record.id, record.session_id, record.seq, state, failed, data, update, record, base)

    def put_pending(self, record: CompletionRecord) -> asyncio.Future[None]:
        """Write a placeholder for an admitted call (awaited before a stream's first byte leaves): the record without
        its normalised `request` (module docstring); within this call where `write_at_once` says so, as a commit."""
        self._pending_ids.add(record.id)
        return self._submit(self._record_op(record, "pending"), self.write_at_once())

    async def commit(self, record: CompletionRecord) -> None:
        """Durably write the final record (replacing its placeholder); returns once it is committed."""
        update = record.id in self._pending_ids
        self._pending_ids.discard(record.id)
        await self._submit(self._record_op(record, "done", update=update), self.write_at_once())

    async def put_session(self, session_id: str, api_key: str, created_at: float, data: dict[str, Any]) -> None:
        """Insert or replace a session row."""
        await self._submit(("session", session_id, api_key, created_at, orjson.dumps(data)))

    def session_ended(self, session_id: str) -> None:
        """A closed session makes no more calls: its session-delta keys are let go (`proxy/deltas.py`)."""
        if self._deltas is not None:
            self._deltas.forget((session_id,))

    def _write_batch(self, conn: sqlite3.Connection, batch: list[Any]) -> None:
        ops = [op for op, _, _ in batch]
        if self._lost:  # a delta against a record whose batch failed: written whole
            ops = [whole_op(op) if op[0] == "record" and op[9] in self._lost else op for op in ops]
        # a record's last op in the batch (a placeholder's final) is the one written; its ops all get its outcome
        last = {op[1]: i for i, op in enumerate(ops) if op[0] == "record"}
        kept = [op for i, op in enumerate(ops) if op[0] != "record" or last[op[1]] == i]
        framed = [op for op in kept if op[0] == "record" and (type(op[6]) is list or len(op[6]) > INLINE_MAX)]
        in_frames = {op[1] for op in framed}  # a record's one kept op is framed or not
        rest = [op for op in kept if op[0] != "record" or op[1] not in in_frames]
        framed_error = rest_error = None
        with self._lock:
            if framed:
                try:  # the commit: frames that carry their rows (module docstring, "Rows follow the frames")
                    self._frame(conn, framed)
                except BaseException as exc:
                    framed_error = self._failed(exc, framed, batch)
                    cut = {op[1] for op in rest if op[0] == "record" and op[9] in in_frames}  # deltas on failed bases
                    rest, in_frames = [op for op in rest if op[0] != "record" or op[1] not in cut], in_frames | cut
            if rest or self._fsync or len(self._rows) >= ROWS_MAX:
                try:
                    self._write_rows(conn, rest)
                except BaseException as exc:
                    rest_error = self._failed(exc, rest, batch)
                    if self._fsync and framed and framed_error is None:  # their rows are part of their commit
                        self._void([self._rows.pop(op[1])[5] for op in framed if op[1] in self._rows])
                        framed_error = self._failed(exc, framed, batch)
            elif self._rows:
                self._arm(batch)
        self.batches += 1
        self.writes += len(batch)
        later: dict[Any, list[tuple[asyncio.Future[None], BaseException | None]]] = {}  # by loop: one wake-up each
        for op, (_, loop, fut) in zip(ops, batch, strict=True):
            error = framed_error if op[0] == "record" and op[1] in in_frames else rest_error
            if error is None and op[0] == "record" and op[9] is not None:
                self.delta_records += 1
            if loop is None:
                resolve(fut, error)
            else:
                later.setdefault(loop, []).append((fut, error))
        for loop, outcomes in later.items():
            try:
                loop.call_soon_threadsafe(resolve_all, outcomes)
            except RuntimeError:  # loop closed: nobody is waiting any more
                pass

    def _write_one(self, conn: sqlite3.Connection, op: tuple[Any, ...], fut: asyncio.Future[None], loop: Any) -> None:
        """`_write_batch` of a batch of one record whose JSON is a frame, with fewer than `ROWS_MAX` rows owed and no
        failed base, without its folding (2.4 % of the proxy's CPU at c=1: docs/performance.md, "Concurrency 1")."""
        error = None
        with self._lock:
            try:
                if self._since is None:  # the first frame to owe a row: `_frame` writes `since` first
                    self._frame(conn, [op])
                else:
                    ref = self._payloads.append_one(op[6], orjson.dumps((*op[1:6], self._writer_id)))
                    self._rows[op[1]] = (*op[1:6], ref)
            except BaseException as exc:
                error = self._failed(exc, [op], [(op, None, fut)])
            if self._rows and self._timer_loop is not loop:  # the rows owed, whatever became of this one
                self._arm([(op, loop, fut)])
        self.batches += 1
        self.writes += 1
        if error is not None:
            fut.set_exception(error)
            return
        self.delta_records += op[9] is not None
        fut.set_result(None)

    def _frame(self, conn: sqlite3.Connection, ops: list[tuple[Any, ...]]) -> None:
        """Append the records' frames, each with its row's fields; their rows are written later (`_write_rows`)."""
        # the first frame to owe a row (with `fsync` none does): readers look for this writer's frames from here
        if self._since is None and not self._fsync:
            since = self._payloads.size()
            conn.execute("UPDATE writers SET since = ? WHERE writer = ?", (since, self._writer_id))
            self._since = since  # only once written: a failed update is tried again before the next frame
        metas = [orjson.dumps((*op[1:6], self._writer_id)) for op in ops]  # id, session, seq, state, failed, writer
        refs = self._payloads.append([op[6] for op in ops], metas)
        if self._fsync:
            try:
                self._payloads.sync()  # on disk before `commit` returns
            except BaseException:
                self._void(refs)  # not committed: no reader may take them
                raise
        for op, ref in zip(ops, refs, strict=True):
            self._rows[op[1]] = (op[1], op[2], op[3], op[4], op[5], ref)

    def _void(self, refs: list[bytes]) -> None:
        try:
            self._payloads.void(refs)
        except OSError as exc:  # the disk is failing: a reader may still find these frames
            log.warning("store %s: frames of failed commits not voided (%s)", self.path, exc)

    def _write_rows(self, conn: sqlite3.Connection, ops: list[tuple[Any, ...]], *, gone: bool = False) -> None:
        """One transaction (`_lock` held): the rows owed, `ops` (inline records, sessions), where this writer's next
        frame will be (`gone`: none; the writer is forgotten). The rows stay owed if it fails."""
        rows, self._rows = self._rows, {}
        if not rows and not gone and len(ops) <= 1:
            if not ops:
                return
            self._apply(conn, ops[0])  # one statement is its own transaction (autocommit): no BEGIN/COMMIT
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(UPSERT, rows.values())
            for op in ops:
                self._apply(conn, op)
            if gone:
                conn.execute("DELETE FROM writers WHERE writer = ?", (self._writer_id,))
            elif rows:  # nothing owed any more: readers look for none of this writer's frames
                conn.execute("UPDATE writers SET since = NULL WHERE writer = ?", (self._writer_id,))
            conn.execute("COMMIT")
            if rows:
                self._since = None
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            rows.update(self._rows)
            self._rows = rows
            raise

    def _arm(self, batch: list[Any]) -> None:
        """Write the rows owed within `rows_every_s`, on the event loop the batch came from."""
        loop = next((lp for _, lp, _ in batch if lp is not None), None)
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
        if self._timer_loop is not loop:
            self._timer_loop = loop
            try:  # from either thread
                loop.call_soon_threadsafe(loop.call_later, self.rows_every_s, self._rows_due)
            except RuntimeError:  # that loop is closed: the rows wait for the next read, write or `close`
                self._timer_loop = None

    def _rows_due(self) -> None:
        self._timer_loop = None
        with self._lock:
            conn = self._inline_conn if self._inline_conn is not None else self._side
            if not self._rows or conn is None:
                return
            try:
                self._write_rows(conn, [])
            except (sqlite3.Error, OSError) as exc:  # the records are kept (their frames): try again later
                log.warning("store %s: %d rows not written yet (%s); retrying", self.path, len(self._rows), exc)
                self._timer_loop = asyncio.get_running_loop()
                self._timer_loop.call_later(max(self.rows_every_s, 1.0), self._rows_due)

    def _failed(self, exc: BaseException, ops: list[tuple[Any, ...]], batch: list[Any]) -> BaseException:
        """What the callers of `ops` get: the disk's fault is a typed, retryable error; failed records are forgotten."""
        log.exception("store write failed (%d ops)", len(ops), exc_info=exc)
        self._forget([op for op in ops if op[0] == "record"], batch)
        if isinstance(exc, (sqlite3.Error, OSError)):
            error = StoreWriteError(f"the record store could not write: {exc}")
            error.__cause__ = exc
            return error
        return exc

    def _forget(self, lost: list[tuple[Any, ...]], batch: list[Any]) -> None:
        """A failed batch's records may be keys: later deltas against them are written whole, and their sessions'
        keys dropped (on the event loop, which owns them)."""
        self._lost.update(op[1] for op in lost)
        if self._deltas is None or not lost:
            return
        sessions = {op[2] for op in lost}
        loop = next((lp for _, lp, _ in batch if lp is not None), None)
        if loop is None:
            self._deltas.forget(sessions)
            return
        try:
            loop.call_soon_threadsafe(self._deltas.forget, sessions)
        except RuntimeError:  # the loop is closed: nobody writes any more
            pass

    _apply = staticmethod(apply_op)  # one op's statements (`store_rows.apply_op`)

    # -- reads -------------------------------------------------------------------------------------------------------

    def _read(self) -> sqlite3.Connection:
        """The reader, once every record committed to the store has its row (`write_rows`)."""
        if self._reader is None:
            raise StoreClosed(f"store {self.path} is closed")
        self.write_rows()
        return self._reader

    def write_rows(self) -> None:
        """Write now the rows this store object owes for records it committed, and those other writers of the store
        owe (module docstring, "Rows follow the frames"): every read here does first; a reader of the database's
        tables itself needs it (`read_records` needs nothing)."""
        with self._lock:
            if self._side is not None:
                try:
                    if self._rows:
                        self._write_rows(self._side, [])
                    index_tail(self._side, self._payloads, self._writer_id, self._locks)
                except (sqlite3.Error, OSError) as exc:
                    raise StoreWriteError(f"the record store could not write the rows it owes: {exc}") from exc

    def get_record(self, record_id: str) -> CompletionRecord | None:
        conn = self._read()
        row = conn.execute("SELECT data FROM records WHERE id = ?", (record_id,)).fetchone()
        return None if row is None else records(self._payloads, [(record_id, row[0])], conn_data(conn))[0]

    def list_records(
        self, session_id: str, *, after_seq: int = -1, limit: int = 100, include_pending: bool = False
    ) -> list[CompletionRecord]:
        """A page of a session's records in `seq` order, starting after `after_seq`."""
        done = "" if include_pending else " AND state = 'done'"
        sql = f"SELECT id, data FROM records WHERE session_id = ? AND seq > ?{done} ORDER BY seq LIMIT ?"
        conn = self._read()
        rows = conn.execute(sql, (session_id, after_seq, limit)).fetchall()
        return records(self._payloads, rows, conn_data(conn))

    def list_records_raw(self, session_id: str, *, after_seq: int = -1, limit: int = 100) -> list[bytes]:
        """Like `list_records` but the stored compact JSON, unparsed (for the HTTP API)."""
        conn = self._read()
        rows = conn.execute(
            "SELECT id, data FROM records WHERE session_id = ? AND seq > ? AND state = 'done' ORDER BY seq LIMIT ?",
            (session_id, after_seq, limit),
        ).fetchall()
        bases: OrderedDict[str, bytes] = OrderedDict()
        whole = [whole_of(self._payloads, rid, data, bases, conn_data(conn)) for rid, data in rows]
        return [w if isinstance(w, bytes) else orjson.dumps(w) for w in whole]

    def session_stats(self, session_id: str) -> dict[str, int]:
        """`{records, failed, next_seq}` for a session (next_seq continues numbering after a restart)."""
        n, failed, max_seq = (
            self._read()
            .execute(
                "SELECT COUNT(*), COALESCE(SUM(failed), 0), COALESCE(MAX(seq), -1) FROM records WHERE session_id = ?",
                (session_id,),
            )
            .fetchone()
        )
        return {"records": int(n), "failed": int(failed), "next_seq": int(max_seq) + 1}

    def count_records(self, session_id: str, where: Callable[[CompletionRecord], bool]) -> int:
        return sum(1 for r in self.list_records(session_id, limit=1 << 30) if where(r))

    def load_sessions(self) -> list[tuple[str, str, float, dict[str, Any]]]:
        rows = self._read().execute("SELECT session_id, api_key, created_at, data FROM sessions").fetchall()
        return [(sid, key, float(created), orjson.loads(data)) for sid, key, created, data in rows]


def read_records(
    directory: str | Path, *, include_pending: bool = False, ids: Iterable[str] | None = None
) -> list[CompletionRecord]:
    """Every record of the store in `directory` (its `records.sqlite` and payload file), ordered by session and `seq`,
    read through a read-only connection (a live proxy may still be writing: the records it committed whose rows are
    still owed are read from their frames); with `ids`, only those records, in that order (an id with no record is
    skipped). Pending rows (calls not finished yet) are left out unless `include_pending`. The one way to read a
    store that this process does not hold open; raises `FileNotFoundError` when there is no store, `StoreCorrupt`
    when a record's payload is missing or damaged."""
    directory = Path(directory)
    path = directory / DB_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path}: no record store")
    payloads = PayloadFile(directory / PAYLOADS_NAME, writable=False)
    try:
        return read_store(path, payloads, include_pending=include_pending, ids=ids)
    finally:
        payloads.close()
