# SPDX-License-Identifier: Apache-2.0
"""Anthropic Messages dialect: `/v1/messages` (also `?beta=true`) and `/v1/messages/count_tokens`.

Parses a Messages request into the OpenAI-Chat `ChatRequest` (system blocks merged, `cache_control` dropped,
Claude Code's per-request `x-anthropic-billing-header:` block removed, thinking blocks → `reasoning_content`,
tool_use / tool_result blocks → tool calls / tool messages with canonical ids) and renders a `ChatResult` back as a
Messages body or the Messages SSE sequence (message_start, ping, content_block_start/delta/stop, message_delta,
message_stop). Does no I/O, knows no engine; token ids and logprobs never appear in what it renders.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from nemo_polar.proxy.dialects import _common as common
from nemo_polar.proxy.normalized import ChatRequest, ChatResult, ProviderError, RouteMatch, Sampling
from nemo_polar.types import Dialect

DIALECT = Dialect.ANTHROPIC_MESSAGES
ROUTES: list[tuple[str, str, str]] = [
    ("POST", "/v1/messages", "messages"),
    ("POST", "/v1/messages/count_tokens", "count_tokens"),
]

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
# Opaque signature put on the thinking blocks we render; clients send it back and we ignore it.
THINKING_SIGNATURE = "cG9sYXItcmVhc29uaW5n"

# ------------------------------------------------------------------------------------------ parse request


def parse_request(body: bytes | dict[str, Any], route: RouteMatch) -> ChatRequest:
    d = common.load_body(body)
    model = common.req_str(d, "model", "model", nonempty=True)
    counting = route.name == "count_tokens"
    max_tokens = common.opt_int(d, "max_tokens", "max_tokens", lo=1, hi=common.MAX_TOKENS_LIMIT)
    if max_tokens is None and not counting:
        common.bad("max_tokens: field required", param="max_tokens")
    raw_messages = common.opt_list(d, "messages", "messages", required=True)
    assert raw_messages is not None
    if not raw_messages:
        common.bad("messages: at least one message is required", param="messages")
    extra: dict[str, Any] = {}
    system_texts = _system(d.get("system"), extra)
    ids = common.CallIds()
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(raw_messages):
        messages.extend(_message(m, f"messages[{i}]", ids, extra))
    # Claude Code (2.1.197) also sends `system` messages inside `messages`; merged, in order, after `system`
    system_texts += [m["content"] for m in messages if m["role"] == "system"]
    messages = common.with_system(system_texts, [m for m in messages if m["role"] != "system"])
    common.check_conversation(messages, "messages")
    if ids.original:
        extra["tool_call_ids"] = dict(ids.original)
    tools = _tools(d.get("tools"), extra)
    tool_choice = _tool_choice(d.get("tool_choice"), extra)
    reasoning = _thinking(d, extra)
    metadata = common.opt_dict(d, "metadata", "metadata")
    if metadata is not None:
        common.opt_str(metadata, "user_id", "metadata.user_id")
    stream = common.opt_bool(d, "stream", "stream") or False
    if raw_messages and isinstance(raw_messages[-1], dict) and raw_messages[-1].get("role") == "assistant":
        extra["prefill"] = True
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=common.opt_num(d, "temperature", "temperature", lo=0.0, hi=1.0),
        top_p=common.opt_num(d, "top_p", "top_p", lo=0.0, hi=1.0),
        top_k=common.opt_int(d, "top_k", "top_k", lo=0),
        stop=common.str_list(d.get("stop_sequences"), "stop_sequences") or None,
    )
    return ChatRequest(
        dialect=DIALECT.value,
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        sampling=sampling,
        stream=stream,
        include_usage=True,
        reasoning=reasoning,
        extra=extra,
    )


def _is_billing_header(text: str) -> bool:
    return text[: len(BILLING_HEADER_PREFIX) + 64].lstrip().startswith(BILLING_HEADER_PREFIX)


def _system(v: Any, extra: dict[str, Any], where: str = "system") -> list[str]:
    """System prompt (string or text blocks) → texts; the billing-header block is removed."""
    if v is None:
        return []
    if isinstance(v, str):
        if _is_billing_header(v):  # its first line
            extra["billing_header_removed"] = True
            v = v.split("\n", 1)[1] if "\n" in v else ""
        return [v] if v else []
    if not isinstance(v, list):
        common.bad(f"{where}: expected a string or an array of text blocks", param=where)
    texts: list[str] = []
    for i, b in enumerate(v):
        path = f"{where}[{i}]"
        b = common.as_dict(b, path)
        if b.get("type") != "text":
            common.bad(f"{path}.type: system blocks must be text blocks", param=path)
        text = common.req_str(b, "text", f"{path}.text")
        if _is_billing_header(text):
            extra["billing_header_removed"] = True
            continue
        texts.append(text)
    return ["\n".join(texts)] if texts else []


# -------------------------------------------------------------------------------------------- normalise


def _blocks(m: dict[str, Any], path: str) -> list[dict[str, Any]]:
    content = m.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        common.bad(f"{path}.content: expected a string or an array of content blocks", param=f"{path}.content")
    if all(type(b) is dict for b in content):  # the common case, without building error paths
        return content
    return [common.as_dict(b, f"{path}.content[{j}]") for j, b in enumerate(content)]


def _message(m: Any, path: str, ids: common.CallIds, extra: dict[str, Any]) -> list[dict[str, Any]]:
    m = common.as_dict(m, path)
    role = m.get("role")
    if role not in ("user", "assistant", "system"):
        common.bad(f"{path}.role: must be 'user', 'assistant' or 'system', got {role!r}", param=f"{path}.role")
    if role == "system":
        if m.get("content") is None:
            common.bad(f"{path}.content: field required", param=f"{path}.content")
        texts = _system(m.get("content"), extra, f"{path}.content")
        return [{"role": "system", "content": texts[0] if texts else ""}]
    blocks = _blocks(m, path)
    if role == "assistant":
        return [_assistant(blocks, path, ids, extra)]
    return _user(blocks, path, ids, extra)


def _image(b: dict[str, Any], path: str) -> dict[str, Any]:
    src = common.opt_dict(b, "source", f"{path}.source", required=True)
    assert src is not None
    kind = src.get("type")
    if kind == "base64":
        media = common.req_str(src, "media_type", f"{path}.source.media_type", nonempty=True)
        data = common.req_str(src, "data", f"{path}.source.data")
        return common.image_part(f"data:{media};base64,{data}")
    if kind == "url":
        return common.image_part(common.req_str(src, "url", f"{path}.source.url", nonempty=True))
    common.bad(f"{path}.source.type: unsupported image source {kind!r}", param=f"{path}.source.type")


def _user_part(b: dict[str, Any], path: str) -> dict[str, Any]:
    kind = b.get("type")
    if kind == "text":
        return common.text_part(common.req_str(b, "text", f"{path}.text"))
    if kind == "image":
        return _image(b, path)
    if kind == "document":
        src = common.opt_dict(b, "source", f"{path}.source", required=True)
        assert src is not None
        if src.get("type") == "text":
            return common.text_part(common.req_str(src, "data", f"{path}.source.data"))
        common.bad(f"{path}.source.type: only text documents are supported", param=f"{path}.source.type")
    common.bad(f"{path}.type: unsupported content block type {kind!r}", param=f"{path}.type")


def _tool_result_content(b: dict[str, Any], path: str) -> str | list[dict[str, Any]]:
    c = b.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if not isinstance(c, list):
        common.bad(f"{path}.content: expected a string or an array of blocks", param=f"{path}.content")
    parts = [_user_part(common.as_dict(p, f"{path}.content[{k}]"), f"{path}.content[{k}]") for k, p in enumerate(c)]
    return common.collapse_parts(parts)


def _other_blocks(
    blocks: list[dict[str, Any]], path: str, parts: list[dict[str, Any]]
) -> Iterator[tuple[Any, dict[str, Any], str]]:
    """A turn's content blocks: a plain text block (the fast path) goes straight into `parts` as a text part; every
    other block is yielded with its type and path, for the caller to validate."""
    for j, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "text" and type(b.get("text")) is str:
            parts.append(common.text_part(b["text"]))
            continue
        yield kind, b, f"{path}.content[{j}]"


def _user(blocks: list[dict[str, Any]], path: str, ids: common.CallIds, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Tool results become tool messages (first, in order); the other blocks one user message after them."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for kind, b, bpath in _other_blocks(blocks, path, parts):
        if kind == "tool_result":
            tid = common.req_str(b, "tool_use_id", f"{bpath}.tool_use_id", nonempty=True)
            cid = ids.result(tid)
            if common.opt_bool(b, "is_error", f"{bpath}.is_error"):
                extra.setdefault("tool_errors", []).append(cid)
            out.append(common.tool_message(cid, ids, _tool_result_content(b, bpath)))
        else:
            parts.append(_user_part(b, bpath))
    if parts or not out:
        out.append({"role": "user", "content": common.collapse_parts(parts)})
    return out


def _assistant(blocks: list[dict[str, Any]], path: str, ids: common.CallIds, extra: dict[str, Any]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for kind, b, bpath in _other_blocks(blocks, path, parts):
        if kind == "text":
            parts.append(common.text_part(common.req_str(b, "text", f"{bpath}.text")))
        elif kind == "thinking":
            reasoning.append(common.req_str(b, "thinking", f"{bpath}.thinking"))
            common.opt_str(b, "signature", f"{bpath}.signature")
        elif kind == "redacted_thinking":
            extra["redacted_thinking"] = extra.get("redacted_thinking", 0) + 1
        elif kind == "tool_use":
            tid = common.req_str(b, "id", f"{bpath}.id", nonempty=True)
            name = common.check_tool_name(b.get("name"), f"{bpath}.name")
            inp = common.opt_dict(b, "input", f"{bpath}.input", required=True)
            calls.append(common.tool_call_dict(ids.new_call(tid, name), name, common.canonical_arguments(inp)))
        elif kind in ("server_tool_use", "web_search_tool_result"):
            extra.setdefault("dropped_blocks", []).append(kind)
        else:
            common.bad(f"{bpath}.type: unsupported assistant content block type {kind!r}", param=f"{bpath}.type")
    content = common.collapse_parts(parts)
    return common.assistant_message(content, calls, "\n".join(reasoning) if reasoning else None)


def _tools(v: Any, extra: dict[str, Any]) -> list[dict[str, Any]]:
    def read(t: dict[str, Any], path: str) -> list[dict[str, Any]]:
        kind = t.get("type")
        if kind in (None, "custom"):
            return [common.declared_tool(t, path, "input_schema")]
        if not isinstance(kind, str):
            common.bad(f"{path}.type: expected a string", param=f"{path}.type")
        extra.setdefault("dropped_tools", []).append(kind)  # server tools (web search, …)
        return []

    return common.read_tools(v, read)


def _tool_choice(v: Any, extra: dict[str, Any]) -> Any:
    if v is None:
        return None
    v = common.as_dict(v, "tool_choice")
    kind = v.get("type")
    if common.opt_bool(v, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use"):
        extra["parallel_tool_calls"] = False
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        name = common.check_tool_name(v.get("name"), "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    common.bad(f"tool_choice.type: must be one of auto, any, tool, none; got {kind!r}", param="tool_choice.type")


def _thinking(d: dict[str, Any], extra: dict[str, Any]) -> bool | None:
    t = common.opt_dict(d, "thinking", "thinking")
    oc = common.opt_dict(d, "output_config", "output_config")
    if oc is not None:
        extra["output_config"] = oc
    if t is None:
        return None
    kind = t.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        common.bad(f"thinking.type: must be enabled, disabled or adaptive; got {kind!r}", param="thinking.type")
    common.opt_int(t, "budget_tokens", "thinking.budget_tokens", lo=0, hi=common.MAX_TOKENS_LIMIT)
    extra["thinking"] = t
    return kind != "disabled"


# ---------------------------------------------------------------------------------------- render response


def tool_use_id(raw: str, ids: common.UniqueIds) -> str:
    return ids.take(common.prefixed_id(raw, "toolu_") if raw else "")


# our finish reason → Messages' stop_reason (any other: end_turn; any tool call: tool_use)
_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"}


def stop_reason(result: ChatResult) -> str:
    return "tool_use" if result.tool_calls else _STOP_REASONS.get(result.finish_reason, "end_turn")


def _usage(result: ChatResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "output_tokens": result.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def render_response(result: ChatResult, req: ChatRequest) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if result.reasoning:
        content.append({"type": "thinking", "thinking": result.reasoning, "signature": THINKING_SIGNATURE})
    if result.content or not result.tool_calls:
        content.append({"type": "text", "text": result.content})
    ids = common.UniqueIds("toolu_")
    for tc in result.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": tool_use_id(tc.id, ids),
                "name": tc.name,
                "input": common.arguments_object(tc.arguments),
            }
        )
    return {
        "id": common.prefixed_id(result.response_id, "msg_"),
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": content,
        "stop_reason": stop_reason(result),
        "stop_sequence": None,
        "usage": _usage(result),
    }


# ------------------------------------------------------------------------------------------ render stream


class StreamRenderer(common.StreamRendererBase):
    """Messages SSE for one streaming reply: thinking and text blocks stream live, one open at a time; tool_use
    blocks follow whole at `finish`."""

    _REASONING = "thinking"

    def __init__(self, req: ChatRequest, response_id: str):
        self.req = req
        self.id = common.prefixed_id(response_id, "msg_")
        self._started = False
        self._next_block = 0
        self._open: tuple[str, int] | None = None  # (kind, block index)
        self._seen = common.Catchup()
        self._ids = common.UniqueIds("toolu_")

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.req.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [
            common.sse({"type": "message_start", "message": message}, "message_start"),
            common.sse({"type": "ping"}, "ping"),
        ]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        kind, idx = self._open
        self._open = None
        frames = []
        if kind == "thinking":
            delta = {"type": "signature_delta", "signature": THINKING_SIGNATURE}
            frames.append(
                common.sse({"type": "content_block_delta", "index": idx, "delta": delta}, "content_block_delta")
            )
        frames.append(common.sse({"type": "content_block_stop", "index": idx}, "content_block_stop"))
        return frames

    def _open_block(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        frames = self._close()
        idx = self._next_block
        self._next_block += 1
        self._open = (kind, idx)
        frames.append(
            common.sse({"type": "content_block_start", "index": idx, "content_block": block}, "content_block_start")
        )
        return frames

    def _delta(self, idx: int, delta: dict[str, Any]) -> bytes:
        return common.sse({"type": "content_block_delta", "index": idx, "delta": delta}, "content_block_delta")

    def _text(self, kind: str, text: str) -> list[bytes]:
        frames: list[bytes] = []
        if self._open is None or self._open[0] != kind:
            block = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            frames += self._open_block(kind, block)
        assert self._open is not None
        if kind == "thinking":
            self._seen.reasoning += text
            frames.append(self._delta(self._open[1], {"type": "thinking_delta", "thinking": text}))
        else:
            self._seen.text += text
            frames.append(self._delta(self._open[1], {"type": "text_delta", "text": text}))
        return frames

    def _tool_block(self, call_id: str, name: str, arguments: str) -> list[bytes]:
        """One whole tool_use block; its input goes out as one input_json_delta of canonical object JSON."""
        block = {"type": "tool_use", "id": tool_use_id(call_id, self._ids), "name": name, "input": {}}
        frames = self._open_block("tool_use", block)
        obj = common.arguments_object(arguments)
        if obj:
            delta = {"type": "input_json_delta", "partial_json": json.dumps(obj, ensure_ascii=False)}
            frames.append(self._delta(self._next_block - 1, delta))
        return frames

    def _call(self, index: int, call_id: str, name: str) -> list[bytes]:
        """A tool call starts: the open block closes; the call is kept for `finish` (tool_use blocks go out whole)."""
        frames = self._close()
        self._seen.calls.setdefault(index, [call_id, name, ""])
        return frames

    def finish(self, result: ChatResult) -> list[bytes]:
        """Emit what `result` holds that was not streamed, then the tool_use blocks, message_delta, message_stop.

        Tool calls go out whole at the end, from `result` (the engine's parsed calls; the streamed pieces only when
        `result` has none): a model's malformed argument JSON then becomes `{}` exactly as in `render_response`,
        instead of a partial_json stream no client can parse.
        """
        frames = self._start()
        frames += self._catch_up_text(result)
        calls = [(t.id, t.name, t.arguments) for t in result.tool_calls]
        if not calls:
            calls = [(c[0], c[1], c[2]) for _, c in sorted(self._seen.calls.items())]
        for call_id, name, arguments in calls:
            frames += self._tool_block(call_id, name, arguments)
        if self._next_block == 0:
            frames += self._open_block("text", {"type": "text", "text": ""})
        frames += self._close()
        delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason(result), "stop_sequence": None}}
        delta["usage"] = _usage(result)
        frames.append(common.sse(delta, "message_delta"))
        frames.append(common.sse({"type": "message_stop"}, "message_stop"))
        return frames

    def error(self, err: ProviderError) -> list[bytes]:
        """A mid-stream failure as Anthropic's `error` event (the stream ends after it)."""
        _, body, _ = render_error(err)
        return [common.sse(body, "error")]


# ------------------------------------------------------------------------------------------------ errors

_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "context_length_exceeded": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "request_too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "overloaded": "overloaded_error",
    "timeout": "timeout_error",
    "api_error": "api_error",
}


def render_error(err: ProviderError) -> tuple[int, dict[str, Any], dict[str, str]]:
    body = {"type": "error", "error": {"type": _ERROR_TYPES.get(err.kind, "api_error"), "message": err.message}}
    return err.status, body, common.retry_headers(err)


def count_tokens_response(n: int) -> dict[str, Any]:
    return {"input_tokens": n}
