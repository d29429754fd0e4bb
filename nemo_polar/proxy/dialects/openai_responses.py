# SPDX-License-Identifier: Apache-2.0
"""OpenAI Responses dialect (Codex): `/v1/responses`.

Parses a stateless Responses request (`store: false`, the full history resent as `input` items) into the
OpenAI-Chat `ChatRequest`: `instructions` and developer/system messages merged into one system message; message
items with input_text/output_text parts; reasoning items → `reasoning_content` of the assistant turn they open;
function_call / function_call_output and custom_tool_call(_output) items → tool calls / tool messages with
canonical ids. Tools: `function`; `namespace` (inner tools flattened to `<namespace>__<name>`, mapped back on the
way out); `custom` (freeform: a function with one string argument `input`, rendered back as `custom_tool_call`);
hosted tools such as `web_search` are dropped (listed in `extra["dropped_tools"]`); `additional_tools` input items
add tools. Renders a `ChatResult` as a `response` object or the Responses SSE sequence (created, in_progress,
output_item.added, content_part.added, output_text.delta/.done, function_call_arguments.delta/.done,
output_item.done, completed with usage, each with `sequence_number`). Input items and tools are normalised in
`_responses_input`. Does no I/O; never renders token ids.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_polar.proxy.dialects import _common as common
from nemo_polar.proxy.dialects._responses_input import HOSTED_TOOLS, InputItems, ToolSet, flat_name
from nemo_polar.proxy.dialects.openai_chat import openai_error_body, tool_choice_mode
from nemo_polar.proxy.normalized import ChatRequest, ChatResult, ProviderError, RouteMatch, Sampling
from nemo_polar.types import Dialect

DIALECT = Dialect.OPENAI_RESPONSES
ROUTES: list[tuple[str, str, str]] = [("POST", "/v1/responses", "responses")]

# ------------------------------------------------------------------------------------------ parse request


def parse_request(body: bytes | dict[str, Any], route: RouteMatch) -> ChatRequest:
    d = common.load_body(body)
    model = common.req_str(d, "model", "model", nonempty=True)
    if d.get("previous_response_id") is not None:
        common.bad(
            "previous_response_id is not supported: send the whole history in input", param="previous_response_id"
        )
    extra: dict[str, Any] = {}
    tools = ToolSet(extra)
    tools.add(d.get("tools"), "tools")
    system_texts: list[str] = []
    instructions = common.opt_str(d, "instructions", "instructions")
    if instructions:
        system_texts.append(instructions)
    inp = d.get("input")
    if isinstance(inp, str):
        items: list[Any] = [{"role": "user", "content": inp}]
    elif isinstance(inp, list):
        items = inp
    elif inp is None:
        common.bad("input: field required", param="input")
    else:
        common.bad("input: expected a string or an array of items", param="input")
    ids = common.CallIds()
    messages = InputItems(ids, tools, system_texts, extra).run(items)
    messages = common.with_system(system_texts, messages)
    common.check_conversation(messages, "input")
    if ids.original:
        extra["tool_call_ids"] = dict(ids.original)
    common.check_unique_tools(tools.tools, "tools")
    if tools.map:
        extra["tool_map"] = tools.map
    tool_choice = _tool_choice(d.get("tool_choice"), extra)
    reasoning = _reasoning(d, extra)
    _side_fields(d, extra)
    sampling = Sampling(
        max_tokens=common.opt_int(d, "max_output_tokens", "max_output_tokens", lo=1, hi=common.MAX_TOKENS_LIMIT),
        temperature=common.opt_num(d, "temperature", "temperature", lo=0.0, hi=2.0),
        top_p=common.opt_num(d, "top_p", "top_p", lo=0.0, hi=1.0),
    )
    return ChatRequest(
        dialect=DIALECT.value,
        model=model,
        messages=messages,
        tools=tools.tools,
        tool_choice=tool_choice,
        response_format=_text_format(d.get("text")),
        sampling=sampling,
        stream=common.opt_bool(d, "stream", "stream") or False,
        include_usage=True,
        reasoning=reasoning,
        extra=extra,
    )


def _side_fields(d: dict[str, Any], extra: dict[str, Any]) -> None:
    """Validate the fields that do not change the prompt; keep what rendering or the record needs."""
    include = common.opt_list(d, "include", "include")
    if include is not None:
        extra["include"] = include
    for key in ("prompt_cache_key", "service_tier", "user", "truncation"):
        common.opt_str(d, key, key)
    for key in ("metadata", "client_metadata"):
        common.opt_dict(d, key, key)
    common.opt_bool(d, "store", "store")
    ptc = common.opt_bool(d, "parallel_tool_calls", "parallel_tool_calls")
    if ptc is not None:
        extra["parallel_tool_calls"] = ptc


def _tool_choice(v: Any, extra: dict[str, Any]) -> Any:
    v = tool_choice_mode(v, "an object")
    if not isinstance(v, dict):
        return v
    kind = v.get("type")
    if kind in ("function", "custom"):
        name = common.check_tool_name(v.get("name"), "tool_choice.name")
        ns = common.opt_str(v, "namespace", "tool_choice.namespace")
        return {"type": "function", "function": {"name": flat_name(ns, name) if ns else name}}
    if kind == "allowed_tools":
        return common.allowed_tools(v, "tool_choice", extra)
    if isinstance(kind, str) and (kind in HOSTED_TOOLS or kind.startswith("web_search")):
        return "auto"
    common.bad(f"tool_choice.type: unsupported tool choice {kind!r}", param="tool_choice.type")


def _reasoning(d: dict[str, Any], extra: dict[str, Any]) -> bool | None:
    r = common.opt_dict(d, "reasoning", "reasoning")
    if r is None:
        return None
    effort = common.opt_str(r, "effort", "reasoning.effort")
    common.opt_str(r, "summary", "reasoning.summary")
    extra["reasoning"] = r
    return None if effort is None else effort != "none"


def _text_format(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    fmt = common.opt_dict(common.as_dict(v, "text"), "format", "text.format")
    return None if fmt is None else common.output_format(fmt, "text.format")


# ---------------------------------------------------------------------------------------- render response


# our finish reasons that leave a response incomplete → its incomplete_details.reason (any other: completed)
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _status(result: ChatResult) -> tuple[str, dict[str, Any] | None]:
    reason = _INCOMPLETE.get(result.finish_reason)
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


def _usage(result: ChatResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def _reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [{"type": "summary_text", "text": text}] if text else [],
        "content": [{"type": "reasoning_text", "text": text}] if text else [],
        "status": status,
    }


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status != "in_progress"
        else [],
    }


def _call_item(req: ChatRequest, item_id: str, call_id: str, flat: str, arguments: str, status: str) -> dict[str, Any]:
    """A function_call, or a custom_tool_call for a custom tool; namespaced names are split back."""
    entry = req.extra.get("tool_map", {}).get(flat)
    cid = call_id
    if entry is not None and entry["kind"] == "custom":
        parsed = None
        if status == "completed":
            try:
                parsed = json.loads(arguments) if arguments else {}
            except ValueError:
                parsed = None
        inp = parsed.get("input") if isinstance(parsed, dict) and isinstance(parsed.get("input"), str) else None
        if inp is None:
            inp = arguments if status == "completed" else ""
        item: dict[str, Any] = {"type": "custom_tool_call", "id": item_id, "call_id": cid, "name": entry["name"]}
        item["input"] = inp
        item["status"] = status
        if "namespace" in entry:
            item["namespace"] = entry["namespace"]
        return item
    item = {"type": "function_call", "id": item_id, "call_id": cid, "name": flat, "arguments": arguments}
    if entry is not None and "namespace" in entry:
        item["name"] = entry["name"]
        item["namespace"] = entry["namespace"]
    item["status"] = status
    return item


def _response(req: ChatRequest, rid: str, created: int, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "model": req.model,
        "output": output,
        "parallel_tool_calls": req.extra.get("parallel_tool_calls", True),
        "temperature": req.sampling.temperature,
        "tool_choice": "auto",
        "tools": [],
        "top_p": req.sampling.top_p,
        "max_output_tokens": req.sampling.max_tokens,
        "store": False,
        "usage": None,
    }


def render_response(result: ChatResult, req: ChatRequest) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if result.reasoning:
        output.append(_reasoning_item(common.new_id("rs_"), result.reasoning))
    if result.content or not result.tool_calls:
        output.append(_message_item(common.new_id("msg_"), result.content))
    ids = common.UniqueIds("call_")
    for tc in result.tool_calls:
        output.append(_call_item(req, common.new_id("fc_"), ids.take(tc.id), tc.name, tc.arguments, "completed"))
    status, incomplete = _status(result)
    body = _response(req, common.prefixed_id(result.response_id, "resp_"), common.now_s(), status, output)
    body["incomplete_details"] = incomplete
    body["usage"] = _usage(result)
    return body


# ------------------------------------------------------------------------------------------ render stream


class StreamRenderer(common.StreamRendererBase):
    """Responses SSE for one streaming reply.

    Reasoning and message items open one at a time and close when another kind starts; tool-call items stay open
    until `finish` (so interleaved argument deltas still land on their item). Custom tool calls are buffered and
    rendered whole at `finish` (their freeform input only exists once the argument JSON is complete).
    """

    _TEXT = "message"

    def __init__(self, req: ChatRequest, response_id: str):
        self.req = req
        self.id = common.prefixed_id(response_id, "resp_")
        self.created = common.now_s()
        self._seq = 0
        self._started = False
        self._output: list[dict[str, Any] | None] = []
        self._open: tuple[str, int, str] | None = None  # (kind, output_index, accumulated text)
        self._calls: dict[int, tuple[int, str, str]] = {}  # tool index → (output_index, item id, call id)
        self._seen = common.Catchup()
        self._ids = common.UniqueIds("call_")

    def _ev(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return common.sse(data, kind)

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        resp = _response(self.req, self.id, self.created, "in_progress", [])
        return [self._ev("response.created", response=resp), self._ev("response.in_progress", response=resp)]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        kind, idx, text = self._open
        self._open = None
        item = self._output[idx]
        assert item is not None
        iid = item["id"]
        if kind == "reasoning":
            part: dict[str, Any] = {"type": "summary_text", "text": text}
            item = _reasoning_item(iid, text)
            frames = [
                self._ev(
                    "response.reasoning_summary_text.done", item_id=iid, output_index=idx, summary_index=0, text=text
                ),
                self._ev(
                    "response.reasoning_summary_part.done", item_id=iid, output_index=idx, summary_index=0, part=part
                ),
            ]
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item = _message_item(iid, text)
            frames = [
                self._ev(
                    "response.output_text.done", item_id=iid, output_index=idx, content_index=0, text=text, logprobs=[]
                ),
                self._ev("response.content_part.done", item_id=iid, output_index=idx, content_index=0, part=part),
            ]
        self._output[idx] = item
        frames.append(self._ev("response.output_item.done", output_index=idx, item=item))
        return frames

    def _open_text_item(self, kind: str) -> list[bytes]:
        """Close the open item and open a reasoning or message item with its first (empty) part."""
        frames = self._close()
        idx = len(self._output)
        if kind == "reasoning":
            item = _reasoning_item(common.new_id("rs_"), "", "in_progress")
            event, index_key = "response.reasoning_summary_part.added", "summary_index"
            part: dict[str, Any] = {"type": "summary_text", "text": ""}
        else:
            item = _message_item(common.new_id("msg_"), "", "in_progress")
            event, index_key = "response.content_part.added", "content_index"
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._output.append(item)
        frames.append(self._ev("response.output_item.added", output_index=idx, item=item))
        frames.append(self._ev(event, item_id=item["id"], output_index=idx, part=part, **{index_key: 0}))
        self._open = (kind, idx, "")
        return frames

    def _text(self, kind: str, text: str) -> list[bytes]:
        frames: list[bytes] = []
        if self._open is None or self._open[0] != kind:
            frames += self._open_text_item(kind)
        assert self._open is not None
        _, idx, acc = self._open
        self._open = (kind, idx, acc + text)
        item = self._output[idx]
        assert item is not None
        if not text:
            return frames
        if kind == "reasoning":
            self._seen.reasoning += text
            event, fields = "response.reasoning_summary_text.delta", {"summary_index": 0, "delta": text}
        else:
            self._seen.text += text
            event, fields = "response.output_text.delta", {"content_index": 0, "delta": text, "logprobs": []}
        frames.append(self._ev(event, item_id=item["id"], output_index=idx, **fields))
        return frames

    def _is_custom(self, name: str) -> bool:
        entry = self.req.extra.get("tool_map", {}).get(name)
        return entry is not None and entry["kind"] == "custom"

    def _call(self, index: int, call_id: str, name: str) -> list[bytes]:
        frames = self._close()
        idx = len(self._output)
        if index in self._calls:  # an engine re-announcing a call: already started
            return frames
        cid = self._ids.take(call_id)
        iid = common.new_id("ctc_" if self._is_custom(name) else "fc_")
        self._calls[index] = (idx, iid, cid)
        self._seen.calls[index] = [call_id, name, ""]
        item = _call_item(self.req, iid, cid, name, "", "in_progress")
        self._output.append(item)
        frames.append(self._ev("response.output_item.added", output_index=idx, item=item))
        return frames

    def _args(self, index: int, text: str) -> list[bytes]:
        if index not in self._calls or not text:
            return []
        self._seen.calls[index][2] += text
        if self._is_custom(self._seen.calls[index][1]):
            return []
        idx, iid, _ = self._calls[index]
        return [self._ev("response.function_call_arguments.delta", item_id=iid, output_index=idx, delta=text)]

    def _close_call(self, index: int) -> list[bytes]:
        idx, iid, cid = self._calls[index]
        _, name, args = self._seen.calls[index]
        item = _call_item(self.req, iid, cid, name, args, "completed")
        self._output[idx] = item
        if item["type"] == "custom_tool_call":
            inp = item["input"]
            frames = [
                self._ev("response.custom_tool_call_input.delta", item_id=iid, output_index=idx, delta=inp),
                self._ev("response.custom_tool_call_input.done", item_id=iid, output_index=idx, input=inp),
            ]
        else:
            frames = [
                self._ev(
                    "response.function_call_arguments.done",
                    item_id=iid,
                    output_index=idx,
                    name=item["name"],
                    arguments=args,
                )
            ]
        frames.append(self._ev("response.output_item.done", output_index=idx, item=item))
        return frames

    def finish(self, result: ChatResult) -> list[bytes]:
        """Catch up on what was not streamed, close every item, then `response.completed` with usage."""
        frames = self._start()
        frames += self._catch_up_text(result)
        if not self._output and not result.tool_calls:
            frames += self._text("message", "")
        frames += self._catch_up_calls(result)
        frames += self._close()
        for index in sorted(self._calls, key=lambda k: self._calls[k][0]):
            frames += self._close_call(index)
        status, incomplete = _status(result)
        resp = _response(self.req, self.id, self.created, status, [o for o in self._output if o is not None])
        resp["incomplete_details"] = incomplete
        resp["usage"] = _usage(result)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        frames.append(self._ev(kind, response=resp))
        return frames

    def error(self, err: ProviderError) -> list[bytes]:
        """A mid-stream failure as `response.failed` (Codex retries on it)."""
        frames = self._start()
        resp = _response(self.req, self.id, self.created, "failed", [o for o in self._output if o is not None])
        code = {"rate_limit": "rate_limit_exceeded", "invalid_request": "invalid_prompt"}.get(err.kind, "server_error")
        resp["error"] = {"code": code, "message": err.message}
        frames.append(self._ev("response.failed", response=resp))
        return frames


# ------------------------------------------------------------------------------------------------ errors


def render_error(err: ProviderError) -> tuple[int, dict[str, Any], dict[str, str]]:
    return err.status, openai_error_body(err), common.retry_headers(err)
