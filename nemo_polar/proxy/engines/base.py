# SPDX-License-Identifier: Apache-2.0
"""Engine plumbing shared by vLLM and SGLang: upstream endpoints, sticky routing, failover, error mapping.

Routing (`routing`): `sticky` (default) pins each session to one endpoint by a stable hash of its id (prefix-cache
affinity), the other endpoints following in ring order; `round_robin` starts each request at the next endpoint in
turn, whatever its session (the reference Polar's routing; `benchmarks/prefix_cache.py` compares the two). A
request moves to the next endpoint only when the connection could not be established (refused, unreachable, connect
timeout), so a generation is never sent twice. Every upstream call has a connect and a read timeout. Upstream
failures become `UpstreamError` (a `ProviderError`: the dialect renders it in the caller's shape): 5xx → 502,
unreachable → 503, timeout → 504, all with `retry-after`; a context overflow keeps its 400 with kind
`context_length_exceeded`.

This module knows nothing of dialects or the record store.
"""

from __future__ import annotations

import math
import struct
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from nemo_polar.proxy.normalized import ChatRequest, ChatResult, ProviderError, StreamEvent, ToolCall
from nemo_polar.proxy.upstream_http import (
    HTTPClient,
    Target,
    UpstreamConnectError,
    UpstreamDisconnected,
    UpstreamResponse,
    UpstreamTimeout,
)
from nemo_polar.types import TokenIds

__all__ = [
    "ROUTING_MODES",
    "Engine",
    "EngineCall",
    "Generation",
    "UpstreamError",
    "Upstreams",
    "upstream_error_from_response",
]

ROUTING_MODES = ("sticky", "round_robin")

_OVERFLOW_MARKERS = ("maximum context length", "context length", "too long", "max_model_len", "exceeds the model")


class UpstreamError(ProviderError):
    """The inference upstream failed; rendered to the harness in its provider's error shape."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        endpoint: str | None = None,
        upstream_status: int | None = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(status, kind, message, retry_after_s=retry_after_s)
        self.endpoint = endpoint
        self.upstream_status = upstream_status

    def to_record(self) -> dict[str, Any]:
        return {
            "type": "upstream",
            "kind": self.kind,
            "status": self.status,
            "upstream_status": self.upstream_status,
            "endpoint": self.endpoint,
            "message": self.message,
        }


def upstream_error_from_response(status: int, body: bytes, endpoint: str) -> UpstreamError:
    """Map an upstream HTTP error to what the harness should see."""
    try:
        parsed = orjson.loads(body)
        err = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
        message = str(err.get("message", err)) if isinstance(err, dict) else str(err)
    except orjson.JSONDecodeError:
        message = body[:2000].decode("utf-8", "replace")
    lowered = message.lower()
    if status in (400, 413, 422) and any(m in lowered for m in _OVERFLOW_MARKERS):
        return UpstreamError(400, "context_length_exceeded", message, endpoint=endpoint, upstream_status=status)
    if status == 429:
        return UpstreamError(429, "rate_limit", message, endpoint=endpoint, upstream_status=status, retry_after_s=1)
    if status == 503:
        return UpstreamError(503, "overloaded", message, endpoint=endpoint, upstream_status=status, retry_after_s=1)
    if status == 504:
        return UpstreamError(504, "timeout", message, endpoint=endpoint, upstream_status=status, retry_after_s=1)
    # Anything else is the server's fault, a 4xx included: the dialect accepted the request, so a refusal upstream
    # (vLLM's 400 "Out of range float values are not JSON compliant" for NaN logprobs, a misconfigured model name)
    # is not the harness's to fix. A retryable 502 lets the CLI's own retry logic apply.
    return UpstreamError(
        502,
        "api_error",
        f"upstream returned {status}: {message}",
        endpoint=endpoint,
        upstream_status=status,
        retry_after_s=1,
    )


@dataclass(slots=True)
class EngineCall:
    """One generation to run upstream: what to send (sampling already enforced) and where to route it."""

    request: ChatRequest
    served_model: str
    sampling: dict[str, Any]
    route_key: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Generation:
    """An engine call's outcome: the result (with token data) and upstream facts for the record."""

    result: ChatResult | None = None
    endpoint: str | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    sent_at: float = 0.0
    first_byte_at: float | None = None
    finished_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def adopt(self, other: Generation) -> None:
        """Take over another generation's outcome (a whole answer that a stream's caller waits for)."""
        for name in Generation.__slots__:  # type: ignore[attr-defined]
            setattr(self, name, getattr(other, name))

    def upstream_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "endpoint": self.endpoint,
            "sent_at": self.sent_at,
            "first_byte_at": self.first_byte_at,
            "finished_at": self.finished_at,
            "usage": self.usage,
        }
        if self.attempts:
            out["failover"] = self.attempts
        if self.extra:
            out.update(self.extra)
        return out


