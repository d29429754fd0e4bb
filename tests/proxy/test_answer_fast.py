# SPDX-License-Identifier: Apache-2.0
"""A non-streamed vLLM answer read with its logprob entries cut to bare numbers and its prompt ids packed
(`vllm.fast_answer`, C: `_sse_scan.answer_logprobs`; a stream's first chunk: `vllm_stream._packed_ids_chunk`) gives
exactly what the full `orjson` parse gives.

Three readers of the same bytes: `VLLMEngine.read_chat` (the fast path where it applies), the same with the C cut
switched off (what a build without a compiler runs), and `parse_chat` over `orjson.loads` of the whole answer (the
reference). On answers in vLLM's shapes (escapes and non-ASCII in tokens, `bytes` lists, tool calls, reasoning,
empty content, no logprobs, whitespace) they must give equal `ChatResult`s with bit-identical logprobs, and the fast
path must be the one taken where it should; on the same answers mutated, truncated or garbled one byte at a time
they must agree on the outcome: the same result, or the same 502. The corpus is seeded: a failure names its case.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path
from typing import Any

import orjson
import pytest

from nemo_polar.proxy.engines import vllm, vllm_stream
from nemo_polar.proxy.engines.base import Generation, UpstreamError, check_alignment, json_object
from nemo_polar.proxy.engines.vllm import VLLMEngine, fast_answer
from nemo_polar.proxy.engines.vllm_stream import StreamAccumulator
from nemo_polar.types import TokenIds

try:
    from nemo_polar.proxy.engines import _sse_scan
except ImportError:
    _sse_scan = None  # type: ignore[assignment]

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm_stream"
needs_c = pytest.mark.skipif(vllm.ANSWER_READER != "c", reason="the C answer reader (_sse_scan) is not built")

TOKENS = ["t1", " the", "café", "☕", "😀", 'say "hi"', "back\\slash", "tab\t", "nl\n", "bytes:\\xe2\\x80", "/", ""]
FLOATS = [
    -0.0,
    0.0,
    -1.0,
    -1e-05,
    -2.5e-05,
    -9.5367431640625e-07,
    -5e-324,
    -2.2250738585072014e-308,
    -1e300,
    -0.1,
    -0.30000000000000004,
    -123456.789,
    -3.4028234663852886e38,
]
NUMBER_TEXTS = [
    "-0",
    "-0.0",
    "0",
    "-1",
    "-1E+5",
    "-3e2",
    "-1e-400",
    "-2.50000000000000000001",
    "-1.7976931348623157e+308",
    "-1.7976931348623159e308",
]
MUTATIONS = [b'"', b"\\", b",", b"}", b"]", b"[", b":", b"0", b"-", b".", b"e", b"\x00", b" ", b"\xc3", b"\xed", b"u"]


def entry(rng: random.Random, token: str, logprob: float) -> dict[str, Any]:
    e: dict[str, Any] = {"token": token, "logprob": logprob}
    shape = rng.randrange(4)
    if shape >= 1:
        e["bytes"] = None if shape == 1 else list(token.encode())
    if shape != 3 or rng.random() < 0.5:
        e["top_logprobs"] = []
    return e


def answer(seed: int, n: int = 0, spaced: bool = False) -> bytes:
    """An answer in vLLM's key order, written as its server writes it (compact, non-ASCII as itself), or `spaced`
    as another writer might (whitespace, maybe `\\u` escapes: not what the fast path reads)."""
    rng = random.Random(seed)
    n = n or rng.randrange(1, 40)
    gen = [rng.randrange(0, 150_000) for _ in range(n)]
    lps = [rng.choice(FLOATS) if rng.random() < 0.3 else -rng.expovariate(2.0) for _ in range(n)]
    message: dict[str, Any] = {"role": "assistant", "content": rng.choice(["", 'hi ☕ "x"\n', None]), "refusal": None}
    if rng.random() < 0.3:
        message["reasoning_content"] = "think 😀"
    message["tool_calls"] = (
        [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1]}'}}]
        if rng.random() < 0.3
        else []
    )
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": {"content": [entry(rng, rng.choice(TOKENS), lp) for lp in lps]},
        "finish_reason": "stop",
        "stop_reason": None,
        "token_ids": gen,
    }
    prompt = [rng.randrange(0, 150_000) for _ in range(rng.randrange(1, 60))]
    out: dict[str, Any] = {
        "id": f"chatcmpl-{seed}",
        "object": "chat.completion",
        "created": 1796151494,
        "model": "m",
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n, "completion_tokens": n},
        "prompt_logprobs": None,
        "prompt_token_ids": prompt,
        "kv_transfer_params": None,
    }
    if rng.random() < 0.5:  # the prompt ids anywhere at the top level, or in the choice
        out["prompt_token_ids"] = None if rng.random() < 0.5 else prompt
        choice["prompt_token_ids"] = prompt
        out = {"prompt_token_ids": out.pop("prompt_token_ids"), **out}
    if rng.random() < 0.15:
        out["choices"].append({**choice, "index": 1})
    if spaced:
        return json.dumps(out, ensure_ascii=rng.random() < 0.5).encode()
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()


def outcome(read: Any) -> Any:
    """A reader's result (its logprobs as bit patterns) or its error."""
    try:
        res = read()
    except UpstreamError as exc:
        return ("error", exc.status, exc.kind, exc.message)
    lps = res.generation_log_probs
    return res, [struct.pack("<d", x) if type(x) is float else x for x in lps], [type(x) for x in lps]


