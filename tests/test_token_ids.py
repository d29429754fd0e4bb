# SPDX-License-Identifier: Apache-2.0
"""`TokenIds` (token ids as packed int32, what the proxy carries from an answer to its record) behaves as the list of
its ids wherever the proxy hands it on: a `Sequence[int]`, equal to lists and tuples both ways, encoded by the store
and `encode_array` to the very string a list gives, checked as token ids, written as a list in plain JSON."""

from __future__ import annotations

import random
import struct

import orjson
import pytest

from nemo_polar.proxy import record_json
from nemo_polar.proxy.engines.base import UpstreamError, check_token_data
from nemo_polar.types import CompletionRecord, TokenIds, encode_array, id_list


def packed(ids: list[int]) -> TokenIds:
    return TokenIds(struct.pack(f"<{len(ids)}i", *ids))


IDS = [0, 1, 151644, 2**31 - 1, 255, 256, 65535, 65536, 7]


def test_a_sequence_equal_to_its_list() -> None:
    t = packed(IDS)
    assert len(t) == len(IDS)
    assert list(t) == t.tolist() == IDS
    assert [t[i] for i in range(len(IDS))] == IDS
    assert [t[-i] for i in range(1, len(IDS) + 1)] == [IDS[-i] for i in range(1, len(IDS) + 1)]
    for sl in (slice(None), slice(2, 5), slice(None, None, -2), slice(-3, None), slice(5, 2)):
        assert t[sl] == IDS[sl]
    for bad in (len(IDS), -len(IDS) - 1):
        with pytest.raises(IndexError):
            t[bad]
    assert t == IDS and IDS == t and t == tuple(IDS) and tuple(IDS) == t and t == packed(IDS)
    assert t != IDS[:-1] and IDS[:-1] != t and t != [*IDS, 1] and t != [*IDS[:-1], 8] and t != "x"
    assert t.index(2**31 - 1) == 3 and 151644 in t and t.count(7) == 1
    assert id_list(t) == IDS and type(id_list(t)) is list and id_list(IDS) is IDS
    assert repr(t) == f"TokenIds({IDS!r})"
    assert not packed([]) and packed([]) == []
    with pytest.raises(TypeError):
        hash(t)


@pytest.mark.parametrize("data", [b"\x00\x00\x00\x80", b"\xff\xff\xff\xff", b"\x01\x00\x00"])
def test_only_token_ids(data: bytes) -> None:
    with pytest.raises(ValueError):
        TokenIds(data)


def test_from_checked_is_the_checked_one_without_the_check() -> None:
    """What the C readers build from ids they checked themselves: equal to `TokenIds` of the same bytes, and it
    takes the bytes as they are (no check: the caller's word)."""
    data = packed(IDS).packed
    t = TokenIds.from_checked(data)
    assert type(t) is TokenIds and t == TokenIds(data) == IDS and t.packed is data
    assert len(TokenIds.from_checked(b"\xff\xff\xff\xff")) == 1  # unchecked


def test_encoded_and_checked_as_the_list() -> None:
    rng = random.Random(3)
    for n in (0, 1, 2, 3, 4, 5, 100, 8000):
        ids = [rng.randrange(0, 2**31) for _ in range(n)]
        t = packed(ids)
        want = record_json._i32_py(ids)
        assert record_json._i32(t) == record_json._i32_py(t) == record_json._i32(ids) == want
        assert encode_array(t, "i32") == encode_array(ids, "i32") == want
        rec = CompletionRecord(id="r", session_id="s", seq=0, dialect="openai_chat", arrived_at=0.0)
        rec.prompt_token_ids = t
        as_list = CompletionRecord(id="r", session_id="s", seq=0, dialect="openai_chat", arrived_at=0.0)
        as_list.prompt_token_ids = ids
        assert rec.to_json() == as_list.to_json() and rec.to_json(compact=False) == as_list.to_json(compact=False)
        assert orjson.loads(record_json.record_bytes(rec)) == orjson.loads(record_json.record_bytes(as_list))
        back = CompletionRecord.from_json(record_json.record_bytes(rec))
        assert type(back.prompt_token_ids) is list and back.prompt_token_ids == ids
        rec.validate()
        check_token_data(t, [1], [-0.5], None)
    with pytest.raises(UpstreamError, match="prompt token ids"):
        check_token_data([-1], [1], [-0.5], None)
