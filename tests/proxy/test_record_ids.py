# SPDX-License-Identifier: Apache-2.0
"""Record ids (`recording.record_id`): UUID version 7 as 32 hex digits, ordered by time to the millisecond, unique,
drawn from a generator of their own (a caller seeding `random` does not repeat them; a forked child draws others),
and in the store they keep a batch's primary-key entries together (fewer WAL pages a commit than random ids)."""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid

import pytest

from nemo_polar.proxy import recording
from nemo_polar.proxy.recording import record_id
from nemo_polar.proxy.store import RecordStore
from nemo_polar.types import CompletionRecord


def test_an_id_is_a_version_7_uuid_of_now() -> None:
    before = time.time_ns() // 1_000_000
    rid = record_id()
    after = time.time_ns() // 1_000_000
    assert len(rid) == 32 and rid == rid.lower()
    parsed = uuid.UUID(rid)
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert before <= int(rid[:12], 16) <= after


def test_ids_are_unique_and_sort_by_the_millisecond_they_were_made_in() -> None:
    first = [record_id() for _ in range(50_000)]
    assert len(set(first)) == len(first)
    time.sleep(0.002)
    later = record_id()
    assert all(rid < later for rid in first)


def test_seeding_random_does_not_repeat_ids() -> None:
    random.seed(1234)
    a = [record_id() for _ in range(3)]
    random.seed(1234)
    b = [record_id() for _ in range(3)]
    assert {x[12:] for x in a}.isdisjoint(x[12:] for x in b)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_draws_other_ids() -> None:
    state = recording._ids.getstate()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's generator state, reseeded at the fork
        os.close(read)
        os.write(write, record_id()[12:].encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    recording._ids.setstate(state)  # what the child would have drawn without the reseed
    assert len(child) == 20 and child != record_id()[12:]


def _wal_pages_a_commit(tmp_path, name: str, make_id) -> float:  # type: ignore[no-untyped-def]
    """WAL pages a commit of 20 new records appends, in a store already holding 8,000."""
    store = RecordStore(tmp_path / name, session_deltas=False)
    store.checkpoint_every_s = 3600.0  # no checkpoint: the WAL keeps every frame written
    store.open()
    wal = store.path.with_name(store.path.name + "-wal")

    async def commit(batches: int, size: int) -> None:
        for _ in range(batches):
            records = [
                CompletionRecord(id=make_id(), session_id="s", seq=0, dialect="openai_chat") for _ in range(size)
            ]
            await asyncio.gather(*(store.commit(r) for r in records))

    asyncio.run(commit(1, 8_000))
    before = wal.stat().st_size
    asyncio.run(commit(20, 20))
    pages = (wal.stat().st_size - before) / (4096 + 24) / 20
    store.close()
    return pages


def test_a_batch_of_new_ids_dirties_fewer_index_pages_than_random_ids(tmp_path) -> None:
    ordered = _wal_pages_a_commit(tmp_path, "v7", record_id)
    scattered = _wal_pages_a_commit(tmp_path, "v4", lambda: uuid.uuid4().hex)
    assert ordered < 0.5 * scattered, (ordered, scattered)
