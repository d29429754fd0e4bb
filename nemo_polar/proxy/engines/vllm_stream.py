# SPDX-License-Identifier: Apache-2.0
"""vLLM's streamed chat chunks folded into `StreamEvent`s and the final `ChatResult`, at a low CPU cost per token.

A 512-token answer is 512 SSE lines; parsing each into nested dicts costs more CPU than everything else the proxy
does for the call (docs/performance.md, long streams). So a block of complete lines is read in two ways:

- plain token chunks (one choice, a delta of only `content` / `reasoning_content` / `reasoning`, the token ids and
  their logprobs, nothing else; the exact key order vLLM's serializer writes) are recognised by one compiled pattern
  over the whole block, and a run of them is decoded at once: all their token ids in one `orjson` call, all their
  logprobs in one, their text in one;
- every other line (the first chunk with the prompt ids, tool-call deltas, the finish and usage chunks, an error,
  `[DONE]`, any shape the pattern does not know) goes through `orjson` and `StreamAccumulator.feed`, as before; the
  first chunk's prompt ids (8,000 for an 8k-token prompt) are packed in C as `TokenIds` on the way, not made into
  Python ints (`_packed_ids_chunk`, the same cut as `vllm.fast_answer`'s).

Both give the same record and the same events after `streaming.coalesce` (adjacent text of one read merged): the
fast path emits a run's text already merged. Anything the fast decode cannot read exactly (a malformed number, a
`\\u` escape that could be half of a surrogate pair split over two chunks) sends that run down the `orjson` path,
which reports the error as before. Used by `engines/vllm.py`.

A block is cut into segments: each other line's text, and each run of plain token chunks with its columns already
joined (`_columns`). `_sse_scan.segments`, a C function, does that in one pass (the regex alone cost ~3 ns per
byte, and the rows it returns as much again to join: most of the proxy's CPU on a 512-token stream); the package
builds it when a compiler is there (setup.py, optional). Without it `_segments_py` gives the same segments from
`_LINE.findall`. `SCANNER` names the one in use; tests/proxy/test_sse_scan.py holds the two to equality.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from nemo_polar.proxy.engines.base import UpstreamError
from nemo_polar.proxy.normalized import ChatResult, StreamEvent, ToolCall
from nemo_polar.types import TokenIds

__all__ = ["SCANNER", "StreamAccumulator"]

_CH = rb'[^"\\\x00-\x1f]'  # a character a JSON string holds as itself (no quote, backslash or control character)
# possessive quantifiers (`*+`, `?+`): nothing here needs backtracking, and not recording it makes the scan ~30 % cheaper
_STR = rb'"' + _CH + rb"*+(?:\\." + _CH + rb'*+)*+"'  # a JSON string (unrolled: no per-character alternation)
_CSTR = rb'"(' + _CH + rb"*+(?:\\." + _CH + rb'*+)*+)"'
_NUM = rb"-?+(?:0|[1-9]\d*+)(?:\.\d++)?+(?:[eE][+-]?+\d++)?+"
_LP = (
    rb'\{"token":'
    + _STR
    + rb',"logprob":'
    + _NUM
    + rb'(?:,"bytes":(?:null|\[[\d,]*+\]))?+(?:,"top_logprobs":\[\])?+\}'
)
_LP1 = _LP.replace(rb'"logprob":' + _NUM, rb'"logprob":(' + _NUM + rb")")  # the first entry, its logprob captured
# one plain token chunk, in the key order of vLLM's `model_dump_json(exclude_unset=True)`; groups: kind, text,
# logprob entries, the first entry's logprob, finish reason, token ids
_TOKEN_CHUNK = (
    rb'\{"id":' + _STR + rb',"object":"chat\.completion\.chunk","created":\d++,"model":' + _STR + rb","
    rb'"choices":\[\{"index":0,"delta":\{(?:"role":"assistant",)?+"(content|reasoning_content|reasoning)":'
    + _CSTR
    + rb'\}(?:,"logprobs":(?:null|\{"content":\[('
    + _LP1
    + rb"(?:,"
    + _LP
    + rb")*+)?+\]\}))?+"
    rb'(?:,"finish_reason":(?:null|"([a-z_]*+)"))?+(?:,"stop_reason":(?:null|\d++|' + _STR + rb"))?+"
    rb'(?:,"token_ids":\[(\d++(?:,\d++)*+)?+\])?+\}\](?:,"(?:usage|prompt_token_ids|system_fingerprint)":null)*+\}'
)
# every `data:` line: (payload, kind, text, logprob entries, first logprob, finish, ids, other line); `payload` is
# empty unless the line is a plain token chunk
_LINE = re.compile(rb"^data: ?+(?:(" + _TOKEN_CHUNK + rb")\r?$|([^\n]*+))", re.M)
_LOGPROB = re.compile(rb'"logprob":([^,}]+)')  # over entries `_LP` already matched: each value is a JSON number
_REASONING = {b"reasoning_content", b"reasoning"}


class StreamAccumulator:
    """Folds vLLM chat chunks into `StreamEvent`s and the final `ChatResult` (no per-token Python objects)."""

    __slots__ = (
        "content",
        "done",
        "fast_chunks",
        "finish",
        "ids",
        "logprobs",
        "model",
        "prompt_ids",
        "reasoning",
        "rid",
        "tools",
        "usage",
    )

    def __init__(self, served_model: str):
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, list[Any]] = {}
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.prompt_ids: list[int] | TokenIds = []
        self.usage: dict[str, Any] = {}
        self.finish = "stop"
        self.model = served_model
        self.rid = ""
        self.done = False
        self.fast_chunks = 0  # how many chunks took the fast path (tests and benchmarks read it)

    # -- a block of lines -----------------------------------------------------------------------------------------

    def feed_block(self, block: bytes, endpoint: str | None) -> list[StreamEvent]:
        """The events of every `data:` line in `block` (complete lines; the last may lack its newline); stops at
        `[DONE]` (sets `done`)."""
        events: list[StreamEvent] = []
        for seg in _segments(block):
            if isinstance(seg, bytes):
                if not self._feed_payload(seg.strip(), endpoint, events):
                    break  # [DONE]
            elif self.rid:  # a run of plain token chunks
                if not self._feed_run(seg, events):
                    for row in _run_rows(seg, block):
                        self._feed_payload(row[0], endpoint, events)
            else:  # the stream's first chunk sets `rid` the slow way; the rest of its run is a run again
                rows = _run_rows(seg, block)
                k = 0
                while k < len(rows) and not self.rid:
                    self._feed_payload(rows[k][0], endpoint, events)
                    k += 1
                if k < len(rows) and not self._feed_run(_columns(rows[k:]), events):
                    for row in rows[k:]:
                        self._feed_payload(row[0], endpoint, events)
        return events

    def _feed_run(self, run: Run, events: list[StreamEvent]) -> bool:
        """Decode a run of plain token chunks at once; False (nothing changed) when it cannot be read exactly."""
        _, count, tids, lps, finish, stretches = run
        try:
            ids = orjson.loads(b"[" + tids + b"]")
            logprobs = orjson.loads(b"[" + lps + b"]")
            # one piece per stretch of one kind (reasoning turning into content within one read)
            pieces = [(kind, _text(joined, parts)) for kind, joined, parts in stretches]
            finish_s = orjson.loads(b'"' + finish + b'"') if finish else None
        except (orjson.JSONDecodeError, UnicodeDecodeError, ValueError):
            return False
        self.ids += ids
        self.logprobs += logprobs
        for kind, text in pieces:
            if not text:
                continue
            if kind in _REASONING:
                self.reasoning.append(text)
                events.append(StreamEvent("reasoning", text=text))
            else:
                self.content.append(text)
                events.append(StreamEvent("text", text=text))
        if finish_s:
            self.finish = finish_s
        self.fast_chunks += count
        return True

    def _feed_payload(self, payload: bytes, endpoint: str | None, events: list[StreamEvent]) -> bool:
        """One chunk through `orjson`; False at `[DONE]`."""
        if payload == b"[DONE]":
            self.done = True
            return False
        packed = _packed_ids_chunk(payload) if len(payload) > _PACK_MIN else None
        if packed is not None:  # the first chunk's prompt ids, packed (set before `feed`, as its top-level ids are)
            chunk, self.prompt_ids = packed
        else:
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError as exc:
                raise UpstreamError(502, "api_error", "upstream sent a malformed SSE chunk") from exc
        if "error" in chunk and "choices" not in chunk:
            err = chunk["error"]
            msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            raise UpstreamError(502, "api_error", f"upstream failed mid-stream: {msg}", endpoint=endpoint)
        events += self.feed(chunk)
        return True

    # -- one parsed chunk -------------------------------------------------------------------------------------------

    def feed(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if not self.rid:
            self.rid = chunk.get("id") or ""
            self.model = chunk.get("model") or self.model
        pids = chunk.get("prompt_token_ids")
        if pids:
            self.prompt_ids = pids
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not self.prompt_ids and choice.get("prompt_token_ids"):
                self.prompt_ids = choice["prompt_token_ids"]
            tids = choice.get("token_ids")
            if tids:
                self.ids.extend(tids)
            lp = choice.get("logprobs")
            if lp and lp.get("content"):
                self.logprobs.extend([c["logprob"] for c in lp["content"]])
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
            delta = choice.get("delta") or {}
            r = delta.get("reasoning_content") or delta.get("reasoning")
            if r:
                self.reasoning.append(r)
                events.append(StreamEvent("reasoning", text=r))
            c = delta.get("content")
            if c:
                self.content.append(c)
                events.append(StreamEvent("text", text=c))
            for tc in delta.get("tool_calls") or ():
                idx = tc.get("index", 0)
                fn = tc.get("function") or {}
                slot = self.tools.get(idx)
                if slot is None:
                    slot = self.tools[idx] = [tc.get("id") or f"call_{idx}", fn.get("name") or "", []]
                    events.append(StreamEvent("tool_call", index=idx, id=slot[0], name=slot[1]))
                elif fn.get("name") and not slot[1]:
                    slot[1] = fn["name"]
                args = fn.get("arguments")
                if args:
                    slot[2].append(args)
                    events.append(StreamEvent("tool_args", text=args, index=idx))
        return events

    def result(self) -> ChatResult:
        return ChatResult(
            content="".join(self.content),
            reasoning="".join(self.reasoning) or None,
            tool_calls=[ToolCall(id=s[0], name=s[1], arguments="".join(s[2])) for _, s in sorted(self.tools.items())],
            finish_reason=self.finish,
            prompt_tokens=self.usage.get("prompt_tokens", len(self.prompt_ids)),
            completion_tokens=self.usage.get("completion_tokens", len(self.ids)),
            prompt_token_ids=self.prompt_ids,
            generation_token_ids=self.ids,
            generation_log_probs=self.logprobs,
            served_model=self.model,
            response_id=self.rid,
        )


def _text(joined: bytes, pieces: tuple[bytes, ...] | None) -> str:
    """The text of JSON string bodies (`joined`; one by one in `pieces` when they hold a `\\u`), exactly as decoding
    each one and joining them would give."""
    if b"\\" not in joined:
        return joined.decode()
    if pieces is not None:  # decoded one by one: a surrogate half in one chunk stays an error, as it is per chunk
        return "".join([orjson.loads(b'"' + p + b'"') for p in pieces])
    out: str = orjson.loads(b'"' + joined + b'"')
    return out


# A run of plain token chunks, its columns joined: (where its rows are: a slice of the block or the rows themselves,
# chunks, token ids, the logprob of every entry (several a chunk under a stream interval), last finish reason,
# stretches of one kind as (kind, text, the texts one by one when they hold a `\u`, else None)); joined with `,`,
# b"" if none.
Run = tuple[Any, int, bytes, bytes, bytes, tuple[tuple[bytes, bytes, tuple[bytes, ...] | None], ...]]


def _columns(rows: list[tuple[bytes, ...]]) -> Run:
    """A run's columns from its `_LINE` rows (what `_sse_scan.segments` builds while it scans)."""
    _, kinds, texts, entries, _, fins, tids, _ = zip(*rows, strict=True)
    lps = _LOGPROB.findall(b",".join(entries))  # every entry's logprob (several a chunk under a stream interval)
    stretches = []
    start = 0
    for k in range(1, len(kinds) + 1):
        if k == len(kinds) or kinds[k] != kinds[start]:
            joined = b"".join(texts[start:k])
            stretches.append((kinds[start], joined, texts[start:k] if b"\\u" in joined else None))
            start = k
    finish = next((f for f in reversed(fins) if f), b"")
    ids = b",".join([t for t in tids if t])
    return rows, len(rows), ids, b",".join(lps), finish, tuple(stretches)


