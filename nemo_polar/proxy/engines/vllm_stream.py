# SPDX-License-Identifier: Apache-2.0
"""vLLM's streamed chat chunks folded into `StreamEvent`s and the final `ChatResult`, at a low CPU cost per token.

A 512-token answer is 512 SSE lines; parsing each into nested dicts costs more CPU than everything else the proxy
does for the call (docs/performance.md, long streams). So a block of complete lines is read in two ways:

- plain token chunks (one choice, a delta of only `content` / `reasoning_content` / `reasoning`, the token ids and
  their logprobs, nothing else; the exact key order vLLM's serializer writes) are recognised by one compiled pattern
  over the whole block, and a run of them is decoded at once: all their token ids in one `orjson` call, all their
  logprobs in one, their text in one;
- every other line (the first chunk with the prompt ids, tool-call deltas, the finish and usage chunks, an error,
  `[DONE]`, any shape the pattern does not know) goes through `orjson` and `StreamAccumulator.feed`, as before.

Both give the same record and the same events after `streaming.coalesce` (adjacent text of one read merged): the
fast path emits a run's text already merged. Anything the fast decode cannot read exactly (a malformed number, a
`\\u` escape that could be half of a surrogate pair split over two chunks) sends that run down the `orjson` path,
which reports the error as before. Used by `engines/vllm.py`.

The lines of a block are found by `_sse_scan.lines`, a C function that returns exactly what `_LINE.findall` returns
(the regex costs ~3 ns per byte, a third of the proxy's CPU on a 512-token stream); the package builds it when a
compiler is there (setup.py, optional) and `_LINE.findall` is used when it is not. `SCANNER` names the one in use.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from nemo_polar.proxy.engines.base import UpstreamError
from nemo_polar.proxy.normalized import ChatResult, StreamEvent, ToolCall

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
_lines: Callable[[bytes], list[tuple[bytes, ...]]]  # the rows of a block: `_LINE.findall`'s, by either scanner
try:  # the same rows without the regex engine (_sse_scan.c); built with the package when a compiler is there
    from nemo_polar.proxy.engines._sse_scan import lines as _lines

    SCANNER = "c"  # which one `feed_block` uses (benchmarks print it)
except ImportError:  # a build without a compiler
    _lines = _LINE.findall
    SCANNER = "regex"
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
        self.prompt_ids: list[int] = []
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
        rows = _lines(block)
        events: list[StreamEvent] = []
        i, n = 0, len(rows)
        while i < n:
            row = rows[i]
            if row[0] and self.rid:  # a run of plain token chunks (the first chunk sets `rid` the slow way)
                j = i + 1
                while j < n and rows[j][0]:
                    j += 1
                run = rows[i:j]
                if not self._feed_run(run, events):
                    for r in run:
                        self._feed_payload(r[0], endpoint, events)
                i = j
                continue
            if not self._feed_payload((row[0] or row[7]).strip(), endpoint, events):
                break  # [DONE]
            i += 1
        return events

    def _feed_run(self, run: list[tuple[bytes, ...]], events: list[StreamEvent]) -> bool:
        """Decode a run of plain token chunks at once; False (nothing changed) when it cannot be read exactly."""
        _, kinds, texts, lps, first_lps, fins, tids, _ = zip(*run, strict=True)  # columns
        try:
            ids = orjson.loads(b"[" + b",".join([t for t in tids if t]) + b"]")
            lp_vals = [x for x in first_lps if x]
            entries = b",".join([x for x in lps if x])
            if entries.count(b'"logprob":') != len(lp_vals):  # some chunk carries several tokens (stream interval)
                lp_vals = _LOGPROB.findall(entries)
            logprobs = orjson.loads(b"[" + b",".join(lp_vals) + b"]")
            if kinds.count(kinds[0]) == len(kinds):
                pieces = [(kinds[0], _text(texts))]
            else:  # reasoning turning into content within one read: one piece per stretch of one kind
                pieces = []
                start = 0
                for k in range(1, len(kinds) + 1):
                    if k == len(kinds) or kinds[k] != kinds[start]:
                        pieces.append((kinds[start], _text(texts[start:k])))
                        start = k
            finish = next((f for f in reversed(fins) if f), None)
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
        self.fast_chunks += len(run)
        return True

    def _feed_payload(self, payload: bytes, endpoint: str | None, events: list[StreamEvent]) -> bool:
        """One chunk through `orjson`; False at `[DONE]`."""
        if payload == b"[DONE]":
            self.done = True
            return False
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


def _text(pieces: tuple[bytes, ...]) -> str:
    """The text of JSON string bodies, exactly as decoding each one and joining them would give."""
    joined = b"".join(pieces)
    if b"\\" not in joined:
        return joined.decode()
    if b"\\u" in joined:  # decoded one by one: a surrogate half in one chunk stays an error, as it is per chunk
        return "".join([orjson.loads(b'"' + p + b'"') for p in pieces])
    out: str = orjson.loads(b'"' + joined + b'"')
    return out
