# SPDX-License-Identifier: Apache-2.0
"""The C scanner (`engines/_sse_scan.c`) returns exactly what the regex it replaces returns.

`_sse_scan.lines(block)` must equal `vllm_stream._LINE.findall(block)`, and `_sse_scan.segments(block)` the segments
`_segments_py` builds from those rows, on any block: token chunks in every shape the pattern allows (escapes, non-ASCII, several tokens, the three kinds, `bytes`, `stop_reason`, finish reasons, the
trailing null keys), the same chunks mutated, truncated or garbled one byte at a time, CRLF, other SSE lines, and a
last line without its newline. The corpus is seeded: a failure names its seed and is reproducible.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import orjson
import pytest

from nemo_polar.proxy.engines import vllm_stream
from nemo_polar.proxy.engines.base import UpstreamError
from nemo_polar.proxy.engines.vllm_stream import _LINE, StreamAccumulator, _run_rows, _segments_py

try:
    from nemo_polar.proxy.engines import _sse_scan
except ImportError:
    _sse_scan = None  # type: ignore[assignment]

needs_c = pytest.mark.skipif(_sse_scan is None, reason="the C line scanner (_sse_scan) is not built")

TEXTS = ["", "w", 'say "hi"', "back\\slash", "tab\tnl\n", "café ☕", "😀", "\x01\x1f\x7f", "\\u", "/"]
U_ESCAPES = ['"\\u00e9"', '"\\ud83d"', '"\\ude00x"', '"a\\\\u"']  # as JSON: a pair split over two chunks too
NUMBERS = ["-0.0", "0", "-1", "-1.5", "-2.5e-05", "1E+5", "-3e2", "-0.03125", "12", "-9.75E-3"]
# bytes that steer the pattern: quotes, escapes, separators, digits, exponents, control and non-ASCII bytes
MUTATIONS = [
    b'"',
    b"\\",
    b",",
    b"}",
    b"]",
    b"[",
    b":",
    b"0",
    b"7",
    b"-",
    b".",
    b"e",
    b"\r",
    b"\x00",
    b"\t",
    b"\x1f",
    b"\xc3",
    b"\x7f",
    b" ",
]
OTHER_LINES = [
    b"data: [DONE]",
    b"data:[DONE]",
    b"data:",
    b"data: ",
    b"data:  {}",
    b": keep-alive",
    b"event: message",
    b"",
    b"\r",
    b"xdata: {}",
    b" data: {}",
    b'data: {"error":{"message":"boom"}}',
]


def _s(text: str) -> str:
    return orjson.dumps(text).decode()


def _entry(rng: random.Random) -> str:
    out = '{"token":' + _s(rng.choice(TEXTS)) + ',"logprob":' + rng.choice(NUMBERS)
    out += rng.choice(["", ',"bytes":null', ',"bytes":[]', ',"bytes":[116,49]'])
    return out + rng.choice(["", ',"top_logprobs":[]']) + "}"


def _head(rng: random.Random) -> str:
    """A token chunk's start, up to its delta's `{`: the id, created time and model, the same in every chunk of a
    stream."""
    out = '{"id":' + _s(rng.choice(["chatcmpl-1", 'a"b'])) + ',"object":"chat.completion.chunk","created":'
    out += str(rng.randrange(10**10)) + ',"model":' + _s(rng.choice(["m", "qwen/é"])) + ","
    return out + '"choices":[{"index":0,"delta":{'


def _chunk(rng: random.Random, head: str | None = None) -> str:
    """One token chunk in a shape the pattern accepts (vLLM's key order, each optional part present or not); `head`:
    its start (`_head`), else a random one."""
    out = (head or _head(rng)) + rng.choice(["", '"role":"assistant",'])
    text = _s(rng.choice(TEXTS)) if rng.random() < 0.8 else rng.choice(U_ESCAPES)
    out += _s(rng.choice(["content", "reasoning_content", "reasoning"])) + ":" + text + "}"
    n = rng.choice([0, 1, 1, 2, 8])
    logprobs = '{"content":[' + ",".join(_entry(rng) for _ in range(n)) + "]}"
    out += rng.choice(["", ',"logprobs":null', ',"logprobs":' + logprobs, ',"logprobs":' + logprobs])
    out += rng.choice(["", ',"finish_reason":null', ',"finish_reason":"stop"', ',"finish_reason":"tool_calls"'])
    out += rng.choice(["", ',"stop_reason":null', ',"stop_reason":151645', ',"stop_reason":"</s>"'])
    ids = ",".join(str(rng.randrange(200000)) for _ in range(n))
    out += rng.choice(["", ',"token_ids":[' + ids + "]", ',"token_ids":[' + ids + "]"]) + "}]"
    for key in ("usage", "prompt_token_ids", "system_fingerprint"):
        out += rng.choice(["", ',"' + key + '":null'])
    return out + "}"


def _mutate(line: bytes, rng: random.Random) -> bytes:
    k = rng.randrange(len(line) + 1)
    how = rng.randrange(4)
    if how == 0:
        return line[:k]  # truncated
    if how == 1:
        return line[:k] + rng.choice(MUTATIONS) + line[k + 1 :]  # one byte replaced
    if how == 2:
        return line[:k] + rng.choice(MUTATIONS) + line[k:]  # one byte inserted
    return line[:k] + line[k + 1 :]  # one byte dropped


def _block(seed: int, lines: int = 120, *, mutate: bool = True, stream: bool = False) -> bytes:
    """`lines` SSE lines; `stream`: the token chunks share one start (`_head`), as a stream's do."""
    rng = random.Random(seed)
    head = _head(rng) if stream else None
    out: list[bytes] = []
    for _ in range(lines):
        roll = rng.random() if mutate else 1.0
        if roll < 0.1:
            line = rng.choice(OTHER_LINES)
        else:
            line = rng.choice([b"data: ", b"data: ", b"data:"]) + _chunk(rng, head).encode()
            if roll < 0.45:
                line = _mutate(line, rng)
        out.append(line + rng.choice([b"\n", b"\n\n", b"\r\n", b"\r\n\r\n"]))
    block = b"".join(out)
    return block.rstrip(b"\r\n") if rng.random() < 0.5 else block  # half of them: the last line without newline


@needs_c
@pytest.mark.parametrize("seed", range(25))
def test_lines_equal_the_regex_on_a_random_corpus(seed: int) -> None:
    block = _block(seed)
    rows = _LINE.findall(block)
    assert sum(1 for r in rows if r[0]) > 20  # the corpus does exercise the token-chunk branch
    assert _sse_scan.lines(block) == rows
    for cut in random.Random(seed).sample(range(len(block)), 20):  # every prefix is a block too
        assert _sse_scan.lines(block[:cut]) == _LINE.findall(block[:cut]), (seed, cut)


def _same_segments(block: bytes) -> None:
    """`segments` equals `_segments_py`; a run's rows are where it says they are."""
    got, want = _sse_scan.segments(block), _segments_py(block)
    assert [type(x) for x in got] == [type(x) for x in want]
    for c, py in zip(got, want, strict=True):
        if isinstance(py, bytes):
            assert c == py
        else:
            assert c[1:] == py[1:]
            assert _run_rows(c, block) == py[0]


@needs_c
@pytest.mark.parametrize("seed", range(25))
def test_segments_equal_the_regex_ones_on_a_random_corpus(seed: int) -> None:
    block = _block(seed)
    _same_segments(block)
    clean = _block(seed, mutate=False)  # long runs, kinds changing within them
    _same_segments(clean)
    for cut in random.Random(seed).sample(range(len(block)), 10):
        _same_segments(block[:cut])


@needs_c
@pytest.mark.parametrize("seed", range(15))
def test_scans_equal_the_regex_on_a_stream_corpus(seed: int) -> None:
    """Chunks that share their start, as a stream's do (the C scan compares a chunk's start with the last one's),
    mutated and truncated too."""
    block = _block(seed, stream=True)
    assert _sse_scan.lines(block) == _LINE.findall(block)
    _same_segments(block)
    _same_segments(_block(seed, mutate=False, stream=True))
    for cut in random.Random(seed).sample(range(len(block)), 10):
        _same_segments(block[:cut])


@needs_c
def test_a_chunk_whose_start_differs_from_the_last_one_in_one_byte() -> None:
    """The second of three chunks has one byte of its start (and the bytes just after it) replaced, cut out or
    doubled: each block is judged as the pattern judges it."""
    rng = random.Random(7)
    head = _head(rng)
    first = ("data: " + _chunk(rng, head)).encode()
    second = _chunk(rng, head).encode()
    for k in range(len(head.encode()) + 4):
        for b in (b"x", b'"', b"0", b"{", b"\\"):
            for changed in (
                second[:k] + b + second[k + 1 :],
                second[:k] + second[k + 1 :],
                second[:k] + b + second[k:],
            ):
                block = first + b"\n" + b"data: " + changed + b"\n" + first + b"\n"
                assert _sse_scan.lines(block) == _LINE.findall(block), (k, b)
                _same_segments(block)


@needs_c
def test_lines_equal_the_regex_on_edge_blocks() -> None:
    chunk = b"data: " + _chunk(random.Random(0)).encode()
    blocks: list[bytes | bytearray] = [
        b"",
        b"\n",
        b"data",
        b"data:",
        b"data:\n",
        b"\ndata: x",
        b"data: x\r",
        chunk,
        chunk + b"\r",
        chunk + b"\r\r\n",
        chunk + b" \n",
        chunk + b"\n" + chunk,
        chunk.replace(b'"}', b'\\"}', 1),
        chunk.replace(b'"content', b'"reasoning', 1),
        bytearray(chunk + b"\n"),
        *(chunk.replace(b'"id":"', b'"id":"' + bytes([b]), 1) for b in (0, 9, 0x1F, 0x20, 0x7F, 0x80, 0xFF)),
    ]
    for block in blocks:
        assert _sse_scan.lines(block) == _LINE.findall(block), block
        _same_segments(bytes(block))
    with pytest.raises(TypeError):
        _sse_scan.lines("data: x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _sse_scan.segments("data: x")  # type: ignore[arg-type]


@needs_c
def test_lines_equal_the_regex_on_the_captured_vllm_stream() -> None:
    block = (Path(__file__).parents[1] / "data" / "vllm_stream" / "tiny_qwen3_040_tokens.sse").read_bytes()
    assert _sse_scan.lines(block) == _LINE.findall(block)
    _same_segments(block)


def _fold(block: bytes) -> object:
    acc = StreamAccumulator("m")
    try:
        events = acc.feed_block(block, None)
    except UpstreamError as exc:
        return ("error", str(exc))
    return acc.result(), events, acc.done, acc.fast_chunks


@needs_c
@pytest.mark.parametrize("seed", range(5))
def test_the_accumulator_folds_the_same_with_either_scanner(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    first = b'data: {"id":"r","object":"chat.completion.chunk","created":1,"model":"m","choices":[]}\n'
    block = first + b"".join(b"data: " + _chunk(rng).encode() + b"\n\n" for _ in range(60))
    via_c = _fold(block)
    monkeypatch.setattr(vllm_stream, "_segments", _segments_py)
    assert _fold(block) == via_c


def test_the_c_scanner_is_built_where_a_compiler_is() -> None:
    """A silent fallback to the regex would only show as CPU; where gcc and Python's headers are, it must be built."""
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]  # the compiler setuptools builds it with
    if not (shutil.which(cc) and headers.exists()):
        pytest.skip(f"no {cc} or no Python headers here: the regex scanner is the one used")
    assert _sse_scan is not None, f"{cc} is here but _sse_scan is not built: run `make setup` (pip install -e .)"
    assert vllm_stream.SCANNER == "c"


def test_without_the_extension_the_regex_scanner_is_used() -> None:
    """A build without a compiler: the import fails and `feed_block` reads with `_LINE.findall`."""
    probe = (
        "import sys; sys.modules['nemo_polar.proxy.engines._sse_scan'] = None\n"
        "from nemo_polar.proxy.engines import vllm_stream as v\n"
        "assert v.SCANNER == 'regex' and v._segments is v._segments_py, v.SCANNER\n"
        "acc = v.StreamAccumulator('m')\n"
        'acc.feed_block(b\'data: {"id":"r","choices":[]}\\ndata: [DONE]\\n\', None)\n'
        "assert acc.done and acc.rid == 'r'\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