def _segments_py(block: bytes) -> list[bytes | Run]:
    """The segments of a block (each other `data:` line's text, each run's columns) from `_LINE.findall`."""
    rows: list[tuple[bytes, ...]] = _LINE.findall(block)
    out: list[bytes | Run] = []
    i, n = 0, len(rows)
    while i < n:
        if not rows[i][0]:
            out.append(rows[i][7])
            i += 1
            continue
        j = i + 1
        while j < n and rows[j][0]:
            j += 1
        out.append(_columns(rows[i:j]))
        i = j
    return out


def _run_rows(run: Run, block: bytes) -> list[tuple[bytes, ...]]:
    """A run's `_LINE` rows (for the slow path): the C scan gives where they are, the regex one the rows."""
    where = run[0]
    if isinstance(where, list):
        return where
    rows: list[tuple[bytes, ...]] = _LINE.findall(block[where.start : where.stop])
    return rows


# carry prompt ids as `TokenIds` from the answer to the record (here and in `vllm.fast_answer`; benchmarks and tests
# switch it off to compare)
PACK_PROMPT_IDS = True
_PACK_MIN = 1024  # a chunk shorter than this is not worth the walk


def _packed_ids_chunk(payload: bytes) -> tuple[dict[str, Any], TokenIds] | None:
    """A chunk with top-level prompt ids, parsed without making their ints: the chunk (its `prompt_token_ids` left
    empty) and the ids packed, as `vllm.fast_answer` does for a whole answer; None (parse it whole) otherwise."""
    if _answer_logprobs is None or not PACK_PROMPT_IDS:
        return None
    cut = _answer_logprobs(payload, True)
    if cut is None or cut[1] or cut[2] is None:  # no ids cut, or logprob entries cut too: the whole parse
        return None
    try:
        chunk = orjson.loads(cut[0])
    except orjson.JSONDecodeError:
        return None
    if (
        not isinstance(chunk, dict)
        or chunk.get("prompt_token_ids") != []
        or ("error" in chunk and "choices" not in chunk)
    ):
        return None
    return chunk, TokenIds.from_checked(cut[2])  # every id checked in C


_answer_logprobs: Callable[[bytes, bool], tuple[bytes, int, bytes | None] | None] | None
_segments: Callable[[bytes], list[bytes | Run]]
try:  # the same segments in one pass in C (_sse_scan.c); built with the package when a compiler is there
    from nemo_polar.proxy.engines._sse_scan import answer_logprobs as _answer_logprobs
    from nemo_polar.proxy.engines._sse_scan import segments as _segments

    SCANNER = "c"  # which one `feed_block` uses (benchmarks print it)
except ImportError:  # a build without a compiler
    _segments = _segments_py
    _answer_logprobs = None
    SCANNER = "regex"
