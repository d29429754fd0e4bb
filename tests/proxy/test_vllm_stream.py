# SPDX-License-Identifier: Apache-2.0
"""The fast path for vLLM's plain token chunks (`engines/vllm_stream.py`) gives exactly what parsing every chunk
with orjson gives: the same token ids, logprobs, text, reasoning, tool calls, finish reason and (after the proxy's
per-read merge) the same events, whatever the mix of chunk shapes, escapes, tokens per chunk and read boundaries;
what it cannot read exactly fails the same way.

Streams are written the way vLLM writes them (compact JSON, its key order, `bytes` and `stop_reason` included).
Every test runs with both scanners: the C one (`_sse_scan.segments`, skipped when it is not built) and the regex one
it replaces (`_segments_py`, the fallback).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import orjson
import pytest

from nemo_polar.proxy.engines import vllm_stream
from nemo_polar.proxy.engines.base import UpstreamError
from nemo_polar.proxy.engines.vllm_stream import StreamAccumulator
from nemo_polar.proxy.normalized import StreamEvent
from nemo_polar.proxy.streaming import coalesce


@pytest.fixture(autouse=True, params=["c", "regex"])
def scanner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """`feed_block` with the C scanner, then with the regex fallback."""
    if request.param == "regex":
        monkeypatch.setattr(vllm_stream, "_segments", vllm_stream._segments_py)
    elif vllm_stream.SCANNER != "c":
        pytest.skip("the C scanner (_sse_scan) is not built; the regex one is tested")
    return str(request.param)


HEAD = {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1764600000, "model": "tiny-qwen3"}


def _token(key: str, text: str, ids: list[int], lps: list[float], finish: str | None = None) -> dict[str, Any]:
    entries = [
        {"token": f"t{i}", "logprob": lp, "bytes": [116, 49], "top_logprobs": []}
        for i, lp in zip(ids, lps, strict=True)
    ]
    choice: dict[str, Any] = {"index": 0, "delta": {key: text}, "logprobs": {"content": entries}}
    choice["finish_reason"] = finish
    if finish:
        choice["stop_reason"] = None  # vLLM's key order: finish_reason, stop_reason, token_ids
    choice["token_ids"] = ids
    return {**HEAD, "choices": [choice]}


def _first(prompt: list[int]) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    return {**HEAD, "choices": [choice], "prompt_token_ids": prompt}


def _tool(index: int, args: str, name: str | None = None) -> dict[str, Any]:
    tc: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if name:
        tc = {"id": f"call_{index}", "type": "function", "index": index, "function": {"name": name, "arguments": ""}}
    choice = {"index": 0, "delta": {"tool_calls": [tc]}, "logprobs": None, "finish_reason": None, "token_ids": [7]}
    choice["logprobs"] = {"content": [{"token": "x", "logprob": -1.0, "bytes": [120], "top_logprobs": []}]}
    return {**HEAD, "choices": [choice]}


def _sse(chunks: list[dict[str, Any]], *, done: bool = True) -> bytes:
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def _by_orjson(block: bytes) -> tuple[StreamAccumulator, list[StreamEvent]]:
    """The reference: every `data:` line parsed with orjson and folded by `feed`."""
    acc, events = StreamAccumulator("m"), []
    for line in block.split(b"\n"):
        if line.startswith(b"data:") and not acc._feed_payload(line[5:].strip(), None, events):
            break
    return acc, events


def _in_reads(block: bytes, cuts: list[int]) -> tuple[StreamAccumulator, list[StreamEvent]]:
    """`feed_block` the way `VLLMEngine.stream_batches` calls it: complete lines of each read, the tail kept."""
    acc, events, rest = StreamAccumulator("m"), [], b""
    bounds = [0, *sorted(cuts), len(block)]
    for a, b in itertools.pairwise(bounds):
        buf = rest + block[a:b]
        cut = buf.rfind(b"\n") + 1
        rest = buf[cut:]
        if cut:
            events += coalesce(acc.feed_block(buf[:cut], None))
        if acc.done:
            break
    if not acc.done and rest.strip():
        events += acc.feed_block(rest, None)
    return acc, events


def _assert_same(block: bytes, cuts: list[int] | None = None) -> StreamAccumulator:
    ref, ref_events = _by_orjson(block)
    acc, events = _in_reads(block, cuts or [])
    assert acc.result() == ref.result()
    assert acc.done == ref.done
    if not cuts:  # one read: the same events after the per-read merge
        assert coalesce(events) == coalesce(ref_events)
    else:  # several reads: the same text, reasoning and tool pieces in the same order
        assert _flat(events) == _flat(ref_events)
    return acc


def _flat(events: list[StreamEvent]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for ev in events:
        key = (ev.kind, ev.id or ev.name or "") if ev.kind == "tool_call" else (ev.kind, "")
        if out and ev.kind != "tool_call" and out[-1][0] == ev.kind:
            out[-1] = (ev.kind, out[-1][1] + ev.text)
        else:
            out.append((key[0], ev.text if ev.kind != "tool_call" else key[1]))
    return out


def test_plain_content_stream_takes_the_fast_path_and_matches_orjson() -> None:
    chunks = [_first([1, 2, 3])]
    chunks += [_token("content", f"w{k} ", [100 + k], [-0.01 * k]) for k in range(50)]
    chunks.append(_token("content", "end", [999], [-2.5e-05], finish="length"))
    chunks.append({**HEAD, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 51}})
    acc = _assert_same(_sse(chunks))
    assert acc.fast_chunks == 51  # every token chunk; the first and the usage chunk through orjson
    assert acc.finish == "length" and acc.ids[-1] == 999 and acc.logprobs[-1] == -2.5e-05


def test_escapes_unicode_and_reasoning_turning_into_content() -> None:
    texts = ['say "hi"', "back\\slash", "line\nbreak\ttab", "café ☕", "\u00e9\u4e2d", "😀", "/", ""]
    chunks = [_first([5])]
    chunks += [_token("reasoning", t, [10 + i], [-0.5]) for i, t in enumerate(texts)]
    chunks += [_token("reasoning_content", "more thought", [30], [-0.25])]
    chunks += [_token("content", t, [40 + i], [-1.0]) for i, t in enumerate(texts)]
    chunks += [_token("content", "done", [60], [0], finish="stop")]
    acc = _assert_same(_sse(chunks))
    assert acc.fast_chunks == len(chunks) - 1
    assert "".join(acc.content).startswith('say "hi"back\\slash')


def test_u_escapes_are_decoded_chunk_by_chunk() -> None:
    raw = _sse([_first([1]), _token("content", "a", [2], [-1.0])])
    # vLLM writes non-ASCII raw, but a \\u escape must decode exactly as orjson decodes each chunk
    pair = raw.replace(b'"content":"a"', b'"content":"\\ud83d\\ude00 \\u00e9"')
    assert _assert_same(pair).result().content == "😀 é"
    # a surrogate pair split over two chunks is an error per chunk: it must stay one
    split = _sse([_first([1]), _token("content", "X", [2], [-1.0]), _token("content", "Y", [3], [-1.0])])
    split = split.replace(b'"content":"X"', b'"content":"\\ud83d"').replace(b'"content":"Y"', b'"content":"\\ude00"')
    with pytest.raises(UpstreamError):
        _by_orjson(split)
    with pytest.raises(UpstreamError, match="malformed SSE chunk"):
        _in_reads(split, [])


def test_several_tokens_per_chunk_and_tool_calls_in_between() -> None:
    chunks = [_first(list(range(20)))]
    chunks += [_token("content", "abc", [1, 2, 3], [-0.1, -0.2, -0.3])]
    chunks += [_token("content", "de", [4, 5], [-0.4, -0.5])]
    chunks += [_tool(0, "", name="read_file"), _tool(0, '{"path": "a.py"}')]
    chunks += [_token("content", "after", [6, 7, 8, 9], [-1, -2, -3, -4], finish="tool_calls")]
    chunks.append({**HEAD, "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 11}})
    acc = _assert_same(_sse(chunks))
    assert acc.ids == [1, 2, 3, 4, 5, 7, 7, 6, 7, 8, 9]
    assert acc.result().tool_calls[0].arguments == '{"path": "a.py"}'
    assert acc.fast_chunks == 3


def test_crlf_line_ends_and_a_last_line_without_newline() -> None:
    chunks = [_first([1]), *(_token("content", f"c{k}", [k], [-0.5]) for k in range(5))]
    block = _sse(chunks).replace(b"\n", b"\r\n")
    assert _assert_same(block).fast_chunks == 5
    no_done = _sse(chunks, done=False).rstrip(b"\n")  # the stream's last chunk without its newline
    acc, _ = _in_reads(no_done, [len(no_done) // 2])
    assert acc.ids == list(range(5)) and acc.fast_chunks == 5 and not acc.done


@pytest.mark.parametrize("seed", range(6))
def test_any_read_boundaries_give_the_same_record(seed: int) -> None:
    rng = random.Random(seed)
    chunks = [_first([1, 2])]
    for k in range(40):
        key = "reasoning" if k < 10 else "content"
        n = rng.choice([1, 1, 2, 4])
        chunks.append(_token(key, f"p{k}\\" if k % 7 == 0 else f"p{k}", list(range(k, k + n)), [-0.5] * n))
    chunks.append(_token("content", "!", [77], [-0.1], finish="stop"))
    block = _sse(chunks)
    cuts = rng.sample(range(1, len(block)), 9)
    _assert_same(block, cuts)


def test_unusual_shapes_go_through_orjson_and_fail_the_same_way() -> None:
    ok = _sse([_first([1]), _token("content", "a", [2], [-1.0]), _token("content", "b", [3], [-1.0])])
    # a key order vLLM does not write, extra fields, a second choice: not fast, still folded the same
    odd = ok.replace(b'"index":0,"delta"', b'"delta_extra":1,"index":0,"delta"', 1)
    _assert_same(odd)
    # a malformed number and a control character in a string: the line fails as a malformed chunk
    for bad in (
        ok.replace(b'"logprob":-1.0', b'"logprob":-1.0.5', 1),
        ok.replace(b'"content":"a"', b'"content":"\x01"'),
    ):
        with pytest.raises(UpstreamError, match="malformed SSE chunk"):
            _by_orjson(bad)
        with pytest.raises(UpstreamError, match="malformed SSE chunk"):
            _in_reads(bad, [])
    # an error object mid-stream
    err = ok.replace(b"data: [DONE]", b'data: {"error":{"message":"engine died"}}\n\ndata: [DONE]')
    with pytest.raises(UpstreamError, match="engine died"):
        _in_reads(err, [])


@pytest.mark.parametrize(("interval", "chunks"), [(1, 64), (8, 9)])
def test_the_fake_upstreams_sized_stream_is_read_on_the_fast_path(interval: int, chunks: int) -> None:
    """The benchmarks' FAKE upstream writes vLLM's chunk shape: every token chunk takes the fast path, also with a
    stream interval (the first token alone, then 8 a chunk, as vLLM 0.32 sends them)."""
    import asyncio

    import aiohttp

    from polar_lab.fake_upstream import FakeBehaviour, FakeUpstream

    async def fetch() -> bytes:
        fake = await FakeUpstream(behaviour=FakeBehaviour(sized=True)).start()
        body = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 64, "stream": True}
        body.update({"return_token_ids": True, "logprobs": True, "top_logprobs": 0, "stream_interval": interval})
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(fake.base_url + "/v1/chat/completions", json=body) as r:
                    return await r.read()
        finally:
            await fake.stop()

    acc = _assert_same(asyncio.run(fetch()))
    assert acc.fast_chunks == chunks and len(acc.ids) == len(acc.logprobs) == 64


@pytest.mark.parametrize("stream", [False, True])
def test_the_sized_fake_sends_token_data_only_when_asked(stream: bool) -> None:
    """As vLLM: prompt/sampled ids only with `return_token_ids`, logprobs only with `logprobs` (`"logprobs": null`
    otherwise), so a pass-through that asks for neither is not sent them (benchmarks/proxy_overhead.py's floor)."""
    import asyncio

    import aiohttp

    from polar_lab.fake_upstream import FakeBehaviour, FakeUpstream

    async def fetch(extra: dict[str, Any]) -> bytes:
        fake = await FakeUpstream(behaviour=FakeBehaviour(sized=True)).start()
        body = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 16, "stream": stream}
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(fake.base_url + "/v1/chat/completions", json={**body, **extra}) as r:
                    return await r.read()
        finally:
            await fake.stop()

    def objects(raw: bytes) -> list[dict[str, Any]]:
        if not stream:
            return [orjson.loads(raw)]
        lines = [ln[6:] for ln in raw.split(b"\n") if ln.startswith(b"data: ") and ln != b"data: [DONE]"]
        return [orjson.loads(ln) for ln in lines]

    plain = objects(asyncio.run(fetch({})))
    asked = objects(asyncio.run(fetch({"return_token_ids": True, "logprobs": True, "top_logprobs": 0})))
    choices = [c for o in plain for c in o.get("choices", [])]
    assert choices and all(c.get("logprobs") is None and "token_ids" not in c for c in choices)
    assert not any("prompt_token_ids" in o for o in plain)
    assert any("prompt_token_ids" in o for o in asked)
    sampled = [e for o in asked for c in o.get("choices", []) for e in (c.get("logprobs") or {}).get("content", [])]
    assert len(sampled) == 16


