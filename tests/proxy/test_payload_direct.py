# SPDX-License-Identifier: Apache-2.0
"""The payload file's direct writes (`PayloadFile(direct_io=)`): batches start on 4 KiB boundaries, are padded with
zeros, bypass the page cache and read back; a file system that refuses O_DIRECT (at the open or at the write) gets
the page cache; `auto` chooses by the file system the mount table names; `polar proxy --store-direct-io`."""

from __future__ import annotations

import errno
import os

import pytest

from nemo_polar.proxy import payloads
from nemo_polar.proxy.payloads import PayloadFile, file_system

_FRAME_HEADER = 12
REAL_OPEN, REAL_PWRITE = os.open, os.pwrite


def _needs_direct_writes(directory) -> None:
    """Skip where `directory`'s file system refuses O_DIRECT, probed with one aligned write."""
    import mmap

    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    probe = directory / "direct-probe"
    buf = mmap.mmap(-1, 4096)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        try:
            os.pwrite(fd, buf, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        pytest.skip(f"{directory}'s file system refuses O_DIRECT ({exc})")
    finally:
        buf.close()
        probe.unlink(missing_ok=True)


def test_the_file_system_is_read_from_the_mount_table(tmp_path):
    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "30 22 0:40 / /data rw shared:2 - xfs /dev/vdb rw\n"
        "31 30 0:41 / /data/nfs\\040share rw shared:3 - nfs4 srv:/export rw,vers=4.2\n"
        "32 22 0:42 / /dev/shm rw shared:4 - tmpfs tmpfs rw\n"
        "33 22 0:43 / /data rw shared:5 - btrfs /dev/vdc rw\n"  # mounted over the xfs one: it hides it
        "garbage line\n"
    )
    where = str(table)
    assert file_system("/var/log/x", where) == "ext4"
    assert file_system("/data/run/records.sqlite-payloads", where) == "btrfs"
    assert file_system("/data/nfs share/records", where) == "nfs4"
    assert file_system("/data/nfs shared", where) == "btrfs"  # a name that only starts like the mount point
    assert file_system("/dev/shm", where) == "tmpfs"
    assert file_system("/x", str(tmp_path / "missing")) is None


def test_direct_appends_start_on_block_boundaries_and_read_back(tmp_path, monkeypatch):
    """Three batches, one larger than the (shrunk) staging buffer: each starts on a 4 KiB boundary, its frames back
    to back, its end padded with zeros; none of it lands in the page cache; every payload reads back."""
    from tests.proxy.test_store_payloads import _resident

    _needs_direct_writes(tmp_path)
    monkeypatch.setattr(payloads, "_STAGE_BYTES", 16 << 10)  # the staging buffer fills and goes out mid-batch
    monkeypatch.setattr(payloads, "DIRECT_MIN_BYTES", 0)  # every batch direct, however small
    pf = PayloadFile(tmp_path / "payloads", writable=True, direct_io=True)
    batches = [[b"a" * 5000, b"b" * 20_000, b"c" * 70_001], [b"d" * 100], [[b"e" * 3000, b"f" * 40_000]]]
    refs = [pf.append(batch) for batch in batches]
    assert pf.direct is True
    size = os.path.getsize(pf.path)
    assert size % 4096 == 0
    assert _resident(pf.path, 0, size) == 0  # never through the page cache
    raw = pf.path.read_bytes()
    ends = []
    for batch, batch_refs in zip(batches, refs, strict=True):
        offsets = [payloads._REF.unpack(r)[1] for r in batch_refs]
        assert offsets[0] % 4096 == 0
        at = offsets[0]
        for data, offset in zip(batch, offsets, strict=True):
            assert offset == at  # back to back within a batch
            at += _FRAME_HEADER + len(b"".join(data) if isinstance(data, list) else data)
        ends.append(at)
    starts = [payloads._REF.unpack(r[0])[1] for r in refs]
    for end, nxt in zip(ends, [*starts[1:], size], strict=True):
        assert end <= nxt and raw[end:nxt] == bytes(nxt - end)  # the padding: zeros, up to the next boundary
    for i, (batch, batch_refs) in enumerate(zip(batches, refs, strict=True)):
        for data, ref in zip(batch, batch_refs, strict=True):
            assert pf.resolve(f"r{i}", ref) == (b"".join(data) if isinstance(data, list) else data)
    # below the threshold a batch goes through the page cache, right after the last one's padding
    monkeypatch.setattr(payloads, "DIRECT_MIN_BYTES", 64 << 10)
    small = pf.append([b"g" * 20_000])[0]
    large = pf.append([b"h" * 70_000])[0]
    assert payloads._REF.unpack(small)[1] == size
    assert payloads._REF.unpack(large)[1] == size + 20_480  # the buffered frame (20,012 bytes), aligned up
    assert _resident(pf.path, size, size + 20_012) >= 4  # the small batch's pages: in the page cache
    assert pf.resolve("g", small) == b"g" * 20_000 and pf.resolve("h", large) == b"h" * 70_000
    pf.close()


