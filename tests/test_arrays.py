# SPDX-License-Identifier: Apache-2.0
"""The C token-id check and compact encoders (`nemo_polar/_arrays.c`) decide and write exactly what their Python
paths do: `ids_ok` as `engines.base._ids_ok_py` on good and bad ids, `encode_i32` / `encode_f64` the string of
`record_json._i32_py` / `record_json._f64_py` (struct + base64) and of `types.encode_array`'s numpy path, byte for byte, NaN
payloads and signed zeros included; on anything else they return None and the Python path decides. The lists are
seeded: a failure is reproducible.
"""

from __future__ import annotations

import base64
import math
import random
import re
import string
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nemo_polar import types
from nemo_polar.proxy import record_json
from nemo_polar.proxy.engines import base
from nemo_polar.proxy.engines.base import _ids_ok_py
from nemo_polar.proxy.record_json import _f64_py, _i32_py, record_bytes
from nemo_polar.types import CompletionRecord, decode_array, encode_array

try:
    from nemo_polar import _arrays
except ImportError:
    _arrays = None  # type: ignore[assignment]

needs_c = pytest.mark.skipif(_arrays is None, reason="the C array module (_arrays) is not built")

SIZES = [0, 1, 2, 3, 4, 5, 11, 12, 13, 8000]  # around base64's 3-byte groups and the C side's 48-byte chunks
# bit patterns struct must keep: signed zero, infinities, NaNs with sign and payload, subnormals, extremes
SPECIAL_FLOATS = [
    -0.0,
    0.0,
    math.inf,
    -math.inf,
    math.nan,
    -math.nan,
    struct.unpack("<d", struct.pack("<Q", 0x7FF0_0000_0000_0001))[0],  # a signalling NaN's payload
    struct.unpack("<d", struct.pack("<Q", 0xFFF8_DEAD_BEEF_0001))[0],
    5e-324,
    -2.2250738585072004e-308,
    1.7976931348623157e308,
    -1e-300,
]
BAD_IDS: list[Any] = [None, "7", 2.0, -1, 2**31, 2**32, 2**64, -(2**64), True, False, np.int64(3), [1], b"x"]


def ids(rng: random.Random, n: int, lo: int = 0) -> list[int]:
    picks = [0, 1, 2**31 - 1, lo, 255, 256, 65535, 65536]
    return [rng.choice(picks) if rng.random() < 0.2 else rng.randrange(lo, 2**31) for _ in range(n)]


def floats(rng: random.Random, n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        r = rng.random()
        out.append(rng.choice(SPECIAL_FLOATS) if r < 0.3 else -rng.expovariate(0.5) if r < 0.9 else rng.uniform(-1, 1))
    return out


def exactly(a: str, b: str) -> None:
    assert a == b, (len(a), len(b), next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None))


@needs_c
@pytest.mark.parametrize("n", SIZES)
def test_encoders_write_the_struct_strings(n: int) -> None:
    rng = random.Random(n)
    for lo in (0, -(2**31)):
        v = ids(rng, n, lo)
        exactly(_arrays.encode_i32(v) or "", _i32_py(v))
        exactly(_arrays.encode_i32(tuple(v)) or "", _i32_py(v))
        exactly(encode_array(v, "i32"), _i32_py(v))
    f = floats(rng, n)
    exactly(_arrays.encode_f64(f) or "", _f64_py(f))
    exactly(encode_array(f, "f64"), _f64_py(f))
    mixed = [x if i % 3 else int(x) for i, x in enumerate(f) if math.isfinite(x)]  # ints too, as float(int)
    exactly(_arrays.encode_f64(mixed) or "", _f64_py(mixed))
    raw = np.frombuffer(struct.pack(f"<{len(f)}d", *f), dtype="<u8")  # every bit, NaN payloads included
    decoded = np.asarray(decode_array(_arrays.encode_f64(f)), dtype="<f8").view("<u8")
    assert (decoded == raw).all()