def test_a_stream_captured_from_vllm_0_32_is_read_on_the_fast_path() -> None:
    """40 tokens streamed by the embedded vLLM 0.32 (`tiny-qwen3`, token capture on, as the proxy asks): the real
    key order and fields (`bytes`, `stop_reason`, `system_fingerprint`), chunks of several tokens, an empty delta."""
    from pathlib import Path

    block = (Path(__file__).parents[1] / "data" / "vllm_stream" / "tiny_qwen3_040_tokens.sse").read_bytes()
    acc = _assert_same(block)
    res = acc.result()
    assert len(res.generation_token_ids) == len(res.generation_log_probs) == res.completion_tokens == 40
    assert acc.fast_chunks == 29  # every chunk but the first, the empty delta and the usage chunk (and [DONE])


@pytest.mark.parametrize("interval", [None, 8])
def test_the_proxy_asks_vllm_for_its_stream_interval_and_the_client_gets_the_same_answer(
    fake_upstream: Any, make_proxy: Any, interval: int | None
) -> None:
    """`stream_interval` (ProxyConfig / `--stream-interval`) goes to vLLM only when set; the client's text and the
    record are the same at 1 or 8 tokens a chunk."""
    import openai

    fake = fake_upstream(sized=True)
    h = make_proxy([fake.base_url], stream_interval=interval)
    s = h.session()
    client = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    msgs = [{"role": "user", "content": "write " * 100}]
    stream = client.chat.completions.create(model="m", messages=msgs, stream=True, max_tokens=40)  # type: ignore[arg-type]
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "".join(f"w{k} " for k in range(40))
    sent = fake.requests[-1]
    assert sent.get("stream_interval") == interval if interval else "stream_interval" not in sent
    rec = h.records(s.session_id)[-1]
    assert len(rec.generation_token_ids) == len(rec.generation_log_probs) == 40 and rec.error is None
