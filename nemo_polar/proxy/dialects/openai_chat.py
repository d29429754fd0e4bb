# SPDX-License-Identifier: Apache-2.0
"""OpenAI Chat Completions dialect: `/v1/chat/completions`.

The normal form already is OpenAI Chat, so parsing is mostly validation plus canonicalisation: system and
developer messages merged into one leading system message, part-array contents (user AND tool messages, as Qwen
Code sends them) collapsed when all text, `reasoning_content` / `reasoning` on assistant messages kept as
`reasoning_content`, canonical tool-call ids and argument JSON, `max_completion_tokens` or `max_tokens`. Renders a
`ChatResult` back as a `chat.completion` body or `chat.completion.chunk` SSE ending with the usage chunk (empty
`choices`) when `stream_options.include_usage`, then `[DONE]`. Does no I/O; never renders token ids or logprobs.
"""

from __future__ import annotations

from typing import Any

from nemo_polar.proxy.dialects import _common as common
from nemo_polar.proxy.normalized import ChatRequest, ChatResult, ProviderError, RouteMatch, Sampling
from nemo_polar.types import Dialect

DIALECT = Dialect.OPENAI_CHAT
ROUTES: list[tuple[str, str, str]] = [("POST", "/v1/chat/completions", "chat_completions")]

# ------------------------------------------------------------------------------------------ parse request


def parse_request(body: bytes | dict[str, Any], route: RouteMatch) -> ChatRequest:
    d = common.load_body(body)
    model = common.req_str(d, "model", "model", nonempty=True)
    raw_messages = common.opt_list(d, "messages", "messages", required=True)
    assert raw_messages is not None
    if not raw_messages:
        common.bad("messages: at least one message is required", param="messages")
    extra: dict[str, Any] = {}
    ids = common.CallIds()
    system_texts: list[str] = []
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(raw_messages):
        msg = _message(m, f"messages[{i}]", ids)
        if msg["role"] == "system":
            system_texts.append(msg["content"])
        else:
            messages.append(msg)
    messages = common.with_system(system_texts, messages)
    common.check_conversation(messages, "messages")
    if ids.original:
        extra["tool_call_ids"] = dict(ids.original)
    tools = _tools(d.get("tools"))
    tool_choice = _tool_choice(d.get("tool_choice"), extra)
    stream = common.opt_bool(d, "stream", "stream") or False
    so = common.opt_dict(d, "stream_options", "stream_options")
    include_usage = bool(so and common.opt_bool(so, "include_usage", "stream_options.include_usage"))
    effort = common.opt_str(d, "reasoning_effort", "reasoning_effort")
    if effort is not None:
        extra["reasoning_effort"] = effort
    ptc = common.opt_bool(d, "parallel_tool_calls", "parallel_tool_calls")
    if ptc is not None:
        extra["parallel_tool_calls"] = ptc
    max_tokens = common.opt_int(d, "max_completion_tokens", "max_completion_tokens", lo=1, hi=common.MAX_TOKENS_LIMIT)
    legacy_max = common.opt_int(d, "max_tokens", "max_tokens", lo=1, hi=common.MAX_TOKENS_LIMIT)
    sampling = Sampling(
        max_tokens=max_tokens if max_tokens is not None else legacy_max,
        temperature=common.opt_num(d, "temperature", "temperature", lo=0.0, hi=2.0),
        top_p=common.opt_num(d, "top_p", "top_p", lo=0.0, hi=1.0),
        top_k=common.opt_int(d, "top_k", "top_k", lo=-1),
        seed=common.opt_int(d, "seed", "seed"),
        stop=common.str_list(d.get("stop"), "stop") or None,
        presence_penalty=common.opt_num(d, "presence_penalty", "presence_penalty", lo=-2.0, hi=2.0),
        frequency_penalty=common.opt_num(d, "frequency_penalty", "frequency_penalty", lo=-2.0, hi=2.0),
        n=common.opt_int(d, "n", "n", lo=1, hi=128),
        chat_template_kwargs=common.opt_dict(d, "chat_template_kwargs", "chat_template_kwargs"),
    )
    return ChatRequest(
        dialect=DIALECT.value,
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        response_format=_response_format(d.get("response_format")),
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        reasoning=None if effort is None else effort != "none",
        extra=extra,
    )


# -------------------------------------------------------------------------------------------- normalise


