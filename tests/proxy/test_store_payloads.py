# SPDX-License-Identifier: Apache-2.0
"""The record store's payload file: large records' JSON beside the database, checked on every read; stores written
before it still read; concurrent writers (threads and processes) never overlap; a commit survives a SIGKILL; synced
pages behind the kept window leave the OS's page cache."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import orjson
import pytest

from nemo_polar.proxy import payloads
from nemo_polar.proxy.payloads import _REF, _RFRAME, PayloadFile
from nemo_polar.proxy.record_json import record_bytes
from nemo_polar.proxy.store import DB_NAME, INLINE_MAX, PAYLOADS_NAME, RecordStore, StoreCorrupt, read_records
from nemo_polar.types import CompletionRecord
from tests.proxy.test_payload_direct import _needs_direct_writes
from tests.proxy.test_store import old_store_db


def _frame_size(rec: CompletionRecord, state: str = "done") -> int:
    """The bytes of the store's frame of `rec`: its header, its row's fields (the meta) and its JSON."""
    meta = orjson.dumps([rec.id, rec.session_id, rec.seq, state, 0 if rec.error is None else 1, "w" * 32])  # writer
    return _RFRAME.size + len(meta) + len(record_bytes(rec))


def _rec(i: int, session: str = "s1", *, tokens: int = 2000) -> CompletionRecord:
    return CompletionRecord(
        id=f"r{i}" if session == "s1" else f"{session}-r{i}",
        session_id=session,
        seq=i,
        dialect="openai_chat",
        original_request={"i": i},
        prompt_token_ids=[(i * 7 + k) % 50_000 for k in range(tokens)],
        generation_token_ids=[i, 6, 7],
        generation_log_probs=[-0.5, -0.25, float(-i)],
    )


def _rows(directory) -> dict[str, bytes]:
    with sqlite3.connect(f"file:{directory / DB_NAME}?mode=ro", uri=True) as db:
        return {rid: bytes(data) for rid, data in db.execute("SELECT id, data FROM records")}


def _commit_all(store: RecordStore, records: list[CompletionRecord]) -> None:
    async def main():
        await asyncio.gather(*(store.commit(r) for r in records))

    asyncio.run(main())


@pytest.mark.parametrize("fsync", [False, True], ids=["inline-normal", "thread-full"])
def test_large_records_go_to_the_payload_file_small_ones_stay_inline(tmp_path, fsync):
    small, large = _rec(0, tokens=10), _rec(1)
    assert len(record_bytes(small)) <= INLINE_MAX < len(record_bytes(large))
    store = RecordStore(tmp_path, fsync=fsync, direct_io=False).open()  # frames back to back (direct: padded)
    _commit_all(store, [small, large, _rec(2)])
    assert store.get_record("r0") == small and store.get_record("r1") == large
    assert store.list_records("s1") == [small, large, _rec(2)]
    assert store.list_records_raw("s1") == [record_bytes(r) for r in (small, large, _rec(2))]
    store.close()
    rows = _rows(tmp_path)
    assert rows["r0"] == record_bytes(small)  # inline: the JSON itself
    assert len(rows["r1"]) == len(rows["r2"]) == 17 and rows["r1"][:1] == b"\x02"  # a reference to a frame with meta
    sidecar = (tmp_path / PAYLOADS_NAME).stat().st_size
    assert sidecar == sum(_frame_size(r) for r in (large, _rec(2)))
    assert read_records(tmp_path) == [small, large, _rec(2)]
    assert [r.id for r in read_records(tmp_path, ids=["r2", "nope", "r0"])] == ["r2", "r0"]


def test_a_streams_placeholder_and_final_record_both_read_back(tmp_path):
    """A large placeholder goes to the payload file too; a killed run's placeholder is recovered from it."""
    store = RecordStore(tmp_path).open()
    placeholder = _rec(0)

    async def main():
        await store.put_pending(placeholder)
        await store.put_pending(_rec(1))
        await store.commit(_rec(1))

    asyncio.run(main())
    assert [r.id for r in store.list_records("s1", include_pending=True)] == ["r0", "r1"]
    store.write_rows()
    assert _rows(tmp_path)["r0"][:1] == b"\x02"
    store.close()  # with the call still open, as a killed proxy leaves it
    store2 = RecordStore(tmp_path).open()
    got = store2.get_record("r0")
    assert got.error["type"] == "interrupted" and got.prompt_token_ids == placeholder.prompt_token_ids
    assert store2.get_record("r1") == _rec(1)
    store2.close()


