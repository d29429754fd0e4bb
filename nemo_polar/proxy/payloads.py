# SPDX-License-Identifier: Apache-2.0
"""The record store's payload file (`records.sqlite-payloads`): large records' JSON, appended as checksummed frames.

A frame is a 12-byte header (magic `PLRP`, the payload's length, its crc32) and the payload; the record store's frames
also carry their row's fields (magic `PLRR`, an 18-byte header with the meta's length and crc32, the meta, then the
payload), so the rows can be rebuilt from the file (`scan`). The store's row for the record keeps a 17-byte reference
to it (a tag byte JSON never starts with, the frame's offset, the payload's length and crc32), so a read checks the
frame against what the row says: a torn, truncated, overwritten or missing payload is `StoreCorrupt` naming the
record, never other bytes. Appends take an exclusive `flock` of the file, so writers in several processes never take
the same offset. Why the payloads live here and not in the rows, and how the file keeps the store's durability:
`proxy/store.py`'s docstring and docs/contracts.md, "Storage".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from nemo_polar.errors import PolarError

try:  # zlib.crc32's value, ~4x faster on a large payload, where the CPU can fold it (nemo_polar/_arrays.c)
    from nemo_polar._arrays import CRC32_SIMD
    from nemo_polar._arrays import crc32 as _crc32_fold
except ImportError:  # built without a compiler: zlib's
    CRC32_SIMD = False
Buffer = bytes | memoryview  # what a payload frame is written from (`append`)
_crc32: Callable[[Buffer, int], int] = _crc32_fold if CRC32_SIMD else zlib.crc32

__all__ = ["DIRECT_IO_FILE_SYSTEMS", "PAGE_CACHE_MB", "PayloadFile", "StoreCorrupt", "file_system"]

log = logging.getLogger(__name__)

# a payload frame in PAYLOADS_NAME: magic, payload length, crc32 of the payload, then the payload
_FRAME = struct.Struct("<4sII")
_MAGIC = b"PLRP"
# a frame that says whose row it is (`append(metas=)`, what the record store writes): magic, payload length, crc32 of
# the payload, the meta's length and crc32, then the meta (the row's fields as JSON), then the payload
_RFRAME = struct.Struct("<4sIIHI")
_FRAME_EXTRA = _RFRAME.size + 110  # a frame's header and a record's meta (ids, session, seq, state), about
_RMAGIC = b"PLRR"
_VOID = b"PLRV"  # a frame with a meta whose commit failed after it was written (`void`)
# what a row's `data` holds for a payload in the file: a tag byte JSON never starts with (1: a plain frame, 2: a frame
# with its meta), the frame's offset, the payload's length and crc32 (a frame that is valid but not this record's,
# e.g. in a replaced file, is refused too)
_REF = struct.Struct("<BQII")
_REF_TAG = 1
_REF_META_TAG = 2
_SCAN_WINDOW = 1 << 16  # bytes read at a time when looking for the next frame past damaged bytes (`scan`)

# MiB of the file's end kept in the OS's page cache by default (`RecordStore(page_cache_mb=)`, `drop_cached`): records
# read soon after they are written (a session's trajectory) are read from memory; older pages are dropped once on disk
PAGE_CACHE_MB = 256


# most bytes and buffers per write call: a batch's frames go out in vectored writes of up to _WRITE_MAX bytes, never
# joined into one buffer first (a copy of every byte). On this project's VMs one write of several MB costs up to 20x
# the CPU per byte of writes of 1 MB or less (docs/performance.md, "The payload file's writes").
_WRITE_MAX = 1 << 20
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> int:
    """Write all of `data` at `offset`; returns the offset after it. A direct write the kernel cuts short stops at a
    block boundary, so the rest stays aligned."""
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
    return offset


def _write_at(fd: int, parts: list[Buffer], offset: int, total: int = -1) -> None:
    """Write `parts` back to back at `offset`: vectored writes of at most `_WRITE_MAX` bytes (a single part larger
    than that alone), resumed after a short write. `total`: their size, where the caller knows it (then a batch of
    at most `_WRITE_MAX` bytes and `_IOV_MAX` parts is one call without counting)."""
    if 0 <= total <= _WRITE_MAX and len(parts) <= _IOV_MAX:
        n = os.pwritev(fd, parts, offset)
        if n < total:
            _pwrite_all(fd, memoryview(b"".join(parts))[n:], offset + n)
        return
    i = 0
    while i < len(parts):
        group = [parts[i]]
        size = len(parts[i])
        i += 1
        while i < len(parts) and len(group) < _IOV_MAX and size + len(parts[i]) <= _WRITE_MAX:
            group.append(parts[i])
            size += len(parts[i])
            i += 1
        n = os.pwritev(fd, group, offset)
        offset += n
        if n < size:  # a short write (rare: a signal, a full disk that then raises): the rest as one buffer
            offset = _pwrite_all(fd, memoryview(b"".join(group))[n:], offset)


def _write_or_cut(fd: int, offset: int, write: Callable[..., None], *args: Any) -> None:
    """`write(*args)`, an append at `offset`; where it fails, the file is cut back to `offset` (where that fails too,
    the bytes stay as garbage `PayloadFile.scan` steps over) and the error raised."""
    try:
        write(*args)
    except BaseException:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, offset)
        raise


# Direct writes (`PayloadFile(direct_io=)`): offsets, lengths and memory aligned to this (a multiple of any disk's
# logical block; a page, so an `mmap` buffer is aligned); a batch is copied into a staging buffer of _STAGE_BYTES
# (written whenever it fills) and its end padded with zeros to the next multiple.
_ALIGN = 4096
_STAGE_BYTES = 4 << 20
_ZEROS = bytes(_ALIGN)
# a batch smaller than this goes through the page cache even where direct writes are on: a direct write waits for
# the disk (~0.1 ms here), a small buffered one does not, and most of the CPU a direct write saves is per byte
DIRECT_MIN_BYTES = 256 << 10
# file systems on local block devices, where `direct_io=None` (auto) writes with O_DIRECT; elsewhere the page cache
# is used: tmpfs (the page cache is the file: nothing to bypass; older kernels refuse O_DIRECT there), network
# file systems (every direct write a round trip), FUSE, overlays
DIRECT_IO_FILE_SYSTEMS = frozenset({"ext4", "ext3", "ext2", "xfs", "btrfs", "f2fs"})


def file_system(path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the file system `path` is on (`ext4`, `tmpfs`, `nfs`, ...), from `mountinfo` (proc(5)'s format):
    the mount with the longest mount point above the path; None where that cannot be told (not Linux)."""
    target = os.path.realpath(path)
    best, kind = -1, None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                head, sep, tail = line.partition(" - ")
                fields = head.split()
                if not sep or len(fields) < 5 or not tail:
                    continue
                point = fields[4].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= best:  # a later mount on the same point hides the earlier
                    best, kind = len(point), tail.split()[0]
    except OSError:
        return None
    return kind