def _image(p: dict[str, Any], ppath: str) -> dict[str, Any]:
    img = p.get("image_url")
    if isinstance(img, str):
        img = {"url": img}
    img = common.as_dict(img, f"{ppath}.image_url")
    return common.image_part(
        common.req_str(img, "url", f"{ppath}.image_url.url", nonempty=True),
        common.opt_str(img, "detail", f"{ppath}.image_url.detail"),
    )


_TEXT = ("text",)
_IMAGE = ("image_url", _image)


def _parts(v: Any, path: str, *, allow_images: bool) -> str | list[dict[str, Any]]:
    """A message content: a string or a part array (collapsed to a string when all parts are text)."""
    return common.content_parts(v, path, _TEXT, _IMAGE if allow_images else None)


def _message(m: Any, path: str, ids: common.CallIds) -> dict[str, Any]:
    m = common.as_dict(m, path)
    role = m.get("role")
    if role in ("system", "developer"):
        content = _parts(m.get("content"), f"{path}.content", allow_images=False)
        assert isinstance(content, str)
        return {"role": "system", "content": content}
    if role == "user":
        return {"role": "user", "content": _parts(m.get("content"), f"{path}.content", allow_images=True)}
    if role == "assistant":
        return _assistant(m, path, ids)
    if role == "tool":
        tid = common.req_str(m, "tool_call_id", f"{path}.tool_call_id", nonempty=True)
        content = _parts(m.get("content"), f"{path}.content", allow_images=True)
        return common.tool_message(ids.result(tid), ids, content)
    common.bad(
        f"{path}.role: must be one of system, developer, user, assistant, tool; got {role!r}", param=f"{path}.role"
    )


def _assistant(m: dict[str, Any], path: str, ids: common.CallIds) -> dict[str, Any]:
    raw = m.get("content")
    content = "" if raw is None else _parts(raw, f"{path}.content", allow_images=False)
    reasoning = common.opt_str(m, "reasoning_content", f"{path}.reasoning_content")
    if reasoning is None:
        reasoning = common.opt_str(m, "reasoning", f"{path}.reasoning")
    calls: list[dict[str, Any]] = []
    for j, tc in enumerate(common.opt_list(m, "tool_calls", f"{path}.tool_calls") or []):
        tpath = f"{path}.tool_calls[{j}]"
        tc = common.as_dict(tc, tpath)
        if tc.get("type", "function") != "function":
            common.bad(f"{tpath}.type: only function tool calls are supported", param=f"{tpath}.type")
        tid = common.req_str(tc, "id", f"{tpath}.id", nonempty=True)
        fn = common.opt_dict(tc, "function", f"{tpath}.function", required=True)
        assert fn is not None
        name = common.check_tool_name(fn.get("name"), f"{tpath}.function.name")
        args = common.opt_str(fn, "arguments", f"{tpath}.function.arguments") or ""
        calls.append(
            common.tool_call_dict(ids.new_call(tid, name), name, common.canonical_arguments(args) if args else "{}")
        )
    return common.assistant_message(content, calls, reasoning)


def _tools(v: Any) -> list[dict[str, Any]]:
    return common.read_tools(v, _tool)


def _tool(t: dict[str, Any], path: str) -> list[dict[str, Any]]:
    if t.get("type") != "function":
        common.bad(f"{path}.type: only function tools are supported, got {t.get('type')!r}", param=f"{path}.type")
    fn = common.opt_dict(t, "function", f"{path}.function", required=True)
    assert fn is not None
    return [common.declared_tool(fn, f"{path}.function", "parameters")]


def tool_choice_mode(v: Any, objects: str) -> str | dict[str, Any] | None:
    """OpenAI's `tool_choice` (Chat and Responses): None, a string mode (checked), or the object form to read on."""
    if v is None or v in ("auto", "none", "required"):
        return v  # type: ignore[no-any-return]
    if isinstance(v, str):
        common.bad(f"tool_choice: must be auto, none, required or {objects}; got {v!r}", param="tool_choice")
    return common.as_dict(v, "tool_choice")


def _tool_choice(v: Any, extra: dict[str, Any]) -> Any:
    v = tool_choice_mode(v, "a function")
    if not isinstance(v, dict):
        return v
    kind = v.get("type")
    if kind == "function":
        fn = common.opt_dict(v, "function", "tool_choice.function", required=True)
        assert fn is not None
        return {
            "type": "function",
            "function": {"name": common.check_tool_name(fn.get("name"), "tool_choice.function.name")},
        }
    if kind == "allowed_tools":
        allowed = common.opt_dict(v, "allowed_tools", "tool_choice.allowed_tools", required=True)
        assert allowed is not None
        return common.allowed_tools(allowed, "tool_choice.allowed_tools", extra)
    common.bad(f"tool_choice.type: must be function or allowed_tools; got {kind!r}", param="tool_choice.type")