def three(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any]:
    """The fast reader's, the fallback's and the full parse's outcomes for one answer."""
    fast = outcome(lambda: VLLMEngine.read_chat(raw, "m", Generation()))
    with monkeypatch.context() as m:
        m.setattr(vllm, "_answer_logprobs", None)
        fallback = outcome(lambda: VLLMEngine.read_chat(raw, "m", Generation()))
    full = outcome(lambda: VLLMEngine.parse_chat(json_object(raw, None), "m", Generation()))
    return fast, fallback, full


@needs_c
def test_vllm_answers_take_the_fast_path_and_match(monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in range(300):
        raw = answer(seed, spaced=seed % 10 == 0)
        fast, fallback, full = three(raw, monkeypatch)
        assert fast == full == fallback, seed
        assert fast[0].generation_log_probs, seed
        assert (fast_answer(raw) is not None) == (seed % 10 != 0), seed
        if seed % 10 and orjson.loads(raw)["prompt_token_ids"]:  # top-level ids, as vLLM sends them: packed
            assert type(fast[0].prompt_token_ids) is TokenIds, seed


@needs_c
def test_logprob_numbers_as_orjson_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every spelling of a number, the extreme ones too: the same float (or int, or error) as the full parse."""
    rng = random.Random(7)
    texts = (
        NUMBER_TEXTS
        + [repr(x) for x in FLOATS]
        + [repr(-rng.random() * 10.0 ** rng.randrange(-30, 5)) for _ in range(300)]
    )
    texts += [f"-{rng.randrange(1, 10**17)}e-{rng.randrange(0, 330)}" for _ in range(200)]
    for k in range(0, len(texts), 40):
        nums = texts[k : k + 40]
        raw = answer(k, n=len(nums))
        data = orjson.loads(raw)
        for e, num in zip(data["choices"][0]["logprobs"]["content"], nums, strict=True):
            e["logprob"] = f"@{num}@"
        raw = orjson.dumps(data).replace(b'"@', b"").replace(b'@"', b"")
        fast, fallback, full = three(raw, monkeypatch)
        assert fast == full == fallback, nums


def mutated(rng: random.Random, raw: bytes, at: int, noise: list[bytes]) -> bytes:
    """`raw` with the byte at `at` replaced by one of `noise`, or one of them inserted there, or that byte removed, or
    everything from `at` on cut off."""
    op = rng.randrange(4)
    if op == 0:
        return raw[:at] + rng.choice(noise) + raw[at + 1 :]
    if op == 1:
        return raw[:at] + rng.choice(noise) + raw[at:]
    return raw[:at] + raw[at + 1 :] if op == 2 else raw[:at]


@needs_c
def test_mutated_answers_agree_on_the_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """One byte replaced, inserted or removed, or the answer cut short: the same result or the same 502."""
    rng = random.Random(11)
    for seed in range(40):
        raw = answer(1000 + seed, n=4)
        cut = raw.index(b'"logprobs":{')
        for _ in range(40):
            # mostly in and around the logprob entries, where the fast path reads byte by byte
            at = rng.randrange(cut, min(len(raw), cut + 600)) if rng.random() < 0.8 else rng.randrange(len(raw))
            bad = mutated(rng, raw, at, MUTATIONS)
            fast, fallback, full = three(bad, monkeypatch)
            assert fast == full == fallback, (seed, bad)


SHAPES_NOT_TAKEN = [
    (b'"top_logprobs":[]}', b'"top_logprobs":[{"token":"x","logprob":-1.0,"bytes":null}]}'),  # asked for top
    (b'"logprob":', b'"logprob" :'),  # whitespace inside an entry
    (b'{"token":', b'{"extra":1,"token":'),  # another key
    (b'"token":"t1"', b'"token":"\\ud83d\\ude00"'),  # a surrogate pair escaped: left to orjson
    (b'"token":"t1"', b'"token":"\\ud83d"'),  # a lone surrogate: orjson's error
    (b'"token":"t1"', b'"token":"\xed\xa0\x80"'),  # a surrogate in UTF-8
    (b'"token":"t1"', b'"token":"\xff"'),  # not UTF-8
    (b'"token":"t1"', b'"token":"\\x"'),  # not an escape
    (b'"bytes":null', b'"bytes":[1,,2]'),
    (b'"bytes":null', b'"bytes":[01]'),
    (b'"bytes":null', b'"bytes":[1234567890123456789012]'),
    (b'"logprob":-0.5', b'"logprob":NaN'),
    (b'"logprob":-0.5', b'"logprob":"-0.5"'),
    (b'"logprob":-0.5', b'"logprob":-.5'),
    (b'"logprobs":{"content"', b'"logprobs":{"cont\\u0065nt"'),  # an escaped key
    (b'"choices":', b'"choices":[],"choices":'),  # a repeated key
    (b'"logprobs":{"content":[', b'"logprobs":{"content":[],"content":['),
    (b'"logprobs":{"content":[{', b'"logprobs":null,"logprobs":{"content":[{'),
    (b'"logprobs":{"content":[{"token":"t1","logprob":-0.5,"bytes":null,"top_logprobs":[]}]}', b'"logprobs":null'),
    (b'"logprobs":{"content":[{"token":"t1","logprob":-0.5,"bytes":null,"top_logprobs":[]}]}', b'"logprobs":{}'),
]


@needs_c
@pytest.mark.parametrize(("old", "new"), SHAPES_NOT_TAKEN)
def test_other_shapes_take_the_full_parse(old: bytes, new: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    base = {
        "id": "x",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "logprobs": {"content": [{"token": "t1", "logprob": -0.5, "bytes": None, "top_logprobs": []}]},
                "finish_reason": "stop",
                "token_ids": [7],
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1},
        "prompt_token_ids": [1, 2],
    }
    raw = orjson.dumps(base)
    assert fast_answer(raw) is not None
    assert old in raw
    bad = raw.replace(old, new, 1)
    cut = fast_answer(bad)
    assert cut is None or cut[1] is None  # the entries are parsed as dicts (the prompt ids may still be packed)
    fast, fallback, full = three(bad, monkeypatch)
    assert fast == full == fallback


def test_without_the_c_reader_the_full_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm, "_answer_logprobs", None)
    raw = answer(3)
    assert fast_answer(raw) is None
    res = VLLMEngine.read_chat(raw, "m", Generation())
    assert res == VLLMEngine.parse_chat(orjson.loads(raw), "m", Generation())
    with pytest.raises(UpstreamError, match="invalid JSON") as err:
        VLLMEngine.read_chat(raw[:-1], "m", Generation())
    assert err.value.status == 502


PROMPT_IDS = [
    (b"[2147483647,0,10]", True),  # the bounds of int32 token ids
    (b"[-1,2]", False),
    (b"[2147483648]", False),
    (b"[99999999999999999999999]", False),
    (b"[01]", False),
    (b"[1.0]", False),
    (b"[1e3]", False),
    (b"[1, 2]", False),
    (b"[true]", False),
    (b"[1,]", False),
    (b"[[1]]", False),
    (b"[]", False),
    (b"null", False),
    (b'[1],"prompt_token_ids":[2]', False),  # a repeated key: the last one counts for orjson
]


@needs_c
@pytest.mark.parametrize(("ids", "packed"), PROMPT_IDS)
def test_prompt_ids_packed_or_parsed_alike(ids: bytes, packed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ids that are token ids written as JSON writes ints are packed; every other value gets the full parse,
    whose result or 502 (`check_token_data`'s, or the alignment check's) is the same."""
    raw = orjson.dumps(
        {
            "id": "x",
            "choices": [
                {
                    "index": 0,
                    "message": {"content": "hi"},
                    "logprobs": {"content": [{"token": "t", "logprob": -0.5}]},
                    "finish_reason": "stop",
                    "token_ids": [7],
                }
            ],
            "usage": {"completion_tokens": 1},
            "prompt_token_ids": "@",
        }
    ).replace(b'"@"', ids)
    fast, fallback, full = three(raw, monkeypatch)
    assert fast == full == fallback
    cut = fast_answer(raw)
    assert (cut is not None and cut[2] is not None) == packed
    if packed:
        assert type(fast[0].prompt_token_ids) is TokenIds


@needs_c
def test_prompt_ids_of_every_length_pack_as_json_reads_them() -> None:
    """Ids of 1 to 10 digits (1-7: read 8 bytes at a time, the rest a byte at a time), alone, mixed, and last in the
    answer (fewer than 8 bytes after them), pack to the ids the full parse reads."""
    rng = random.Random(11)
    lists = [[0], [7], [0, 0, 1]]
    for n in range(1, 11):
        low, high = (10 ** (n - 1) if n > 1 else 0), min(10**n, 2**31)
        lists.append([rng.randrange(low, high) for _ in range(64)])
    lists.append([rng.choice([0, 9, 10, 99_999, 151_643, 9_999_999, 10_000_000, 2**31 - 1]) for _ in range(500)])
    lists.append([int(10 ** rng.uniform(0, 9.33)) for _ in range(2000)])
    for ids in lists:
        answer = {"id": "x", "choices": [{"index": 0, "message": {"content": "hi"}}], "prompt_token_ids": ids}
        for raw in (orjson.dumps(answer), orjson.dumps({**answer, "usage": {"prompt_tokens": len(ids)}})):
            cut = fast_answer(raw)
            assert cut is not None and cut[2] is not None, ids[:5]
            assert list(cut[2]) == orjson.loads(raw)["prompt_token_ids"]
            # a bytes object ends in a NUL, which the C loop reads up to unchecked; any other buffer is copied first
            assert _sse_scan.answer_logprobs(bytearray(raw), True) == _sse_scan.answer_logprobs(raw, True)
    for bad in (b"01", b"00", b"012345678", b"2147483648", b"99999999999", b"12345678901234567890123"):
        raw = b'{"id":"x","choices":[],"prompt_token_ids":[1,' + bad + b',3],"usage":null}'  # JSON or int32 refuse
        cut = fast_answer(raw)
        assert cut is None or cut[2] is None, bad
        assert _sse_scan.answer_logprobs(bytearray(raw), True) == _sse_scan.answer_logprobs(raw, True), bad
    for cut_at in (b"[1,23", b"[1,23,", b"[1,2", b"[0"):  # the answer ends inside the ids
        raw = b'{"id":"x","choices":[],"prompt_token_ids":' + cut_at
        assert _sse_scan.answer_logprobs(raw, True) is None is _sse_scan.answer_logprobs(bytearray(raw), True)


@needs_c
def test_mutated_prompt_ids_agree_on_the_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt ids (packed by the C walk) with a byte replaced, inserted or removed (a digit, a sign, a dot, an
    exponent, a byte outside ASCII, the array's end) or the answer cut inside them: the same result or the same
    502 from the fast reader, the fallback and the full parse."""
    rng = random.Random(23)
    noise = [*MUTATIONS, b"9", b"1", b"/", b":", b"\x80", b"\xff", b"+", b"E"]
    for seed in range(30):
        ids = [rng.choice([0, 7, 42, 151_643, 9_999_999, 10_000_000, 2**31 - 1]) for _ in range(rng.randrange(1, 40))]
        raw = orjson.dumps({**orjson.loads(answer(2000 + seed, n=2)), "prompt_token_ids": ids})
        start = raw.index(b'"prompt_token_ids":[') + len(b'"prompt_token_ids":[')
        stop = raw.index(b"]", start)
        for _ in range(30):
            bad = mutated(rng, raw, rng.randrange(start, stop + 1), noise)
            fast, fallback, full = three(bad, monkeypatch)
            assert fast == full == fallback, (seed, bad)


def stream_outcome(block: bytes, pack: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(vllm_stream, "PACK_PROMPT_IDS", pack)

        def read() -> Any:
            acc = StreamAccumulator("m")
            acc.feed_block(block, None)
            res = acc.result()
            check_alignment(res, acc.usage, None)
            return res

        return outcome(read)


@needs_c
@pytest.mark.parametrize("first_id", [b"151644", b"0", b"2147483647", b"-1", b"2147483648", b"1.5", b"01"])
def test_stream_first_chunk_prompt_ids(first_id: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """A captured vLLM stream, its first prompt id replaced: packed or not, the same result or the same 502."""
    block = (DATA / "tiny_qwen3_040_tokens.sse").read_bytes()
    head = b'"prompt_token_ids":[151644,'
    assert head in block
    block = block.replace(head, b'"prompt_token_ids":[' + first_id + b",", 1)
    packed, plain = stream_outcome(block, True, monkeypatch), stream_outcome(block, False, monkeypatch)
    assert packed == plain
    if first_id in (b"151644", b"0", b"2147483647"):
        assert type(packed[0].prompt_token_ids) is TokenIds
        assert len(packed[0].prompt_token_ids) > 100