class StoreCorrupt(PolarError, RuntimeError):
    """A record's payload is missing from the payload file or damaged (torn by a crash or a power loss before it
    reached the disk, the file truncated, replaced or not copied with the database)."""


class PayloadFile:
    """The store's payload file: frames appended at its end under an exclusive `flock`, read by reference.

    One descriptor per store object, opened on first use (read-only where the store is only read: a store whose
    records are all inline has no payload file).

    `direct_io`: how appends reach the disk. False: through the OS's page cache (`_write_at`). True: a batch of
    `DIRECT_MIN_BYTES` or more with O_DIRECT, from an aligned staging buffer, starting on a 4 KiB boundary and padded
    with zeros to the next (the padding is never referenced), so its bytes are never copied into the page cache and
    the periodic sync has nothing left to write back; smaller batches still use the page cache. Where the file
    system refuses O_DIRECT the file falls back to the page cache (`direct` says which is in use). None (the
    default): True on a local block file system (`DIRECT_IO_FILE_SYSTEMS`), else False. Reads always go through the
    page cache. Why: on this project's VMs a write into fresh page-cache memory costs ~1-2 ms of CPU per MB, a direct
    write ~0.1 (docs/performance.md, "The payload file's direct writes")."""

    def __init__(self, path: Path, *, writable: bool, direct_io: bool | None = None):
        self.path = path
        self._writable = writable
        self._fd: int | None = None
        self._dropped = 0  # the file's pages before this offset were dropped from the OS's page cache (`drop_cached`)
        self._direct_io = direct_io
        self._dfd: int | None = None  # the O_DIRECT descriptor appends go through (`direct`)
        self._stage: mmap.mmap | None = None
        self.direct: bool | None = None  # whether large batches use O_DIRECT (None: not decided yet)

    def _open(self) -> int | None:
        if self._fd is None:
            flags = (os.O_RDWR | os.O_CREAT) if self._writable else os.O_RDONLY
            try:
                self._fd = os.open(self.path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
            except FileNotFoundError:
                if self._writable:
                    raise
                return None
        return self._fd

    def append(self, payloads: Sequence[Buffer | list[Buffer]], metas: Sequence[bytes] | None = None) -> list[bytes]:
        """Write `payloads` as frames at the file's end, back to back (`_write_at`, or a direct write: class
        docstring); return their row references. A payload given as a list of buffers is their bytes back to back
        (written as they are, never joined). `metas`: one per payload, the frames then carry them (what the record
        store's rows are rebuilt from: `scan`). The file's end is taken under an exclusive `flock` held to the end
        of the write, so no other writer, in this process or another, takes the same offset; a write that fails is
        cut off the file again (where that fails too, its bytes stay as garbage `scan` steps over)."""
        fd = self._open()
        assert fd is not None
        frames = []
        total = 0
        for k, data in enumerate(payloads):
            pieces = data if isinstance(data, list) else [data]
            crc = 0
            size = 0
            for piece in pieces:
                crc = _crc32(piece, crc)
                size += len(piece)
            meta = None if metas is None else metas[k]
            frames.append((pieces, size, crc, meta))
            total += size + (_FRAME.size if meta is None else _RFRAME.size + len(meta))
        dfd = self._direct_fd() if total >= DIRECT_MIN_BYTES else None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            offset = os.fstat(fd).st_size
            if dfd is not None:
                offset = -(-offset // _ALIGN) * _ALIGN  # a direct write starts on a boundary (after any writer's end)
            parts: list[Buffer] = []
            refs: list[bytes] = []
            at = offset
            for pieces, size, crc, meta in frames:
                if meta is None:
                    parts.append(_FRAME.pack(_MAGIC, size, crc))
                    refs.append(_REF.pack(_REF_TAG, at, size, crc))
                    at += _FRAME.size + size
                else:
                    parts += (_RFRAME.pack(_RMAGIC, size, crc, len(meta), _crc32(meta, 0)), meta)
                    refs.append(_REF.pack(_REF_META_TAG, at, size, crc))
                    at += _RFRAME.size + len(meta) + size
                parts += pieces
            _write_or_cut(fd, offset, self._write, fd, dfd, parts, offset, at - offset)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return refs

    def append_one(self, pieces: list[Buffer], meta: bytes) -> bytes:
        """`append([pieces], [meta])[0]` for a frame below `DIRECT_MIN_BYTES` (any other goes through `append`),
        without the loops over frames: one record committed alone (`RecordStore._write_one`)."""
        fd = self._fd if self._fd is not None else self._open()
        assert fd is not None
        crc = 0
        for piece in pieces:
            crc = _crc32(piece, crc)
        size = sum(map(len, pieces))
        total = _RFRAME.size + len(meta) + size
        if total >= DIRECT_MIN_BYTES:
            return self.append([pieces], [meta])[0]
        head = _RFRAME.pack(_RMAGIC, size, crc, len(meta), _crc32(meta, 0))
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            offset = os.fstat(fd).st_size
            _write_or_cut(fd, offset, _write_at, fd, [head, meta, *pieces], offset, total)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return _REF.pack(_REF_META_TAG, offset, size, crc)

    def _write(self, fd: int, dfd: int | None, parts: list[Buffer], offset: int, total: int = -1) -> None:
        if dfd is None:
            _write_at(fd, parts, offset, total)
            return
        try:
            self._write_direct(dfd, parts, offset)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # the file system took the O_DIRECT open but not the write: this batch, and every later one, buffered
            log.info("payload file %s: direct writes refused (%s); writing through the page cache", self.path, exc)
            self._stop_direct()
            _write_at(fd, parts, offset)

    def void(self, refs: Sequence[bytes]) -> None:
        """Take frames that `append` wrote with metas out of what `scan` finds (their commit failed after the write:
        a failed sync), by overwriting their magic, under the file's lock; rows never point to them."""
        fd = self._open()
        assert fd is not None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            for ref in refs:
                tag, offset, _, _ = _REF.unpack(ref)
                if tag == _REF_META_TAG:
                    os.pwrite(fd, _VOID, offset)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def size(self) -> int:
        """The file's size (0 while there is none)."""
        fd = self._open()
        return 0 if fd is None else os.fstat(fd).st_size

    def scan(self, start: int) -> Iterator[tuple[bytes, bytes]]:
        """Every intact frame with a meta from offset `start` to the file's end, in file order: (its meta, the row
        reference to its payload). Frames without a meta are passed over; so are bytes that are no frame (a direct
        write's zero padding; a write cut short by a crash, which may be followed by other writers' frames): from
        there the next frame is looked for, and only one whose checksums hold is taken."""
        fd = self._open()
        if fd is None:
            return
        end = os.fstat(fd).st_size
        pos = start
        while pos + _FRAME.size <= end:
            head = os.pread(fd, _RFRAME.size, pos)
            stop = -1
            if head[:4] == _RMAGIC and len(head) == _RFRAME.size:
                _, n, crc, m, mcrc = _RFRAME.unpack(head)
                stop = pos + _RFRAME.size + m + n
                # the meta first (at most 64 KiB): bytes that only look like a header are refused before the payload
                # they claim is read
                meta = os.pread(fd, m, pos + _RFRAME.size) if 0 < m and stop <= end else b""
                if meta and len(meta) == m and _crc32(meta, 0) == mcrc:
                    body = os.pread(fd, n, pos + _RFRAME.size + m)
                    if len(body) == n and _crc32(body, 0) == crc:
                        yield meta, _REF.pack(_REF_META_TAG, pos, n, crc)
                        pos = stop
                        continue
            elif head[:4] == _MAGIC:
                _, n, crc = _FRAME.unpack(head[: _FRAME.size])
                stop = pos + _FRAME.size + n
                if stop <= end and _crc32(os.pread(fd, n, pos + _FRAME.size), 0) == crc:
                    pos = stop
                    continue
            pos = self._next_magic(fd, pos + 1, end)

    @staticmethod
    def _next_magic(fd: int, pos: int, end: int) -> int:
        """The offset of the next bytes that may start a frame (`PLRP` or `PLRR`) at or after `pos`; `end` if none."""
        while pos < end:
            window = os.pread(fd, min(_SCAN_WINDOW, end - pos) + 3, pos)
            i = window.find(b"PLR")
            while i >= 0 and i + 3 < len(window) and window[i + 3] not in b"PR":
                i = window.find(b"PLR", i + 1)
            if i >= 0 and i + 3 < len(window):
                return pos + i
            pos += max(1, len(window) - 3)
        return end

    def direct_for(self, size: int, frames: int) -> bool:
        """Whether an append of `frames` payloads of `size` bytes in all is written directly, a write that waits for
        the disk (before the first large append decides whether direct writes work here: whether it may be). Each
        frame's header and meta are counted at about their size (`_FRAME_EXTRA`): a routing estimate."""
        total = size + frames * _FRAME_EXTRA
        return total >= DIRECT_MIN_BYTES and self.direct is not False and self._direct_io is not False

    def _direct_fd(self) -> int | None:
        """The O_DIRECT descriptor appends go through, opened on first use; None: appends use the page cache."""
        if self.direct is None:
            want = self._direct_io
            if want is None:
                want = hasattr(os, "O_DIRECT") and file_system(self.path) in DIRECT_IO_FILE_SYSTEMS
            self.direct = False
            if want and hasattr(os, "O_DIRECT"):
                try:
                    self._dfd = os.open(self.path, os.O_WRONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
                    self._stage = mmap.mmap(-1, _STAGE_BYTES)
                    self.direct = True
                except OSError as exc:  # a file system that refuses O_DIRECT at the open (EINVAL)
                    log.info(
                        "payload file %s: no direct writes here (%s); writing through the page cache", self.path, exc
                    )
                    self._stop_direct()
        return self._dfd

    def _write_direct(self, dfd: int, parts: list[Buffer], offset: int) -> None:
        """Write `parts` back to back at `offset` (aligned) through the staging buffer: whenever it fills it goes
        out whole, and the rest goes out padded with zeros to the next `_ALIGN` boundary."""
        assert self._stage is not None
        stage = memoryview(self._stage)
        pos = 0
        try:
            for part in parts:
                view = memoryview(part).cast("B")
                while len(view) > _STAGE_BYTES - pos:  # fill the buffer, write it whole, start again
                    k = _STAGE_BYTES - pos
                    stage[pos:] = view[:k]
                    view = view[k:]
                    offset = _pwrite_all(dfd, stage, offset)
                    pos = 0
                stage[pos : pos + len(view)] = view
                pos += len(view)
            if pos:
                end = -(-pos // _ALIGN) * _ALIGN
                stage[pos:end] = _ZEROS[: end - pos]
                _pwrite_all(dfd, stage[:end], offset)
        finally:
            stage.release()

    def _stop_direct(self) -> None:
        self.direct = False
        if self._dfd is not None:
            os.close(self._dfd)
            self._dfd = None
        self._stage = None  # unmapped once no view of it is left (a failed write's traceback may hold one)

    def sync(self) -> int:
        """Flush the file to the disk (every process's frames: the page cache is shared); return the file's size
        before the flush, so every byte before that offset is on disk."""
        fd = self._open()
        if fd is None:
            return 0
        size = os.fstat(fd).st_size
        os.fdatasync(fd) if hasattr(os, "fdatasync") else os.fsync(fd)
        return size

    def drop_cached(self, upto: int) -> None:
        """Let the OS drop the file's cached pages before offset `upto` (bytes `sync` has put on disk), the ones not
        dropped by an earlier call. Nothing is lost: a later read of a record there reads the disk. Why: on a VM that
        hands free memory back to its host, a page cache that keeps growing writes every frame into memory the host
        must fault in again, ~10x the CPU per byte of memory just freed (docs/performance.md, "The payload file's
        page cache"). Without `posix_fadvise` (not Linux) it does nothing."""
        fd = self._open()
        if fd is None or upto <= self._dropped or not hasattr(os, "posix_fadvise"):
            return
        os.posix_fadvise(fd, self._dropped, upto - self._dropped, os.POSIX_FADV_DONTNEED)
        self._dropped = upto

    def resolve(self, record_id: str, data: bytes) -> bytes:
        """The record's JSON: `data` itself when inline (every row of a store written before the payload file), else
        the frame `data` points to, checked; `StoreCorrupt` naming the record when it is missing or damaged."""
        if data[:1] == b"{":
            return bytes(data)
        if len(data) != _REF.size or data[0] not in (_REF_TAG, _REF_META_TAG):
            raise StoreCorrupt(f"record {record_id!r}: its row holds neither a record nor a payload reference")
        tag, offset, length, crc = _REF.unpack(data)
        where = f"record {record_id!r}: its payload ({length} bytes at offset {offset} of {self.path})"
        fd = self._open()
        if fd is None:
            raise StoreCorrupt(f"{where} is missing: there is no payload file")
        frame = _FRAME if tag == _REF_TAG else _RFRAME
        head = os.pread(fd, frame.size, offset)
        fields = frame.unpack(head) if len(head) == frame.size else ()
        if fields[:3] != ((_MAGIC if tag == _REF_TAG else _RMAGIC), length, crc):
            raise StoreCorrupt(f"{where} is missing or damaged: no matching frame header there")
        start = offset + frame.size + (0 if tag == _REF_TAG else fields[3])
        payload = os.pread(fd, length, start)
        if len(payload) != length:
            raise StoreCorrupt(f"{where} is cut short: the file ends {length - len(payload)} bytes early")
        if _crc32(payload, 0) != crc:
            raise StoreCorrupt(f"{where} is damaged: its checksum does not match")
        return payload

    def close(self) -> None:
        self._stop_direct()
        self.direct = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