def _response_format(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    return common.output_format(common.as_dict(v, "response_format"), "response_format", "json_schema")


# ---------------------------------------------------------------------------------------- render response

_FINISH = {"stop", "length", "tool_calls", "content_filter"}


def finish_reason(result: ChatResult) -> str:
    if result.tool_calls and result.finish_reason in ("stop", "tool_calls"):
        return "tool_calls"
    return result.finish_reason if result.finish_reason in _FINISH else "stop"


def _usage(result: ChatResult) -> dict[str, Any]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def render_response(result: ChatResult, req: ChatRequest) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if (result.tool_calls and not result.content) else result.content,
    }
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        ids = common.UniqueIds("call_")
        message["tool_calls"] = [
            {"id": ids.take(t.id), "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in result.tool_calls
        ]
    return {
        "id": common.prefixed_id(result.response_id, "chatcmpl-"),
        "object": "chat.completion",
        "created": common.now_s(),
        "model": req.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(result)}],
        "usage": _usage(result),
    }


# ------------------------------------------------------------------------------------------ render stream


class StreamRenderer(common.StreamRendererBase):
    """`chat.completion.chunk` frames; the usage chunk (empty choices) before `[DONE]` when include_usage."""

    def __init__(self, req: ChatRequest, response_id: str):
        self.req = req
        self.id = common.prefixed_id(response_id, "chatcmpl-")
        self.created = common.now_s()
        self._started = False
        self._seen = common.Catchup()
        self._out_index: dict[int, int] = {}
        self._ids = common.UniqueIds("call_")

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.req.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.req.include_usage:
            chunk["usage"] = None
        return common.sse(chunk)

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def _text(self, kind: str, text: str) -> list[bytes]:
        if kind == "reasoning":
            self._seen.reasoning += text
            return [self._chunk({"reasoning_content": text})]
        self._seen.text += text
        return [self._chunk({"content": text})]

    def _call(self, index: int, cid: str, name: str) -> list[bytes]:
        if index in self._seen.calls:  # an engine re-announcing a call: already started
            return []
        self._seen.calls[index] = [cid, name, ""]
        # clients keep tool calls in a list indexed by `index`: number them 0, 1, … in order of appearance
        out = self._out_index.setdefault(index, len(self._out_index))
        tc = {"index": out, "id": self._ids.take(cid), "type": "function", "function": {"name": name, "arguments": ""}}
        return [self._chunk({"tool_calls": [tc]})]

    def _args(self, index: int, text: str) -> list[bytes]:
        if index not in self._seen.calls or not text:
            return []
        self._seen.calls[index][2] += text
        tc = {"index": self._out_index[index], "function": {"arguments": text}}
        return [self._chunk({"tool_calls": [tc]})]

    def finish(self, result: ChatResult) -> list[bytes]:
        """Catch up on what was not streamed, then the finish chunk, the usage chunk (if asked) and [DONE]."""
        frames = self._start()
        frames += self._catch_up_text(result)
        frames += self._catch_up_calls(result)
        frames.append(self._chunk({}, finish_reason(result)))
        if self.req.include_usage:
            usage = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.req.model,
                "choices": [],
                "usage": _usage(result),
            }
            frames.append(common.sse(usage))
        frames.append(b"data: [DONE]\n\n")
        return frames

    def error(self, err: ProviderError) -> list[bytes]:
        """A mid-stream failure: an error object as a data line (what OpenAI-compatible servers send)."""
        _, body, _ = render_error(err)
        return [common.sse(body)]


# ------------------------------------------------------------------------------------------------ errors

_ERRORS: dict[str, tuple[str, str | None]] = {
    "invalid_request": ("invalid_request_error", None),
    "context_length_exceeded": ("invalid_request_error", "context_length_exceeded"),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "permission": ("invalid_request_error", "permission_denied"),
    "not_found": ("invalid_request_error", "model_not_found"),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit": ("rate_limit_error", "rate_limit_exceeded"),
    "overloaded": ("server_error", "overloaded"),
    "timeout": ("server_error", "timeout"),
    "api_error": ("server_error", None),
}


def openai_error_body(err: ProviderError) -> dict[str, Any]:
    kind, code = _ERRORS.get(err.kind, ("server_error", None))
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": code}}


def render_error(err: ProviderError) -> tuple[int, dict[str, Any], dict[str, str]]:
    return err.status, openai_error_body(err), common.retry_headers(err)