def test_a_store_written_before_the_payload_file_still_reads_and_grows(tmp_path):
    """Rows with their JSON inline, however large, and no payload file: read as they are, by the store and by
    `read_records`; new commits then go to the payload file beside them."""
    old = [_rec(0), _rec(1, tokens=10)]
    db = old_store_db(tmp_path)
    for r in old:
        db.execute("INSERT INTO records VALUES (?, ?, ?, 'done', 0, ?)", (r.id, r.session_id, r.seq, record_bytes(r)))
    db.close()
    assert read_records(tmp_path) == old
    assert not (tmp_path / PAYLOADS_NAME).exists()  # reading creates nothing
    store = RecordStore(tmp_path).open()
    _commit_all(store, [_rec(2)])
    assert store.list_records("s1") == [*old, _rec(2)]
    store.close()
    assert read_records(tmp_path) == [*old, _rec(2)]
    assert _rows(tmp_path)["r0"] == record_bytes(old[0])


def _damage(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize(
    ("what", "bad", "message"),
    [
        ("torn", "r1", "cut short"),
        ("flipped byte", "r0", "checksum"),
        ("overwritten header", "r1", "no matching frame header"),
        ("missing file", "r0", "no payload file"),
    ],
)
def test_a_damaged_payload_is_a_clear_error_naming_the_record(tmp_path, what, bad, message):
    store = RecordStore(tmp_path).open()
    _commit_all(store, [_rec(0), _rec(1)])
    store.close()
    path = tmp_path / PAYLOADS_NAME
    first = _frame_size(_rec(0))
    if what == "torn":  # the second frame only partly on disk
        os.truncate(path, first + _RFRAME.size + 100)
    elif what == "flipped byte":
        _damage(path, first - 50, b"#")
    elif what == "overwritten header":
        _damage(path, first, b"\0" * _RFRAME.size)
    else:
        path.unlink()
    with pytest.raises(StoreCorrupt, match=f"record '{bad}'.*{message}"):
        read_records(tmp_path)
    store = RecordStore(tmp_path).open()
    with pytest.raises(StoreCorrupt, match=f"record '{bad}'"):
        store.get_record(bad)
    with pytest.raises(StoreCorrupt, match=f"record '{bad}'"):
        store.list_records_raw("s1")
    good = "r1" if bad == "r0" else "r0"
    if what != "missing file":
        assert store.get_record(good) == _rec(int(good[1:]))
    store.close()


_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from nemo_polar.proxy.store import RecordStore
    from tests.proxy.test_store_payloads import _rec

    directory, session, n, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "hold"
    if sys.argv[5] == "on":  # every batch direct, however small
        import nemo_polar.proxy.payloads
        nemo_polar.proxy.payloads.DIRECT_MIN_BYTES = 0
    store = RecordStore(directory, direct_io={"on": True, "off": False}.get(sys.argv[5])).open()

    async def main():
        for i in range(0, n, 4):
            await asyncio.gather(*(store.commit(_rec(k, session)) for k in range(i, min(n, i + 4))))
        if hold:
            await store.put_pending(_rec(n, session))

    if not hold:  # start together with the parent's writers
        print("ready", flush=True)
        sys.stdin.readline()
    asyncio.run(main())
    print("committed", flush=True)
    if hold:  # killed here: no close, no checkpoint
        sys.stdin.read()
    store.close()
    """
)


def _child(tmp_path, session: str, n: int, hold: bool, direct: str = "auto") -> subprocess.Popen[str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path), session, str(n), "hold" if hold else "run", direct],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": root},
    )


@pytest.mark.parametrize("direct", ["off", "on", "mixed"])
def test_concurrent_writers_in_threads_and_processes_never_overlap(tmp_path, direct, monkeypatch):
    """Two stores in this process (the event loop's writes and a writer thread's) and one in another process
    commit to one store at once: every record reads back whole and its own. Written through the page cache the
    frames lie back to back; with direct writes (or some writers direct, some not) each batch starts on a 4 KiB
    boundary, and no two frames overlap."""
    n = 60
    on = {"off": (False, False, "off"), "on": (True, True, "on"), "mixed": (True, False, "off")}[direct]
    monkeypatch.setattr(payloads, "DIRECT_MIN_BYTES", 0)  # every batch of a direct writer direct, however small
    child = _child(tmp_path, "proc", n, hold=False, direct=on[2])
    a = RecordStore(tmp_path, direct_io=on[0]).open()
    b = RecordStore(tmp_path, fsync=True, direct_io=on[1]).open()
    assert child.stdout.readline().strip() == "ready"
    child.stdin.write("go\n")
    child.stdin.flush()

    async def main():
        for i in range(0, n, 3):
            await asyncio.gather(
                *(a.commit(_rec(k, "a")) for k in range(i, i + 3)),
                *(b.commit(_rec(k, "b")) for k in range(i, i + 3)),
            )

    asyncio.run(main())
    assert child.wait(timeout=30) == 0
    a.close()
    b.close()
    got = read_records(tmp_path)
    assert len(got) == 3 * n
    for r in got:
        assert r == _rec(r.seq, r.session_id)
    sizes = {r.id: _frame_size(r) for r in got}
    frames = sorted((_REF.unpack(ref)[1], sizes[rid]) for rid, ref in _rows(tmp_path).items())
    assert len(frames) == 3 * n
    size = (tmp_path / PAYLOADS_NAME).stat().st_size
    if direct == "off":
        assert size == sum(length for _, length in frames)  # back to back: no gap, no overlap
    else:
        _needs_direct_writes(tmp_path)
        ends = [offset + length for offset, length in frames]
        assert all(end <= nxt for end, (nxt, _) in zip(ends, frames[1:], strict=False))  # no overlap
        assert ends[-1] <= size
        if direct == "on":
            assert size % 4096 == 0


def test_a_committed_record_survives_sigkill_of_its_process(tmp_path):
    child = _child(tmp_path, "k", 6, hold=True)
    try:
        assert child.stdout.readline().strip() == "committed"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert read_records(tmp_path) == [_rec(i, "k") for i in range(6)]
    store = RecordStore(tmp_path).open()  # the killed run's placeholder becomes an interrupted failure
    placeholder = store.get_record("k-r6")
    assert placeholder.error["type"] == "interrupted" and placeholder.prompt_token_ids == _rec(6, "k").prompt_token_ids
    store.close()


def test_a_batch_is_written_in_bounded_vectored_writes_and_survives_short_writes(tmp_path, monkeypatch):
    """Frames go out back to back in writes of at most `_WRITE_MAX` bytes (one larger frame alone), never as one
    joined buffer; a write the kernel cuts short is resumed where it stopped."""
    parts = [bytes([i % 251]) * size for i, size in enumerate([12, 700_000, 12, 600_000, 12, 2_500_000, 12, 5, 12, 9])]
    calls: list[int] = []
    real = os.pwritev

    def pwritev(fd: int, buffers: list[bytes], offset: int) -> int:
        size = sum(map(len, buffers))
        calls.append(size)
        if len(calls) == 2:  # the kernel writes only part of the second group
            return real(fd, [b"".join(buffers)[: size // 3]], offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(payloads.os, "pwritev", pwritev)
    path = tmp_path / "frames"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"head")
        payloads._write_at(fd, parts, 4)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"head" + b"".join(parts)
    # 12 + 700,000 + 12; the next frame would pass 1 MiB: 600,000 + 12; the 2.5 MB frame alone; the small rest
    assert calls == [700_024, 600_012, 2_500_000, 38]


def _resident(path, start: int, end: int) -> int:
    """Pages of `path` in [start, end) that are in the OS's page cache (`mincore` on a private mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start -= start % page
    n = (end - start + page - 1) // page
    with open(path, "rb") as f, mmap.mmap(f.fileno(), end - start, access=mmap.ACCESS_COPY, offset=start) as mm:
        vec = (ctypes.c_ubyte * n)()
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(end - start), vec) != 0:
            pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
        return sum(v & 1 for v in vec)


