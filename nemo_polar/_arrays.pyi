# SPDX-License-Identifier: Apache-2.0
"""One-pass token-id checks and compact array encodings (_arrays.c); optional: its users fall back to `struct`."""

from typing_extensions import Buffer

def ids_ok(ids: object, /) -> bool:
    """`ids` is a list or tuple of exact ints (bools refused) in [0, 2**31), the stored int32 range."""

def encode_i32(values: object, /) -> str | None:
    """`"b64:i32:"` + base64 of the little-endian int32s; None unless a list or tuple of exact ints in int32 range."""

def encode_i32_packed(data: Buffer, /) -> str:
    """`"b64:i32:"` + base64 of `data`, which holds little-endian int32s already (ValueError if not a multiple of 4)."""

def encode_f64(values: object, /) -> str | None:
    """`"b64:f64:"` + base64 of the little-endian float64s; None unless a list or tuple of exact floats and ints."""

CRC32_SIMD: bool
"""crc32 folds with carry-less multiplication (x86-64 PCLMULQDQ and SSE4.1, checked at import)."""

def crc32(data: Buffer, value: int = 0, /) -> int:
    """zlib.crc32(data, value): the same value, faster on a large buffer where `CRC32_SIMD`."""

def same_json(a: object, b: object, /) -> bool:
    """`a` and `b` serialise to the same JSON: the same types all the way down (1, 1.0 and True differ), floats the
    same bits, dicts the same keys in the same order."""
