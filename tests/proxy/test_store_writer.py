# SPDX-License-Identifier: Apache-2.0
"""Batches that wait for the disk are written by the store's writer thread (`proxy/store_writer.py`): the event loop
serves on meanwhile, later batches follow them there in order, and close writes what the thread was given."""

from __future__ import annotations

import asyncio
import errno
import threading

import pytest

from nemo_polar.proxy.store import RecordStore, StoreWriteError
from nemo_polar.types import CompletionRecord

BIG = 150_000  # a record's JSON of ≈ 160 KB: two of them make a batch written directly (256 KiB or more)


def _rec(i: int, chars: int) -> CompletionRecord:
    return CompletionRecord(
        id=f"r{i}",
        session_id="s1",
        seq=i,
        dialect="openai_chat",
        original_request={"messages": [{"role": "user", "content": "x" * chars}]},
        prompt_token_ids=list(range(2000)),
        generation_token_ids=[5, 6],
        generation_log_probs=[-0.5, -0.25],
    )


class _Appends:
    """`PayloadFile.append` wrapped: which thread wrote each batch (its records' sizes), and a gate the first large
    batch waits at (so the test can act while the disk write is "in flight")."""

    def __init__(self, append):
        self.append, self.seen, self.gate, self.waiting = append, [], threading.Event(), threading.Event()

    def __call__(self, payloads, metas=None):
        size = sum(len(p) if isinstance(p, bytes) else sum(len(x) for x in p) for p in payloads)
        self.seen.append((threading.current_thread().name, len(payloads), size))
        if size >= 256 << 10 and len(self.seen) == 1:
            self.waiting.set()
            assert self.gate.wait(10)
        return self.append(payloads, metas)


def test_a_batch_that_waits_for_the_disk_leaves_the_loop_free_and_later_batches_follow_it(tmp_path):
    store = RecordStore(tmp_path, direct_io=True, session_deltas=False).open()
    appends = _Appends(store._payloads.append)
    store._payloads.append = appends

    async def main():
        big = [asyncio.ensure_future(store.commit(_rec(i, BIG))) for i in (1, 2)]  # one batch, ≈ 320 KB
        await asyncio.sleep(0)  # the loop's turn that writes the batch: handed to the writer thread
        assert await asyncio.get_running_loop().run_in_executor(None, appends.waiting.wait, 10)
        turns = 0
        for _ in range(5):  # the loop keeps turning while the big batch waits for the "disk"
            await asyncio.sleep(0)
            turns += 1
        small = asyncio.ensure_future(store.commit(_rec(3, 10)))
        await asyncio.sleep(0.05)
        assert turns == 5 and not any(f.done() for f in big) and not small.done()  # none overtakes it
        appends.gate.set()
        await asyncio.gather(*big, small)

    asyncio.run(main())
    if store._payloads.direct is not True:
        store.close()
        pytest.skip(f"no direct writes on {tmp_path}'s file system: nothing waits for the disk there")
    names = [name for name, _, _ in appends.seen]
    assert names == ["polar-store-writer", "polar-store-writer"]  # the small one followed the big one there
    assert [n for _, n, _ in appends.seen] == [2, 1]

    async def later():  # the thread idle again: a small batch is written on the loop, at once
        await store.commit(_rec(4, 10))

    asyncio.run(later())
    assert appends.seen[-1][0] == threading.current_thread().name
    assert [r.seq for r in store.list_records("s1")] == [1, 2, 3, 4]
    store.close()


def test_without_direct_writes_every_batch_is_written_on_the_loop(tmp_path):
    store = RecordStore(tmp_path, direct_io=False, session_deltas=False).open()
    appends = _Appends(store._payloads.append)
    appends.gate.set()
    store._payloads.append = appends

    async def main():
        await asyncio.gather(*(store.commit(_rec(i, BIG)) for i in (1, 2)))

    asyncio.run(main())
    assert [name for name, _, _ in appends.seen] == [threading.current_thread().name]
    store.close()


def test_close_writes_what_the_writer_thread_was_given(tmp_path):
    store = RecordStore(tmp_path, direct_io=True, session_deltas=False).open()

    async def main():
        futures = [asyncio.ensure_future(store.commit(_rec(i, BIG))) for i in (1, 2, 3)]
        await asyncio.sleep(0)  # handed to the thread, not awaited: the store closes with them in flight
        return futures

    asyncio.run(main())
    store.close()
    again = RecordStore(tmp_path).open()
    got = again.list_records("s1")
    assert [(r.seq, len(r.original_request["messages"][0]["content"])) for r in got] == [(i, BIG) for i in (1, 2, 3)]
    again.close()


def test_a_delta_whose_base_fails_in_the_same_thread_batch_fails_too(tmp_path):
    """A base and its session delta handed to the busy thread in different loop turns share its next batch: when the
    base's frame fails, the delta (a small row) is not committed either (else a successful commit could not be read)."""
    store = RecordStore(tmp_path, direct_io=True).open()
    appends = _Appends(store._payloads.append)
    real = appends.append

    def failing_second(payloads, metas=None):
        if len(appends.seen) == 2:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(payloads, metas)

    appends.append = failing_second
    store._payloads.append = appends
    msgs = [{"role": "user", "content": "y" * 8000}]
    more = [*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    base, delta = (
        CompletionRecord(
            id=f"b{seq}",
            session_id="d",
            seq=seq,
            dialect="openai_chat",
            original_request={"messages": m},
            prompt_token_ids=list(range(n)),
            generation_token_ids=[5],
            generation_log_probs=[-0.5],
        )
        for seq, m, n in ((1, msgs, 4000), (2, more, 4003))  # the second extends the first: a session delta
    )

    async def main():
        big = [asyncio.ensure_future(store.commit(_rec(i, BIG))) for i in (1, 2)]
        await asyncio.sleep(0)
        assert await asyncio.get_running_loop().run_in_executor(None, appends.waiting.wait, 10)
        first = asyncio.ensure_future(store.commit(base))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(store.commit(delta))
        await asyncio.sleep(0.01)
        appends.gate.set()
        await asyncio.gather(*big)
        return await asyncio.gather(first, second, return_exceptions=True)

    got = asyncio.run(main())
    if store._payloads.direct is not True:
        store.close()
        pytest.skip(f"no direct writes on {tmp_path}'s file system: nothing waits for the disk there")
    assert all(isinstance(r, StoreWriteError) for r in got), got
    assert store.get_record("b2") is None and store.get_record("b1") is None
    store.close()


def test_a_batch_that_breaks_off_in_the_thread_fails_its_callers_and_the_thread_goes_on(tmp_path):
    store = RecordStore(tmp_path, direct_io=True, session_deltas=False).open()
    arm, calls = store._arm, []

    def broken_once(batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise ValueError("injected: a bug outside the write's own error handling")
        return arm(batch)

    store._arm = broken_once

    async def main():
        first = await asyncio.wait_for(
            asyncio.gather(*(store.commit(_rec(i, BIG)) for i in (1, 2)), return_exceptions=True), 5
        )
        assert all(isinstance(r, ValueError) for r in first), first
        await asyncio.wait_for(asyncio.gather(*(store.commit(_rec(i, BIG)) for i in (3, 4))), 5)  # the thread goes on
        await asyncio.wait_for(store.commit(_rec(5, 10)), 5)  # and a small commit is not stuck behind it

    asyncio.run(main())
    assert not store._thread.busy and store._thread.alive()
    store.close()