def _needs_droppable_pages(directory) -> None:
    """Skip where the OS keeps a file's clean pages cached whatever it is told (tmpfs: the cache is the file), probed
    on a file of its own, so a `drop_cached` that does nothing still fails the tests below."""
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise on this platform")
    probe = directory / "probe"
    probe.write_bytes(b"x" * (1 << 20))
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if _resident(probe, 0, 1 << 20):
        pytest.skip(f"{directory}'s file system keeps pages in memory after POSIX_FADV_DONTNEED (tmpfs?)")
    probe.unlink()


def test_synced_pages_before_the_given_offset_leave_the_page_cache_and_still_read(tmp_path):
    _needs_droppable_pages(tmp_path)
    pf = PayloadFile(tmp_path / PAYLOADS_NAME, writable=True, direct_io=False)
    blobs = [bytes([i]) * (256 << 10) for i in range(16)]  # 4 MiB of frames
    refs = pf.append(blobs)
    synced = pf.sync()
    assert synced == os.path.getsize(pf.path)
    pages = synced // mmap.PAGESIZE
    assert _resident(pf.path, 0, synced) >= pages - 1  # written through the page cache
    pf.drop_cached(synced // 2)
    head, tail = _resident(pf.path, 0, synced // 2), _resident(pf.path, synced // 2, synced)
    assert head <= 1 and tail >= pages // 2 - 1  # the head dropped (an edge page may stay), the tail kept
    pf.drop_cached(synced // 4)  # behind what was dropped already: nothing to do
    assert [pf.resolve(f"r{i}", ref) for i, ref in enumerate(refs)] == blobs  # read back from the disk
    pf.close()


@pytest.mark.parametrize("keep_mb", [0, None], ids=["window-0", "keep-all"])
def test_the_store_keeps_only_its_window_of_the_payload_file_cached(tmp_path, keep_mb):
    _needs_droppable_pages(tmp_path)
    records = [_rec(i, tokens=20_000) for i in range(40)]  # ~110 KB of JSON each: ~4.4 MB of frames
    store = RecordStore(tmp_path, page_cache_mb=keep_mb, direct_io=False)  # written through the page cache
    store.checkpoint_every_s = 0.05
    store.open()
    _commit_all(store, records)
    path = tmp_path / PAYLOADS_NAME
    size = path.stat().st_size
    pages = size // mmap.PAGESIZE
    deadline = time.monotonic() + 10
    while keep_mb == 0 and _resident(path, 0, size) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the checkpointer's next round syncs and drops
    resident = _resident(path, 0, size)
    assert store.list_records("s1") == records  # every record still reads, from the disk where dropped
    store.close()
    assert resident >= pages - 1 if keep_mb is None else resident <= 1


def test_a_negative_window_is_refused():
    with pytest.raises(ValueError, match="page_cache_mb must be >= 0 or None"):
        RecordStore("unused", page_cache_mb=-1)


@pytest.mark.parametrize(
    ("flags", "kept"),
    [([], 256 << 20), (["--store-page-cache-mb", "16"], 16 << 20), (["--store-page-cache-mb", "all"], None)],
)
def test_polar_proxy_s_flag_sets_the_store_s_window(tmp_path, flags, kept):
    assert proxy_from_flags(tmp_path, flags).store._keep_cached == kept
    with pytest.raises(SystemExit):
        proxy_from_flags(tmp_path, ["--store-page-cache-mb", "-1"])


def proxy_from_flags(tmp_path, flags: list[str]):  # type: ignore[no-untyped-def]
    """The `Proxy` that `polar proxy --upstream ... --store tmp_path FLAGS` builds (not started)."""
    import argparse

    from nemo_polar.keywords import same_named
    from nemo_polar.proxy import cli
    from nemo_polar.proxy.app import Proxy
    from nemo_polar.proxy.config import ProxyConfig

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["proxy", "--upstream", "http://127.0.0.1:9", "--store", str(tmp_path), *flags])
    return Proxy(
        ProxyConfig(**same_named(args, ProxyConfig, upstreams=args.upstream, store_dir=args.store, sampling={}))
    )


def test_a_frame_appended_alone_is_the_frame_a_batch_writes_and_a_failed_one_is_cut_off(tmp_path, monkeypatch):
    """`append_one` (a record committed alone) writes the very frame `append` writes for it, with the same reference
    but its offset; a write that fails leaves the file as it was; one too large for the page cache is `append`'s;
    threads appending at once through two descriptors never overlap."""
    import threading

    path = tmp_path / PAYLOADS_NAME
    pf = PayloadFile(path, writable=True, direct_io=False)
    pieces = [b'{"a":', memoryview(b'x"bcdef"')[1:], b"}"]
    one = pf.append_one(pieces, b'["m1"]')
    (batch,) = pf.append([pieces], [b'["m1"]'])
    raw = path.read_bytes()
    assert raw[: len(raw) // 2] == raw[len(raw) // 2 :]  # the same frame twice
    assert one[0] == batch[0] and one[9:] == batch[9:] and _REF.unpack(batch)[1] == len(raw) // 2
    assert pf.resolve("r", one) == b'{"a":"bcdef"}' and [m for m, _ in pf.scan(0)] == [b'["m1"]'] * 2

    def torn(fd, parts, offset):
        os.pwrite(fd, b"partial", offset)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(payloads.os, "pwritev", torn)
    with pytest.raises(OSError, match="No space"):
        pf.append_one(pieces, b'["m2"]')
    monkeypatch.undo()
    assert path.read_bytes() == raw
    calls = []
    monkeypatch.setattr(pf, "append", lambda *a: calls.append(a) or [b"ref"])
    assert pf.append_one([b"x" * payloads.DIRECT_MIN_BYTES], b"[]") == b"ref" and len(calls) == 1
    monkeypatch.undo()

    other = PayloadFile(path, writable=True, direct_io=False)
    refs: list[bytes] = []

    def write(f, tag):
        refs.extend(f.append_one([tag * 3000, b"!"], b'["%s"]' % tag) for _ in range(100))

    threads = [threading.Thread(target=write, args=(f, t)) for f, t in ((pf, b"p"), (other, b"q"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(pf.resolve("r", ref)[:1] for ref in refs) == [b"p"] * 100 + [b"q"] * 100
    assert len(list(pf.scan(len(raw)))) == 200
    pf.close()
    other.close()
