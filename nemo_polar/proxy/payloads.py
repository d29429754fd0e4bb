# SPDX-License-Identifier: Apache-2.0
"""The record store's payload file (`records.sqlite-payloads`): large records' JSON, appended as checksummed frames.

A frame is a 12-byte header (magic `PLRP`, the payload's length, its crc32) and the payload. The store's row for the
record keeps a 17-byte reference to it (a tag byte JSON never starts with, the frame's offset, the payload's length
and crc32), so a read checks the frame against what the row says: a torn, truncated, overwritten or missing payload
is `StoreCorrupt` naming the record, never other bytes. Appends are made by whoever holds SQLite's write lock, so
writers in several processes never take the same offset. Why the payloads live here and not in the rows, and how
the file keeps the store's durability: `proxy/store.py`'s docstring and docs/contracts.md, "Storage".
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

from nemo_polar.errors import PolarError

try:  # zlib.crc32's value, ~4x faster on a large payload, where the CPU can fold it (nemo_polar/_arrays.c)
    from nemo_polar._arrays import CRC32_SIMD
    from nemo_polar._arrays import crc32 as _crc32_fold
except ImportError:  # built without a compiler: zlib's
    CRC32_SIMD = False
Buffer = bytes | memoryview  # what a payload frame is written from (`append`)
_crc32: Callable[[Buffer, int], int] = _crc32_fold if CRC32_SIMD else zlib.crc32

__all__ = ["PAGE_CACHE_MB", "PayloadFile", "StoreCorrupt"]

# a payload frame in PAYLOADS_NAME: magic, payload length, crc32 of the payload, then the payload
_FRAME = struct.Struct("<4sII")
_MAGIC = b"PLRP"
# what a row's `data` holds for a payload in the file: a tag byte JSON never starts with, the frame's offset, the
# payload's length and crc32 (a frame that is valid but not this record's, e.g. in a replaced file, is refused too)
_REF = struct.Struct("<BQII")
_REF_TAG = 1

# MiB of the file's end kept in the OS's page cache by default (`RecordStore(page_cache_mb=)`, `drop_cached`): records
# read soon after they are written (a session's trajectory) are read from memory; older pages are dropped once on disk
PAGE_CACHE_MB = 256


# most bytes and buffers per write call: a batch's frames go out in vectored writes of up to _WRITE_MAX bytes, never
# joined into one buffer first (a copy of every byte). On this project's VMs one write of several MB costs up to 20x
# the CPU per byte of writes of 1 MB or less (docs/performance.md, "The payload file's writes").
_WRITE_MAX = 1 << 20
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


def _write_at(fd: int, parts: list[Buffer], offset: int) -> None:
    """Write `parts` back to back at `offset`: vectored writes of at most `_WRITE_MAX` bytes (a single part larger
    than that alone), resumed after a short write."""
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
        if n < size:  # a short write (rare: a signal, a full disk that then raises): the rest one buffer at a time
            rest = memoryview(b"".join(group))[n:]
            while rest:
                k = os.pwrite(fd, rest, offset)
                rest, offset = rest[k:], offset + k


class StoreCorrupt(PolarError, RuntimeError):
    """A record's payload is missing from the payload file or damaged (torn by a crash or a power loss before it
    reached the disk, the file truncated, replaced or not copied with the database)."""


class PayloadFile:
    """The store's payload file: frames appended at its end by whoever holds SQLite's write lock, read by reference.

    One descriptor per store object, opened on first use (read-only where the store is only read: a store whose
    records are all inline has no payload file)."""

    def __init__(self, path: Path, *, writable: bool):
        self.path = path
        self._writable = writable
        self._fd: int | None = None
        self._dropped = 0  # the file's pages before this offset were dropped from the OS's page cache (`drop_cached`)

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

    def append(self, payloads: Sequence[Buffer | list[Buffer]]) -> list[bytes]:
        """Write `payloads` as frames at the file's end, back to back (`_write_at`); return their row references. A
        payload given as a list of buffers is their bytes back to back (written as they are, never joined). The
        caller holds SQLite's write lock (`BEGIN IMMEDIATE`), so no other writer, in this process or another, takes
        the same end; bytes of a writer that failed or died before its commit stay as garbage no row points to."""
        fd = self._open()
        assert fd is not None
        offset = os.fstat(fd).st_size
        parts: list[Buffer] = []
        refs: list[bytes] = []
        at = offset
        for data in payloads:
            pieces = data if isinstance(data, list) else [data]
            crc = 0
            size = 0
            for piece in pieces:
                crc = _crc32(piece, crc)
                size += len(piece)
            parts.append(_FRAME.pack(_MAGIC, size, crc))
            parts += pieces
            refs.append(_REF.pack(_REF_TAG, at, size, crc))
            at += _FRAME.size + size
        _write_at(fd, parts, offset)
        return refs

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
        if len(data) != _REF.size or data[0] != _REF_TAG:
            raise StoreCorrupt(f"record {record_id!r}: its row holds neither a record nor a payload reference")
        _, offset, length, crc = _REF.unpack(data)
        where = f"record {record_id!r}: its payload ({length} bytes at offset {offset} of {self.path})"
        fd = self._open()
        if fd is None:
            raise StoreCorrupt(f"{where} is missing: there is no payload file")
        head = os.pread(fd, _FRAME.size, offset)
        if len(head) < _FRAME.size or _FRAME.unpack(head) != (_MAGIC, length, crc):
            raise StoreCorrupt(f"{where} is missing or damaged: no matching frame header there")
        payload = os.pread(fd, length, offset + _FRAME.size)
        if len(payload) != length:
            raise StoreCorrupt(f"{where} is cut short: the file ends {length - len(payload)} bytes early")
        if _crc32(payload, 0) != crc:
            raise StoreCorrupt(f"{where} is damaged: its checksum does not match")
        return payload

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
