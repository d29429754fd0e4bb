# SPDX-License-Identifier: Apache-2.0
"""The record store's writer thread: batches written off the event loop (`proxy/store.py`, "Writes").

Without `fsync` the store writes a batch on the event loop, where a small write into the OS's page cache returns at
once. A batch large enough for a direct write (`PayloadFile.direct_for`: 256 KiB or more, on a local disk) waits
for the disk instead: ≈ 0.7 ms for the 0.9 MB of a batch at 64 calls in flight on this project's VMs, time in which
the loop served nothing. Such a batch goes to this thread, and so does every batch after it until the thread has
written all it was given, so batches are written in the order they were submitted; the loop serves other calls
meanwhile, and each caller's future resolves on its own loop once its batch is written. With `fsync` every batch
goes here (a sync always waits for the disk). docs/performance.md, "The loop and the disk".
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["WriterThread", "resolve", "resolve_all"]

_STOP = object()
log = logging.getLogger(__name__)


def _fail(batch: list[Any], exc: BaseException) -> None:
    """Every caller of a batch that broke off gets `exc`, on its own loop (items are (op, loop, future))."""
    for _, _, fut in batch:
        try:
            fut.get_loop().call_soon_threadsafe(resolve, fut, exc)
        except RuntimeError:  # that loop is closed: nobody is waiting any more
            pass


def resolve(fut: asyncio.Future[None], error: BaseException | None) -> None:
    """A caller's outcome: None resolves its future, an error fails it (once: a later outcome is dropped)."""
    if not fut.done():
        fut.set_result(None) if error is None else fut.set_exception(error)


def resolve_all(outcomes: list[tuple[asyncio.Future[None], BaseException | None]]) -> None:
    """A written batch's outcomes, on its callers' loop (one wake-up for them all)."""
    for fut, error in outcomes:
        resolve(fut, error)


class WriterThread:
    """One thread that runs `write(batch)` for the items `put` hands it, in order, up to `max_batch` items a call
    (`connect()` is called once in the thread, its result passed to each `write` and closed when the thread stops)."""

    def __init__(
        self,
        connect: Callable[[], Any],
        write: Callable[[Any, list[Any]], None],
        max_batch: int,
        name: str = "polar-store-writer",
    ):
        self._connect, self._write, self._max = connect, write, max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._owed = 0  # items put and not yet written
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Items handed over are not all written yet: a new batch must follow them here, not overtake them."""
        return self._owed > 0

    def alive(self) -> bool:
        return self._thread.is_alive()

    def put(self, items: list[Any]) -> None:
        with self._lock:
            self._owed += len(items)
        for item in items:
            self._queue.put(item)

    def stop(self, timeout_s: float = 30) -> None:
        """Write what was put, then end the thread (waits up to `timeout_s`)."""
        self._queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        conn = self._connect()
        stop = False
        try:
            while not stop:
                batch = [self._queue.get()]
                while len(batch) < self._max:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                stop = any(item is _STOP for item in batch)
                batch = [item for item in batch if item is not _STOP]
                if batch:
                    try:
                        self._write(conn, batch)
                    except BaseException as exc:  # a bug, not the disk (`write` reports that): the thread goes on
                        log.exception("store writer: a batch of %d broke off", len(batch))
                        _fail(batch, exc)
                    finally:
                        with self._lock:
                            self._owed -= len(batch)
        finally:
            conn.close()
