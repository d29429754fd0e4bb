# SPDX-License-Identifier: Apache-2.0
"""`TokenIds`: token ids as packed int32, a read-only `Sequence[int]` (re-exported by `nemo_polar.types`).

The proxy reads an engine's prompt ids straight from the answer's JSON into packed little-endian int32
(`_sse_scan.answer_logprobs`, docs/performance.md, "Prompt ids as packed int32") and writes them to the record as
they are, so no Python int is made per id. Everything else sees a sequence equal to the list of its ids; code that
needs list operations calls `id_list`. A leaf module: it imports nothing of ours.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator, Sequence
from typing import overload

__all__ = ["TokenIds", "id_list"]


class TokenIds(Sequence[int]):
    """Token ids held as packed little-endian int32 (each in [0, 2**31)), read-only: what the proxy carries from an
    engine's answer to the record's "b64:i32:" string without making a Python int per id (an 8k-token prompt: 8,000
    ints built, checked and packed again). A `Sequence[int]` that equals the list or tuple of its ids (both ways);
    records read back from the store hold plain lists."""

    __slots__ = ("packed",)

    def __init__(self, packed: bytes):
        if len(packed) % 4 or not packed[3::4].isascii():  # the top byte of every id under 0x80: in [0, 2**31)
            raise ValueError("not packed token ids (little-endian int32 in [0, 2**31))")
        self.packed = packed

    @classmethod
    def from_checked(cls, packed: bytes) -> TokenIds:
        """`TokenIds(packed)` without its check, for bytes whose every id the caller has checked already (the C
        readers of `_sse_scan`, which pack only ids in [0, 2**31)): the check copies a quarter of the bytes."""
        ids = cls.__new__(cls)
        ids.packed = packed
        return ids

    def __len__(self) -> int:
        return len(self.packed) >> 2

    def tolist(self) -> list[int]:
        if sys.byteorder == "little":
            ids: list[int] = memoryview(self.packed).cast("i").tolist()
            return ids
        return list(struct.unpack(f"<{len(self)}i", self.packed))

    @overload
    def __getitem__(self, k: int) -> int: ...
    @overload
    def __getitem__(self, k: slice) -> list[int]: ...
    def __getitem__(self, k: int | slice) -> int | list[int]:
        if isinstance(k, slice):
            return self.tolist()[k]
        n = len(self)
        i = k + n if k < 0 else k
        if not 0 <= i < n:
            raise IndexError("token id index out of range")
        return int.from_bytes(self.packed[4 * i : 4 * i + 4], "little")

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return self.packed == other.packed
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are not hashable

    def __repr__(self) -> str:
        return f"TokenIds({self.tolist()!r})"


def id_list(ids: list[int] | TokenIds) -> list[int]:
    """Token ids as a list: the list itself, or a `TokenIds`' ids (for code that needs list operations)."""
    return ids.tolist() if isinstance(ids, TokenIds) else ids
