# SPDX-License-Identifier: Apache-2.0
"""The rollout server's durable state: one SQLite database (WAL, synchronous=FULL).

Tables: `tasks` (the spec and state), `sessions` (one row per attempt of one sample: queued → dispatched →
done | failed | cancelled, with the node it went to), `results` (one per sample at most — the UNIQUE constraint is
what makes "no sample is delivered twice" hold across crashes), `callbacks` (pending deliveries with attempt
counts and the next due time) and `nodes`. Every state change is one transaction, so a SIGKILL leaves either the
old or the new state. Session ids are `<task_id>.s<sample>.a<attempt>`.

This module does no HTTP and no scheduling; `server.py` decides, the journal remembers.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Journal", "SessionRow", "session_id_for"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
  task_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, spec BLOB NOT NULL, state TEXT NOT NULL,
  priority INTEGER NOT NULL, created_at REAL NOT NULL, finished_at REAL
);
CREATE TABLE IF NOT EXISTS sessions (
  session_id TEXT PRIMARY KEY, task_id TEXT NOT NULL, sample_index INTEGER NOT NULL, attempt INTEGER NOT NULL,
  state TEXT NOT NULL, node_id TEXT, updated_at REAL NOT NULL, note TEXT,
  UNIQUE (task_id, sample_index, attempt)
);
CREATE INDEX IF NOT EXISTS sessions_state ON sessions (state);
CREATE TABLE IF NOT EXISTS results (
  task_id TEXT NOT NULL, idx INTEGER NOT NULL, sample_index INTEGER NOT NULL, session_id TEXT NOT NULL UNIQUE,
  usable INTEGER NOT NULL, data BLOB NOT NULL, created_at REAL NOT NULL,
  PRIMARY KEY (task_id, idx), UNIQUE (task_id, sample_index)
);
CREATE TABLE IF NOT EXISTS callbacks (
  key TEXT PRIMARY KEY, task_id TEXT NOT NULL, url TEXT NOT NULL, body BLOB NOT NULL, attempts INTEGER NOT NULL,
  state TEXT NOT NULL, next_at REAL NOT NULL, last_error TEXT
);
CREATE INDEX IF NOT EXISTS callbacks_due ON callbacks (state, next_at);
CREATE TABLE IF NOT EXISTS nodes (
  node_id TEXT PRIMARY KEY, url TEXT NOT NULL, capacity INTEGER NOT NULL, registered_at REAL NOT NULL
);
"""

ACTIVE = ("queued", "dispatched")


def session_id_for(task_id: str, sample_index: int, attempt: int) -> str:
    sid = f"{task_id}.s{sample_index}.a{attempt}"
    if len(sid) <= 200:
        return sid
    digest = hashlib.sha1(task_id.encode()).hexdigest()[:16]
    return f"{task_id[:150]}~{digest}.s{sample_index}.a{attempt}"


@dataclass(frozen=True, slots=True)
class SessionRow:
    session_id: str
    task_id: str
    sample_index: int
    attempt: int
    state: str
    node_id: str | None
    updated_at: float
    note: str | None