class Engine(Protocol):
    """Everything the proxy asks of an inference engine (an engine that cannot do one raises a `ProviderError`)."""

    name: str
    upstreams: Upstreams

    async def chat(self, call: EngineCall) -> Generation:
        """One whole chat generation with its token data."""
        ...

    def stream_batches(self, call: EngineCall, gen: Generation) -> AsyncIterator[list[StreamEvent]]:
        """A streamed chat generation: the events of each network read as one list; `gen` holds the outcome."""
        ...

    async def complete_ids(self, call: EngineCall, prompt_ids: list[int]) -> tuple[Generation, str]:
        """`call`'s generation from prompt token ids instead of its messages (prefix splicing), `call.extra` over the
        upstream body as in `chat`; returns it and the raw generated text."""
        ...

    async def tokenize(self, call: EngineCall) -> list[int]:
        """The prompt token ids the chat template renders for this call."""
        ...

    async def score(
        self, prompt_ids: list[int], continuation: list[int], served_model: str, route_key: str
    ) -> list[float]:
        """The model's logprob of each continuation token after the prompt (teacher forcing)."""
        ...

    async def list_models(self) -> list[str]:
        """The model names the upstream serves."""
        ...


class OpenAIServerEngine:
    """What vLLM's and SGLang's engines share: their upstreams, a total time limit per generation, `/v1/models`."""

    name = "openai-server"

    def __init__(self, upstreams: Upstreams, *, total_timeout_s: float = 900.0):
        self.upstreams = upstreams
        self.total_timeout_s = total_timeout_s

    def build_body(self, call: EngineCall, *, stream: bool) -> dict[str, Any]:
        """The engine's `/v1/chat/completions` body for `call`: the request's chat fields, its sampling, the
        engine's `token_fields` (what makes it return token data), then the call's `extra` over them."""
        body = call.request.chat_fields(call.served_model)
        body.update(call.sampling)
        body.update(self.token_fields(stream))
        body.update(call.extra)
        return body

    def token_fields(self, stream: bool) -> dict[str, Any]:
        """The body fields that make this engine return token ids and logprobs (and stream when `stream`)."""
        raise NotImplementedError

    reply_name = "upstream"  # how a malformed answer is named in its 502: "unexpected <reply_name> reply shape"

    @classmethod
    def read_chat(cls, raw: bytes, served_model: str, gen: Generation) -> ChatResult:
        """The engine's non-streamed chat answer, as it came, as a `ChatResult` (`parse_chat` of its JSON)."""
        return cls.parse_chat(json_object(raw, gen.endpoint), served_model, gen)

    @classmethod
    def parse_chat(
        cls,
        data: dict[str, Any],
        served_model: str,
        gen: Generation,
        log_probs: list[float] | None = None,
        prompt_ids: TokenIds | None = None,
    ) -> ChatResult:
        """The engine's non-streamed chat answer as a `ChatResult`: the engine's `token_data` (its logprobs replaced
        by `log_probs` when given: read from the answer's bytes already), the message's fields, the usage checked
        against the token data; a malformed answer is a retryable 502."""
        try:
            choice = data["choices"][0]
            parsed_prompt_ids, generation_ids, parsed_log_probs = cls.token_data(data, choice, gen)
            if log_probs is None:
                log_probs = parsed_log_probs
            result = ChatResult(
                **message_fields(choice.get("message") or {}),
                finish_reason=choice.get("finish_reason") or "stop",
                prompt_token_ids=parsed_prompt_ids if prompt_ids is None else prompt_ids,
                generation_token_ids=generation_ids,
                generation_log_probs=log_probs,
                served_model=data.get("model") or served_model,
                response_id=data.get("id") or "",
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UpstreamError(
                502, "api_error", f"unexpected {cls.reply_name} reply shape: {exc!r}", endpoint=gen.endpoint
            ) from exc
        return with_usage(result, data.get("usage") or {}, gen)

    @staticmethod
    def token_data(
        data: dict[str, Any], choice: dict[str, Any], gen: Generation
    ) -> tuple[list[int], list[int], list[float]]:
        """A chat answer's prompt token ids, generated token ids and their logprobs (`choice`: its first choice)."""
        raise NotImplementedError

    def stream_batches(self, call: EngineCall, gen: Generation) -> AsyncIterator[list[StreamEvent]]:
        """A streamed chat generation: the events of each network read as one list; `gen` holds the outcome."""
        raise NotImplementedError

    async def chat(self, call: EngineCall) -> Generation:
        gen = Generation()
        raw = await self.upstreams.post_raw(
            "/v1/chat/completions",
            self.build_body(call, stream=False),
            call.route_key,
            gen,
            total_s=self.total_timeout_s,
        )
        gen.result = self.read_chat(raw, call.served_model, gen)
        return gen

    async def stream(self, call: EngineCall, gen: Generation) -> AsyncIterator[StreamEvent]:
        """Yield `StreamEvent`s as the engine produces them; on normal end `gen.result` holds the full result."""
        async for batch in self.stream_batches(call, gen):
            for ev in batch:
                yield ev

    async def list_models(self) -> list[str]:
        data = await self.upstreams.get_json("/v1/models")
        return [m["id"] for m in data.get("data", []) if isinstance(m, dict) and "id" in m]


class Upstreams:
    """A ring of upstream base URLs with session-sticky (or round-robin) order and connect-failure failover.

    Args:
        urls: base URLs without `/v1` (e.g. `http://127.0.0.1:8000`); a trailing `/v1` is stripped.
        connect_timeout_s: connection set-up limit (a timeout here moves on to the next endpoint).
        read_timeout_s: the longest silence tolerated while reading a reply (504 after it).
        routing: `sticky` (a session's requests start at its home endpoint) or `round_robin` (each request starts
            at the next endpoint in turn).
    """

    def __init__(
        self,
        urls: list[str],
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
        routing: str = "sticky",
    ):
        if not urls:
            raise ValueError("at least one upstream URL is required")
        if routing not in ROUTING_MODES:
            raise ValueError(f"unknown routing {routing!r} ({' | '.join(ROUTING_MODES)})")
        self.routing = routing
        self._turn = 0  # round_robin: the endpoint the next request starts at
        self.urls = [u.rstrip("/").removesuffix("/v1") for u in urls]
        for u in self.urls:
            Target.parse(u)  # a bad URL fails here, at start-up
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.http = HTTPClient()
        self._targets: dict[tuple[str, str], Target] = {}  # parsed once per (endpoint, path)

    def _target(self, base: str, path: str) -> Target:
        t = self._targets.get((base, path))
        if t is None:
            t = self._targets[(base, path)] = Target.parse(base + path)
        return t

    async def close(self) -> None:
        """Close the pooled upstream connections (the app's shutdown); a later start gets a fresh pool (its
        connections belong to the event loop that made them)."""
        old, self.http = self.http, HTTPClient()
        await old.close()

    def order(self, route_key: str) -> list[str]:
        """Endpoints to try for a request: its session's home endpoint first (stable across processes; under
        `round_robin` the next endpoint in turn), then the ring."""
        n = len(self.urls)
        if n == 1:
            return self.urls
        if self.routing == "round_robin":
            start, self._turn = self._turn % n, self._turn + 1
        else:
            start = zlib.crc32(route_key.encode()) % n
        return self.urls[start:] + self.urls[:start]

    async def post(
        self, path: str, body: dict[str, Any], route_key: str, gen: Generation, *, total_s: float | None = None
    ) -> UpstreamResponse:
        """POST to the session's endpoint (failing over only on connect errors); returns a 2xx response."""
        data = orjson.dumps(body)
        last: BaseException | None = None
        for base in self.order(route_key):
            gen.sent_at = time.time()
            try:
                resp = await self.http.request(
                    "POST",
                    self._target(base, path),
                    data,
                    connect_timeout=self.connect_timeout_s,
                    read_timeout=self.read_timeout_s,
                    total_timeout=total_s,
                )
            except UpstreamConnectError as exc:
                gen.attempts.append({"endpoint": base, "error": f"{type(exc).__name__}: {exc}"})
                last = exc
                continue
            except UpstreamTimeout as exc:
                raise UpstreamError(
                    504, "timeout", f"upstream timed out: {exc}", endpoint=base, retry_after_s=1
                ) from exc
            except UpstreamDisconnected as exc:
                raise UpstreamError(
                    502, "api_error", f"upstream failed: {type(exc).__name__}: {exc}", endpoint=base, retry_after_s=1
                ) from exc
            gen.endpoint = base
            gen.first_byte_at = time.time()
            if resp.status >= 400:
                try:
                    raw = await resp.read()
                except (UpstreamTimeout, UpstreamDisconnected):
                    raw = b""
                finally:
                    resp.close()
                raise upstream_error_from_response(resp.status, raw, base)
            return resp
        raise UpstreamError(
            503,
            "overloaded",
            f"no upstream endpoint reachable ({last})",
            retry_after_s=2,
        ) from last

    async def post_json(
        self, path: str, body: dict[str, Any], route_key: str, gen: Generation, *, total_s: float | None = None
    ) -> dict[str, Any]:
        """`post_raw`'s reply parsed: a JSON object, or a retryable 502."""
        return json_object(await self.post_raw(path, body, route_key, gen, total_s=total_s), gen.endpoint)

    async def post_raw(
        self, path: str, body: dict[str, Any], route_key: str, gen: Generation, *, total_s: float | None = None
    ) -> bytes:
        """POST (as `post`) and read the whole 2xx reply."""
        resp = await self.post(path, body, route_key, gen, total_s=total_s)
        try:
            raw = await resp.read()
        except UpstreamTimeout as exc:
            raise UpstreamError(504, "timeout", "upstream timed out", endpoint=gen.endpoint, retry_after_s=1) from exc
        except UpstreamDisconnected as exc:
            raise UpstreamError(
                502, "api_error", f"upstream dropped the reply: {exc}", endpoint=gen.endpoint, retry_after_s=1
            ) from exc
        finally:
            resp.close()
        gen.finished_at = time.time()
        return raw

    async def get_json(self, path: str, *, total_s: float = 10.0) -> Any:
        """GET from the first reachable endpoint (used for `/v1/models`)."""
        last: BaseException | None = None
        for base in self.urls:
            resp: UpstreamResponse | None = None
            try:
                resp = await self.http.request(
                    "GET", self._target(base, path), connect_timeout=self.connect_timeout_s, total_timeout=total_s
                )
                raw = await resp.read()
            except UpstreamConnectError as exc:
                last = exc
                continue
            except (UpstreamTimeout, UpstreamDisconnected) as exc:
                raise UpstreamError(
                    502, "api_error", f"upstream failed: {exc}", endpoint=base, retry_after_s=1
                ) from exc
            finally:
                if resp is not None:
                    resp.close()
            if resp.status >= 400:
                raise upstream_error_from_response(resp.status, raw, base)
            try:
                return orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise UpstreamError(502, "api_error", "upstream sent invalid JSON", endpoint=base) from exc
        raise UpstreamError(503, "overloaded", f"no upstream endpoint reachable ({last})", retry_after_s=2)


def json_object(raw: bytes, endpoint: str | None) -> dict[str, Any]:
    """An upstream's reply as a JSON object; anything else is a retryable 502."""
    try:
        out = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UpstreamError(502, "api_error", "upstream sent invalid JSON", endpoint=endpoint) from exc
    if not isinstance(out, dict):
        raise UpstreamError(502, "api_error", "upstream sent a non-object reply", endpoint=endpoint)
    return out


def message_fields(msg: dict[str, Any]) -> dict[str, Any]:
    """`content`, `reasoning` and `tool_calls` of an OpenAI-Chat answer's `message` (vLLM and SGLang alike; vLLM
    renamed `reasoning_content` to `reasoning`)."""
    return {
        "content": msg.get("content") or "",
        "reasoning": msg.get("reasoning_content") or msg.get("reasoning") or None,
        "tool_calls": [
            ToolCall(
                id=tc.get("id") or f"call_{i}",
                name=tc["function"]["name"],
                arguments=tc["function"].get("arguments") or "",
            )
            for i, tc in enumerate(msg.get("tool_calls") or [])
        ],
    }


def with_usage(result: ChatResult, usage: dict[str, Any], gen: Generation) -> ChatResult:
    """The answer's usage on the result (and `gen`), checked against its token data."""
    gen.usage = usage
    result.prompt_tokens = usage.get("prompt_tokens", len(result.prompt_token_ids))
    result.completion_tokens = usage.get("completion_tokens", len(result.generation_token_ids))
    check_alignment(result, usage, gen.endpoint)
    return result


def check_alignment(result: ChatResult, usage: dict[str, Any], endpoint: str | None) -> None:
    """Token ids, logprobs and usage must agree, or the training data would be silently wrong."""
    n_gen, n_lp = len(result.generation_token_ids), len(result.generation_log_probs)
    problems = []
    if n_gen != n_lp:
        problems.append(f"{n_gen} generation token ids but {n_lp} logprobs")
    ct, pt = usage.get("completion_tokens"), usage.get("prompt_tokens")
    if isinstance(ct, int) and ct != n_gen:
        problems.append(f"usage.completion_tokens={ct} but {n_gen} generation token ids")
    if isinstance(pt, int) and pt != len(result.prompt_token_ids):
        problems.append(f"usage.prompt_tokens={pt} but {len(result.prompt_token_ids)} prompt token ids")
    if not result.prompt_token_ids:
        problems.append("no prompt token ids returned (is return_token_ids supported upstream?)")
    if problems:
        raise UpstreamError(
            502, "api_error", "token capture misaligned: " + "; ".join(problems), endpoint=endpoint, retry_after_s=1
        )
    check_token_data(result.prompt_token_ids, result.generation_token_ids, result.generation_log_probs, endpoint)


def _ids_ok_py(ids: Any) -> bool:
    """`_arrays.ids_ok` without the C module: a list or tuple of exact ints in [0, 2**31). Packing as unsigned 32-bit
    refuses everything else but bools and other `__index__` objects (found by their type) and ids in [2**31, 2**32)
    (found by the top bit of each packed id)."""
    if not isinstance(ids, (list, tuple)) or not {*map(type, ids)} <= {int}:
        return False
    try:
        packed = struct.pack(f"<{len(ids)}I", *ids)
    except struct.error:
        return False
    return packed[3::4].isascii()


try:  # the same decision in one pass in C (nemo_polar/_arrays.c); built with the package when a compiler is there
    from nemo_polar._arrays import ids_ok as _ids_ok
except ImportError:
    _ids_ok = _ids_ok_py


def check_token_data(
    prompt_ids: list[int] | TokenIds, gen_ids: list[int], log_probs: list[float], endpoint: str | None
) -> None:
    """Token ids are ints in [0, 2**31) and logprobs finite numbers, or the engine failed (never stored as data).

    The bound is the stored one: records keep ids as signed int32, so a larger id refused here is not a record that
    fails to encode later. A bool is refused too (as `CompletionRecord.validate` does): an engine that sends `true`
    for a token id sent no token id. Whole-list work in C, not a loop per token: `_ids_ok` walks the list once
    (`_arrays.c`), and one NaN or infinity makes the logprob sum non-finite.
    """
    problems = []
    for name, ids in (("prompt", prompt_ids), ("generation", gen_ids)):
        if ids and type(ids) is not TokenIds and not _ids_ok(ids):  # TokenIds hold token ids only
            problems.append(f"{name} token ids that are not non-negative integers")
    try:
        total = sum(log_probs)
        bad = isinstance(total, bool) or not isinstance(total, (int, float)) or not math.isfinite(total)
    except TypeError:
        bad = True
    if bad:
        problems.append("logprobs that are not finite numbers")
    if problems:
        raise UpstreamError(
            502, "api_error", "the engine returned " + " and ".join(problems), endpoint=endpoint, retry_after_s=1
        )