def _refusing_open(real):
    def fake(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *args)

    return fake


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")
def test_a_file_system_that_refuses_direct_writes_gets_the_page_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(payloads, "DIRECT_MIN_BYTES", 0)
    # refused at the open (tmpfs on older kernels, for one): the page cache from the first batch on
    monkeypatch.setattr(payloads.os, "open", _refusing_open(os.open))
    pf = PayloadFile(tmp_path / "at-open", writable=True, direct_io=True)
    refs = pf.append([b"x" * 9000, b"y" * 10])
    assert pf.direct is False
    assert os.path.getsize(pf.path) == 2 * _FRAME_HEADER + 9010  # back to back, no padding
    assert [pf.resolve("r", ref) for ref in refs] == [b"x" * 9000, b"y" * 10]
    pf.close()
    monkeypatch.setattr(payloads.os, "open", REAL_OPEN)

    # taken at the open, refused at the write: this batch is written through the page cache, and so is the next
    _needs_direct_writes(tmp_path)
    pf = PayloadFile(tmp_path / "at-write", writable=True, direct_io=True)
    first = pf.append([b"a" * 5000])
    assert pf.direct is True

    def pwrite(fd, data, offset):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(payloads.os, "pwrite", pwrite)
    second = pf.append([b"b" * 7000, b"c" * 3])
    assert pf.direct is False
    monkeypatch.setattr(payloads.os, "pwrite", REAL_PWRITE)
    third = pf.append([b"d" * 11])
    assert payloads._REF.unpack(second[0])[1] == 8192  # after the direct batch (5,012 bytes) and its padding
    assert os.path.getsize(pf.path) == 8192 + 3 * _FRAME_HEADER + 7014
    assert pf.resolve("a", first[0]) == b"a" * 5000
    assert [pf.resolve("b", r) for r in second] == [b"b" * 7000, b"c" * 3]
    assert pf.resolve("d", third[0]) == b"d" * 11
    pf.close()


def test_any_other_write_error_is_raised_and_direct_writes_stay_on(tmp_path, monkeypatch):
    _needs_direct_writes(tmp_path)
    monkeypatch.setattr(payloads, "DIRECT_MIN_BYTES", 0)
    pf = PayloadFile(tmp_path / "full", writable=True, direct_io=True)

    def pwrite(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(payloads.os, "pwrite", pwrite)
    with pytest.raises(OSError, match="No space left"):  # the store makes it a StoreWriteError (test_store_full)
        pf.append([b"z" * 5000])
    assert pf.direct is True
    monkeypatch.setattr(payloads.os, "pwrite", REAL_PWRITE)
    ref = pf.append([b"z" * 5000])[0]
    assert pf.resolve("z", ref) == b"z" * 5000
    pf.close()


@pytest.mark.parametrize("fs", ["nfs4", "tmpfs", "fuse.sshfs", "ext4"])
def test_auto_writes_directly_only_on_local_block_file_systems(tmp_path, monkeypatch, fs):
    monkeypatch.setattr(payloads, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(payloads, "file_system", lambda path: fs)
    pf = PayloadFile(tmp_path / "auto", writable=True)  # direct_io=None: auto
    ref = pf.append([b"q" * 6000])[0]
    if fs == "ext4":
        _needs_direct_writes(tmp_path)
    assert pf.direct is (fs == "ext4")
    assert pf.resolve("q", ref) == b"q" * 6000
    pf.close()


@pytest.mark.parametrize(
    ("flags", "want"), [([], None), (["--store-direct-io", "on"], True), (["--store-direct-io", "off"], False)]
)
def test_polar_proxy_s_flag_sets_direct_writes(tmp_path, flags, want):
    from tests.proxy.test_store_payloads import proxy_from_flags

    assert proxy_from_flags(tmp_path, flags).store._payloads._direct_io is want
    with pytest.raises(SystemExit):
        proxy_from_flags(tmp_path, ["--store-direct-io", "yes"])


def test_auto_on_a_real_tmpfs_uses_the_page_cache() -> None:
    """The mount table read for real: a payload file on /dev/shm (tmpfs) with the default `auto` is written through
    the page cache."""
    import shutil
    import tempfile

    if file_system("/dev/shm") != "tmpfs" or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable tmpfs at /dev/shm here")
    where = tempfile.mkdtemp(dir="/dev/shm", prefix="polar-direct-")
    try:
        pf = PayloadFile(payloads.Path(where) / "payloads", writable=True)
        data = b"t" * (payloads.DIRECT_MIN_BYTES + 1)
        refs = pf.append([data])
        assert pf.direct is False
        assert os.path.getsize(pf.path) == _FRAME_HEADER + len(data)  # no padding: not a direct write
        assert pf.resolve("t", refs[0]) == data
        pf.close()
    finally:
        shutil.rmtree(where)