class Journal:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- tasks -----------------------------------------------------------------------------------------------------

    def get_task(self, task_id: str) -> tuple[bytes, str, float | None] | None:
        row = self._db.execute("SELECT spec, state, finished_at FROM tasks WHERE task_id=?", (task_id,)).fetchone()
        return None if row is None else (bytes(row[0]), row[1], row[2])

    def add_task(self, task_id: str, spec: bytes, priority: int, num_samples: int) -> None:
        now = time.time()
        with self.tx() as db:
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM tasks").fetchone()[0]
            db.execute(
                "INSERT INTO tasks VALUES (?, ?, ?, 'running', ?, ?, NULL)", (task_id, seq, spec, priority, now)
            )
            db.executemany(
                "INSERT INTO sessions VALUES (?, ?, ?, 0, 'queued', NULL, ?, NULL)",
                [(session_id_for(task_id, i, 0), task_id, i, now) for i in range(num_samples)],
            )

    def running_tasks(self) -> list[tuple[str, bytes]]:
        rows = self._db.execute("SELECT task_id, spec FROM tasks WHERE state='running' ORDER BY seq").fetchall()
        return [(r[0], bytes(r[1])) for r in rows]

    def set_task_state(self, task_id: str, state: str) -> None:
        with self.tx() as db:
            db.execute("UPDATE tasks SET state=?, finished_at=? WHERE task_id=?", (state, time.time(), task_id))

    # -- sessions --------------------------------------------------------------------------------------------------

    def _row(self, r: Any) -> SessionRow:
        return SessionRow(*r)

    def session(self, session_id: str) -> SessionRow | None:
        r = self._db.execute("SELECT * FROM sessions WHERE session_id=?", (session_id,)).fetchone()
        return None if r is None else self._row(r)

    def sessions(
        self, *, task_id: str | None = None, state: str | None = None, node_id: str | None = None
    ) -> list[SessionRow]:
        sql, args = "SELECT * FROM sessions WHERE 1=1", []
        for col, val in (("task_id", task_id), ("state", state), ("node_id", node_id)):
            if val is not None:
                sql += f" AND {col}=?"
                args.append(val)
        return [self._row(r) for r in self._db.execute(sql + " ORDER BY updated_at", args).fetchall()]

    def queued(self, limit: int) -> list[SessionRow]:
        rows = self._db.execute(
            "SELECT s.* FROM sessions s JOIN tasks t ON s.task_id=t.task_id WHERE s.state='queued' "
            "ORDER BY t.priority DESC, t.seq, s.sample_index LIMIT ?",
            (limit,),
        ).fetchall()
        return [self._row(r) for r in rows]

    def count_by_state(self, task_id: str) -> dict[str, int]:
        rows = self._db.execute(
            "SELECT state, COUNT(*) FROM sessions WHERE task_id=? GROUP BY state", (task_id,)
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    def inflight_by_node(self) -> dict[str, int]:
        rows = self._db.execute(
            "SELECT node_id, COUNT(*) FROM sessions WHERE state='dispatched' GROUP BY node_id"
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    def set_session(self, session_id: str, state: str, *, node_id: str | None = None, note: str | None = None) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE sessions SET state=?, node_id=COALESCE(?, node_id), updated_at=?, note=COALESCE(?, note) "
                "WHERE session_id=?",
                (state, node_id, time.time(), note, session_id),
            )

    def requeue(self, row: SessionRow, note: str) -> str:
        """Mark an attempt failed and queue the next attempt of the same sample (one transaction)."""
        new_id = session_id_for(row.task_id, row.sample_index, row.attempt + 1)
        now = time.time()
        with self.tx() as db:
            db.execute(
                "UPDATE sessions SET state='failed', updated_at=?, note=? WHERE session_id=?",
                (now, note, row.session_id),
            )
            db.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?, 'queued', NULL, ?, ?)",
                (new_id, row.task_id, row.sample_index, row.attempt + 1, now, f"re-dispatch after: {note}"),
            )
        return new_id

    # -- results and callbacks -------------------------------------------------------------------------------------

    def add_result(
        self, row: SessionRow, data: bytes, usable: bool, *, session_state: str, callback: tuple[str, bytes] | None
    ) -> int | None:
        """Store a sample's result, finish its session and queue its callback atomically; returns the result index,
        or None when the sample already has one (the duplicate is dropped)."""
        now = time.time()
        with self.tx() as db:
            if db.execute(
                "SELECT 1 FROM results WHERE task_id=? AND sample_index=?", (row.task_id, row.sample_index)
            ).fetchone():
                return None
            idx = db.execute(
                "SELECT COALESCE(MAX(idx), 0) + 1 FROM results WHERE task_id=?", (row.task_id,)
            ).fetchone()[0]
            db.execute(
                "INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?)",
                (row.task_id, idx, row.sample_index, row.session_id, int(usable), data, now),
            )
            db.execute(
                "UPDATE sessions SET state=?, updated_at=? WHERE session_id=?", (session_state, now, row.session_id)
            )
            if callback is not None:
                db.execute(
                    "INSERT OR IGNORE INTO callbacks VALUES (?, ?, ?, ?, 0, 'pending', ?, NULL)",
                    (row.session_id, row.task_id, callback[0], callback[1], now),
                )
        return int(idx)

    def results(self, task_id: str, after: int, limit: int) -> list[tuple[int, str, int, bytes]]:
        rows = self._db.execute(
            "SELECT idx, session_id, sample_index, data FROM results WHERE task_id=? AND idx>? ORDER BY idx LIMIT ?",
            (task_id, after, limit),
        ).fetchall()
        return [(r[0], r[1], r[2], bytes(r[3])) for r in rows]

    def result_counts(self, task_id: str) -> tuple[int, int]:
        r = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(usable), 0) FROM results WHERE task_id=?", (task_id,)
        ).fetchone()
        return int(r[0]), int(r[1])

    def due_callbacks(self, now: float, limit: int = 32) -> list[tuple[str, str, bytes, int]]:
        rows = self._db.execute(
            "SELECT key, url, body, attempts FROM callbacks WHERE state='pending' AND next_at<=? ORDER BY next_at "
            "LIMIT ?",
            (now, limit),
        ).fetchall()
        return [(r[0], r[1], bytes(r[2]), r[3]) for r in rows]

    def callback_done(self, key: str, state: str, attempts: int, next_at: float, error: str | None) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE callbacks SET state=?, attempts=?, next_at=?, last_error=? WHERE key=?",
                (state, attempts, next_at, error, key),
            )

    def callback_counts(self, task_id: str) -> dict[str, int]:
        rows = self._db.execute(
            "SELECT state, COUNT(*) FROM callbacks WHERE task_id=? GROUP BY state", (task_id,)
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    # -- nodes -----------------------------------------------------------------------------------------------------

    def put_node(self, node_id: str, url: str, capacity: int) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?)", (node_id, url, capacity, time.time()))

    def nodes(self) -> list[tuple[str, str, int]]:
        return [(r[0], r[1], r[2]) for r in self._db.execute("SELECT node_id, url, capacity FROM nodes").fetchall()]