@pytest.mark.parametrize("n", [0, 1, 13, 8000])
def test_the_numpy_path_of_encode_array_writes_the_struct_strings_too(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(types, "_FAST_ENCODE", {})
    rng = random.Random(n)
    v, f = ids(rng, n, -(2**31)), floats(rng, n)
    exactly(encode_array(v, "i32"), _i32_py(v))
    exactly(encode_array(f, "f64"), _f64_py(f))


@needs_c
def test_encoders_leave_everything_else_to_the_python_path() -> None:
    for bad in [[True], [1, False], [2**31], [-(2**31) - 1], [2**64], [np.int32(1)], [None], ["1"], [1.0]]:
        assert _arrays.encode_i32(bad) is None, bad
    for bad in [[True], [np.float64(1.0)], [None], ["1"], [10**400]]:
        assert _arrays.encode_f64(bad) is None, bad
    for other in [None, "123", b"123", range(3), np.arange(3), {1: 2}, iter([1])]:
        assert _arrays.encode_i32(other) is None and _arrays.encode_f64(other) is None, other
    # ... which gives what it gave before: bools encoded as 0/1 by struct, the same errors
    exactly(record_json._i32([True, 2]), _i32_py([1, 2]))
    exactly(encode_array(np.arange(3), "i32"), _i32_py([0, 1, 2]))
    with pytest.raises(struct.error):
        record_json._i32([2**31])
    with pytest.raises(ValueError, match="int32 range"):
        encode_array([2**31], "i32")
    with pytest.raises(struct.error):
        record_json._f64([10**400])


# -- base64: AVX2 (24 bytes a step, where the CPU has it) and the scalar loop (the tail, and every CPU) -------------

# 48 bytes whose base64 is the whole alphabet in order: every index, and each edge between A-Z, a-z, 0-9, + and /
ALPHABET_BYTES = base64.b64decode(string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/")


@pytest.fixture(params=["avx2", "scalar"])
def b64_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each base64 test once with the AVX2 step (skipped where the CPU has none) and once with it off."""
    if _arrays is None:
        pytest.skip("the C array module (_arrays) is not built")
    on = _arrays._set_simd(request.param == "avx2")
    if request.param == "avx2" and not on:
        pytest.skip("the CPU has no AVX2")
    try:
        yield request.param
    finally:
        _arrays._set_simd(True)  # the import's setting: on where the CPU has it


def test_the_packed_ids_base64_is_b64encode_for_every_length(b64_path: str) -> None:
    rng = random.Random(11)
    big = rng.randbytes(100_004)
    for n in [*range(0, 401, 4), 1020, 32_000, 100_004]:
        data = big[:n]
        exactly(_arrays.encode_i32_packed(data), "b64:i32:" + base64.b64encode(data).decode())
    # every index at every position of a 24-byte step, and the buffers a torn or zeroed record holds
    for data in [ALPHABET_BYTES * 9, ALPHABET_BYTES[4:] * 3, bytes(4096), b"\xff" * 4096, memoryview(big)[4:40_004]]:
        exactly(_arrays.encode_i32_packed(data), "b64:i32:" + base64.b64encode(data).decode())
    with pytest.raises(ValueError, match="whole number of int32s"):
        _arrays.encode_i32_packed(big[:402])


def test_the_list_encoders_base64_is_b64encode(b64_path: str) -> None:
    rng = random.Random(12)
    for n in [0, 1, 2, 5, 6, 7, 11, 12, 13, 47, 48, 49, 512, 1000, 8001]:
        v = ids(rng, n, -(2**31))
        exactly(_arrays.encode_i32(v) or "", "b64:i32:" + base64.b64encode(struct.pack(f"<{n}i", *v)).decode())
        f = floats(rng, n)
        exactly(_arrays.encode_f64(f) or "", "b64:f64:" + base64.b64encode(struct.pack(f"<{n}d", *f)).decode())
    v = list(struct.unpack("<108i", ALPHABET_BYTES * 9))
    exactly(_arrays.encode_i32(v) or "", "b64:i32:" + base64.b64encode(ALPHABET_BYTES * 9).decode())


@needs_c
def test_the_simd_switch_turns_avx2_off_and_back_on_only_where_the_cpu_has_it() -> None:
    has = _arrays._set_simd(True)
    try:
        assert _arrays._set_simd(False) is False
        assert _arrays._set_simd(True) is has
    finally:
        _arrays._set_simd(True)


@pytest.mark.parametrize("check", [_ids_ok_py, pytest.param(_arrays and _arrays.ids_ok, marks=needs_c)])
def test_the_id_check_takes_ints_in_the_int32_range_only(check: Any) -> None:
    rng = random.Random(7)
    for n in SIZES:
        good = ids(rng, n)
        assert check(good) and check(tuple(good))
        for bad in BAD_IDS if n else []:
            for at in {0, n // 2, n - 1}:
                v: list[Any] = list(good)
                v[at] = bad
                assert not check(v), (n, at, bad)
    assert check([]) and check([2**31 - 1])
    for other in [None, "12", b"12", range(3), np.arange(3), {1: 2}]:
        assert not check(other), other


@needs_c
def test_the_c_and_python_checks_agree_item_by_item() -> None:
    for item in [*BAD_IDS, 0, 1, 2**31 - 1, 2**31 - 2, -(2**31), 2**63 - 1, 2**63, 1.5, math.nan, object()]:
        assert _arrays.ids_ok([item]) is _ids_ok_py([item]), item
        assert _arrays.ids_ok([5, item, 5]) is _ids_ok_py([5, item, 5]), item


@needs_c
def test_record_bytes_are_the_same_with_and_without_the_c_encoders(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    gen = ids(rng, 512)
    rec = CompletionRecord(
        id="r0",
        session_id="s",
        seq=0,
        dialect="openai_chat",
        prompt_token_ids=ids(rng, 8000),
        generation_token_ids=gen,
        generation_log_probs=floats(rng, 512),
    )
    fast = record_bytes(rec)
    monkeypatch.setattr(record_json, "_i32", _i32_py)
    monkeypatch.setattr(record_json, "_f64", _f64_py)
    assert record_bytes(rec) == fast
    monkeypatch.setattr(types, "_FAST_ENCODE", {})
    assert rec.to_json(compact=True) == record_bytes(rec)


def test_a_bool_or_an_id_past_int32_is_an_engine_failure_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = [_ids_ok_py] + ([_arrays.ids_ok] if _arrays is not None else [])
    for check in checks:
        monkeypatch.setattr(base, "_ids_ok", check)
        base.check_token_data([0, 2**31 - 1], [1], [-0.5], None)
        for bad in [True, 2**31]:
            with pytest.raises(base.UpstreamError, match="prompt token ids that are not non-negative integers"):
                base.check_token_data([1, bad], [1], [-0.5], None)


# -- crc32 ----------------------------------------------------------------------------------------------------------

CRC_P = 0x104C11DB7  # zlib's polynomial, x^32 + x^26 + ... + 1


def _x_pow_mod_p(k: int) -> int:
    r = 1
    for _ in range(k):
        r <<= 1
        if r >> 32:
            r ^= CRC_P
    return r


def _reflect(v: int, bits: int) -> int:
    return int(format(v, f"0{bits}b")[::-1], 2)


def test_crc32_fold_constants_are_derived_from_the_polynomial() -> None:
    """The folding constants in _arrays.c are x^k mod P (reflected, shifted left by one) for the distances the
    comment names, and the Barrett pair is P and floor(x^64 / P), reflected: a wrong one is a wrong checksum only
    for some lengths, so they are checked at their source too."""
    src = (Path(types.__file__).parent / "_arrays.c").read_text()
    found = [int(h, 16) for h in re.findall(r"0x(0[0-9a-f]{9})LL", src)]
    k = {d: _reflect(_x_pow_mod_p(d), 32) << 1 for d in (4 * 128 + 32, 4 * 128 - 32, 128 + 32, 128 - 32, 64)}
    q, a = 0, 1 << 64  # floor(x^64 / P) by long division over GF(2)
    while a.bit_length() >= CRC_P.bit_length():
        shift = a.bit_length() - CRC_P.bit_length()
        q |= 1 << shift
        a ^= CRC_P << shift
    want = [k[480], k[544], k[96], k[160], k[64], _reflect(q, 33), _reflect(CRC_P, 33)]
    assert found == want


@needs_c
def test_crc32_is_zlibs_for_every_length_alignment_and_start_value() -> None:
    rng = random.Random(7)
    data = bytes(rng.getrandbits(8) for _ in range(70_000))
    lengths = [*range(0, 260), 1023, 1024, 1025, 4095, 4096, 65_535, 65_536, 69_990]
    for n in lengths:
        for off in (0, 1, 7):
            piece = data[off : off + n]
            start = rng.getrandbits(32)
            assert _arrays.crc32(piece) == zlib.crc32(piece), (n, off)
            assert _arrays.crc32(piece, start) == zlib.crc32(piece, start), (n, off, start)
    # any buffer, a value carried over from a first part, and the patterns a torn write leaves
    assert _arrays.crc32(memoryview(data)[5:9005]) == zlib.crc32(data[5:9005])
    assert _arrays.crc32(bytearray(data[:300])) == zlib.crc32(data[:300])
    assert _arrays.crc32(data[3000:], _arrays.crc32(data[:3000])) == zlib.crc32(data)
    for blank in (bytes(8192), b"\xff" * 8192, data[:4096] + bytes(4096)):
        assert _arrays.crc32(blank) == zlib.crc32(blank)
    with pytest.raises(TypeError):
        _arrays.crc32("text")  # type: ignore[arg-type]


@needs_c
def test_the_payload_file_checks_with_the_fast_crc32_where_the_cpu_folds() -> None:
    from nemo_polar.proxy import payloads

    assert payloads._crc32 is (_arrays.crc32 if _arrays.CRC32_SIMD else zlib.crc32)


def _json_values(rng: random.Random, depth: int = 0) -> Any:
    """A random value of JSON's types (as `orjson.loads` gives them), nested a few levels."""
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, 1, -1, 2**40, -(2**62), 7])
    if kind == 2:
        return rng.choice([0.0, -0.0, 1.0, 0.1, -2.5e300, 1e-310])
    if kind in (3, 4, 5):
        return rng.choice(["", "a", "é", "日本", "\U0001f600", "x" * 300, "1"])
    if kind in (6, 7):
        return [_json_values(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice("abcd"): _json_values(rng, depth + 1) for _ in range(rng.randrange(4))}


@needs_c
def test_same_json_is_true_exactly_when_orjson_writes_the_same_bytes() -> None:
    """`_arrays.same_json` (session deltas' list comparison) on random JSON values and copies of them with one leaf
    changed, against comparing their `orjson` bytes; and the cases where `==` is wrong for JSON."""
    import orjson

    rng = random.Random(7)
    for _ in range(3000):
        a = _json_values(rng)
        b = orjson.loads(orjson.dumps(a)) if rng.random() < 0.5 else _json_values(rng)
        assert _arrays.same_json(a, b) is (orjson.dumps(a) == orjson.dumps(b)), (a, b)
    for a, b in [(1, True), (1, 1.0), (0, False), (0.0, -0.0), ({"a": 1, "b": 2}, {"b": 2, "a": 1})]:
        assert a == b and not _arrays.same_json(a, b)
    assert not _arrays.same_json([1], (1,))  # another type: "not the same" (a missed cut, never a wrong one)
    deep: list[Any] = [[], []]
    for _ in range(300):
        deep = [[deep[0]], [deep[1]]]
    assert deep[0] == deep[1] and not _arrays.same_json(*deep)  # too deep to walk: "not the same"
    assert _arrays.same_json([{"x": [1, 2.5, "é", None]}], [{"x": [1, 2.5, "é", None]}])
