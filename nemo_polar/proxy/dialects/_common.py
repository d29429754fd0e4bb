# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the four dialect modules: validation, canonical normal form, SSE framing.

The canonical normal form is what makes one conversation written in any of the four dialects normalise to the
same OpenAI-Chat `messages` and `tools`:

- tool-call ids are replaced by `call_<n>`, n counting tool calls from the start of the conversation, so they are
  stable across turns (history is append-only) and independent of the provider's id scheme; results are paired
  through the same table;
- tool-call arguments are re-serialised with `json.dumps(obj, ensure_ascii=False)` (what a chat template's
  `tojson` renders anyway); text that is not a JSON object stays as it came;
- content part arrays whose parts are all text collapse to one string, parts joined by "\\n" (what vLLM does when
  it renders a part array for a string-content chat template); separate system / developer messages are joined
  by "\\n\\n";
- assistant messages always carry `content` (a string, "" when there is none); `tool_calls` and
  `reasoning_content` only when present; tool messages carry `tool_call_id`, `name` (when known) and `content`.

This module knows no provider; it does no I/O.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Container, Iterable
from typing import Any, NoReturn, TypeVar

import orjson

from nemo_polar.proxy.normalized import ChatResult, ProviderError, StreamEvent, ToolCall

EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
MAX_TOKENS_LIMIT = 2**31 - 1  # token counts beyond int32 are a client mistake, not an engine error

# ---------------------------------------------------------------------------------------------- validation


def bad(message: str, param: str | None = None) -> NoReturn:
    """Raise the 400 every malformed client request gets."""
    raise ProviderError(400, "invalid_request", message, param=param)


def load_body(body: bytes | bytearray | str | dict[str, Any]) -> dict[str, Any]:
    """Parse a request body into a JSON object (400 on malformed JSON or a non-object body)."""
    if isinstance(body, dict):
        return body
    if isinstance(body, bytes | bytearray | str):
        if not body or (isinstance(body, bytes | bytearray) and not bytes(body).strip()):
            bad("the request body is empty; a JSON object is required")
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            bad(f"the request body is not valid JSON: {exc}")
        if not isinstance(obj, dict):
            bad(f"the request body must be a JSON object, got {json_type(obj)}")
        return obj
    bad(f"the request body must be a JSON object, got {type(body).__name__}")


def json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


_T = TypeVar("_T")


def _missing(path: str) -> NoReturn:
    bad(f"{path}: field required", param=path)


def _wrong(path: str, want: str, v: Any) -> NoReturn:
    bad(f"{path}: expected {want}, got {json_type(v)}", param=path)


def opt_str(d: dict[str, Any], key: str, path: str, *, required: bool = False) -> str | None:
    return _typed(d, key, path, required, str, "a string")


def _typed(d: dict[str, Any], key: str, path: str, required: bool, cls: type[_T], want: str) -> _T | None:
    """`d[key]` when it is a `cls` (`want` names the JSON type in the 400), None when absent or null (a 400 when
    `required`)."""
    v = d.get(key)
    if v is None:
        if required:
            _missing(path)
        return None
    if not isinstance(v, cls):
        _wrong(path, want, v)
    return v


def req_str(d: dict[str, Any], key: str, path: str, *, nonempty: bool = False) -> str:
    v = opt_str(d, key, path, required=True)
    assert v is not None
    if nonempty and not v:
        bad(f"{path}: must not be empty", param=path)
    return v


def opt_bool(d: dict[str, Any], key: str, path: str) -> bool | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, bool):
        _wrong(path, "a boolean", v)
    return v


def _check_range(path: str, value: float, lo: float | None, hi: float | None, given: Any) -> None:
    """A 400 when `value` is below `lo` or above `hi` (the message shows the value as the client sent it)."""
    if lo is not None and value < lo:
        bad(f"{path}: must be >= {lo}, got {given}", param=path)
    if hi is not None and value > hi:
        bad(f"{path}: must be <= {hi}, got {given}", param=path)


def opt_int(d: dict[str, Any], key: str, path: str, *, lo: int | None = None, hi: int | None = None) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer() and math.isfinite(v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        _wrong(path, "an integer", v)
    if not -(2**63) <= v < 2**63:
        bad(f"{path}: {v} is out of the 64-bit integer range", param=path)
    _check_range(path, v, lo, hi, v)
    return v


def opt_num(
    d: dict[str, Any], key: str, path: str, *, lo: float | None = None, hi: float | None = None
) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        _wrong(path, "a number", v)
    f = float(v)
    if not math.isfinite(f):
        bad(f"{path}: must be a finite number", param=path)
    _check_range(path, f, lo, hi, v)
    return f


def opt_list(d: dict[str, Any], key: str, path: str, *, required: bool = False) -> list[Any] | None:
    return _typed(d, key, path, required, list, "an array")


def opt_dict(d: dict[str, Any], key: str, path: str, *, required: bool = False) -> dict[str, Any] | None:
    return _typed(d, key, path, required, dict, "an object")


def as_dict(v: Any, path: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        _wrong(path, "an object", v)
    return v


def str_list(v: Any, path: str) -> list[str]:
    """A `stop`-like field: a string or an array of strings (null → [])."""
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        _wrong(path, "a string or an array of strings", v)
    return list(v)


def schema_dict(v: Any, path: str) -> dict[str, Any]:
    """A tool's JSON schema (absent → an empty object schema)."""
    if v is None:
        return dict(EMPTY_SCHEMA)
    if not isinstance(v, dict):
        _wrong(path, "a JSON schema object", v)
    return v


# ------------------------------------------------------------------------------------------ normal form


_ENCODE = json.JSONEncoder(ensure_ascii=False).encode
_CANONICAL: dict[bytes | str, str] = {}  # a session resends its whole history every turn: memoise
_CANONICAL_BUDGET = 32 * 2**20  # characters kept (keys + values); the memo is cleared when it is exceeded
_canonical_size = 0


def canonical_arguments(v: Any) -> str:
    """Arguments as canonical JSON text: objects re-serialised, other text kept as produced."""
    global _canonical_size
    try:
        key: bytes | str = v if isinstance(v, str) else orjson.dumps(v)
    except (TypeError, orjson.JSONEncodeError):
        key = ""
    if key and (hit := _CANONICAL.get(key)) is not None:
        return hit
    out = _canonical(v)
    if key:
        size = len(key) + len(out)
        if _canonical_size + size > _CANONICAL_BUDGET:
            _CANONICAL.clear()
            _canonical_size = 0
        if size <= _CANONICAL_BUDGET // 64:
            _CANONICAL[key] = out
            _canonical_size += size
    return out


def _canonical(v: Any) -> str:
    if isinstance(v, str):
        try:
            parsed = json.loads(v)
        except (ValueError, RecursionError):
            return v
        if not isinstance(parsed, dict):
            return v
        v = parsed
    try:
        return _ENCODE(v)
    except (TypeError, ValueError, RecursionError):
        bad("tool-call arguments are not JSON-serialisable")


def arguments_object(text: str) -> dict[str, Any]:
    """Arguments text → object for providers whose tool calls carry an object (invalid JSON → {})."""
    if not text:
        return {}
    try:
        v = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return v if isinstance(v, dict) else {}


def collapse_parts(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """OpenAI content parts → one string when all are text, else the part array."""
    if all(p.get("type") == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def image_part(url: str, detail: str | None = None) -> dict[str, Any]:
    img: dict[str, Any] = {"url": url}
    if detail is not None:
        img["detail"] = detail
    return {"type": "image_url", "image_url": img}


ImageReader = Callable[[dict[str, Any], str], dict[str, Any]]


def content_parts(
    v: Any, path: str, text_kinds: Container[str], image: tuple[str, ImageReader] | None
) -> str | list[dict[str, Any]]:
    """A message content that is a string or an array of parts, as OpenAI content: the `text_kinds` parts and
    `refusal` become text parts, the dialect's image part (`image`: its type and a reader of it) an image part, any
    other part a 400; collapsed to one string when all parts are text."""
    if isinstance(v, str):
        return v
    if not isinstance(v, list):
        bad(f"{path}: expected a string or an array of content parts", param=path)
    parts: list[dict[str, Any]] = []
    for k, p in enumerate(v):
        if type(p) is dict and p.get("type") in text_kinds and type(p.get("text")) is str:  # fast path
            parts.append(text_part(p["text"]))
            continue
        ppath = f"{path}[{k}]"
        p = as_dict(p, ppath)
        kind = p.get("type")
        if kind in text_kinds:
            parts.append(text_part(req_str(p, "text", f"{ppath}.text")))
        elif kind == "refusal":
            parts.append(text_part(req_str(p, "refusal", f"{ppath}.refusal")))
        elif image is not None and kind == image[0]:
            parts.append(image[1](p, ppath))
        else:
            bad(f"{ppath}.type: unsupported content part type {kind!r}", param=f"{ppath}.type")
    return collapse_parts(parts)


def function_tool(name: str, description: str | None, parameters: dict[str, Any]) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if description:
        fn["description"] = description
    fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def check_unique_tools(tools: list[dict[str, Any]], path: str) -> None:
    seen: set[str] = set()
    for t in tools:
        name = t["function"]["name"]
        if name in seen:
            bad(f"{path}: tool names must be unique; {name!r} appears twice", param=path)
        seen.add(name)


def check_tool_name(name: Any, path: str) -> str:
    if not isinstance(name, str):
        _wrong(path, "a string", name)
    if not name or len(name) > 256:
        bad(f"{path}: a tool name must be 1 to 256 characters", param=path)
    return name


def read_tools(
    v: Any, read: Callable[[dict[str, Any], str], Iterable[dict[str, Any]]], path: str = "tools"
) -> list[dict[str, Any]]:
    """A request's tools array: null is none; each entry must be an object, which `read(entry, its path)` turns
    into its function tools (none: the entry is dropped), entry by entry; the names must be unique."""
    if v is None:
        return []
    if not isinstance(v, list):
        bad(f"{path}: expected an array", param=path)
    tools: list[dict[str, Any]] = []
    for i, t in enumerate(v):
        tpath = f"{path}[{i}]"
        tools.extend(read(as_dict(t, tpath), tpath))
    check_unique_tools(tools, path)
    return tools


def tool_header(t: dict[str, Any], path: str) -> tuple[str, str | None]:
    """A declared tool's `name` (checked) and optional `description`."""
    return check_tool_name(t.get("name"), f"{path}.name"), opt_str(t, "description", f"{path}.description")


def declared_tool(t: dict[str, Any], path: str, schema_key: str) -> dict[str, Any]:
    """A function tool declared as `name`, `description` and a JSON schema under `schema_key` (Anthropic's
    `input_schema`, OpenAI Chat's `function.parameters`)."""
    name, desc = tool_header(t, path)
    return function_tool(name, desc, schema_dict(t.get(schema_key), f"{path}.{schema_key}"))


def allowed_tools(spec: dict[str, Any], path: str, extra: dict[str, Any]) -> str:
    """An OpenAI `allowed_tools` choice (at `path`): its tools kept in `extra`, its mode (auto | required)
    returned as the tool choice."""
    mode = spec.get("mode", "auto")
    if mode not in ("auto", "required"):
        bad(f"{path}.mode: must be auto or required", param=f"{path}.mode")
    extra["allowed_tools"] = spec.get("tools")
    return mode


def output_format(fmt: dict[str, Any], path: str, schema_at: str | None = None) -> dict[str, Any] | None:
    """An OpenAI structured-output format (at `path`; a `json_schema`'s fields under `schema_at`, or beside `type`)
    as Chat's `response_format`: None for plain text."""
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        js: dict[str, Any] | None = fmt
        if schema_at is not None:
            path = f"{path}.{schema_at}"
            js = opt_dict(fmt, schema_at, path, required=True)
        assert js is not None
        out: dict[str, Any] = {"name": req_str(js, "name", f"{path}.name", nonempty=True)}
        out["schema"] = schema_dict(js.get("schema"), f"{path}.schema")
        strict = opt_bool(js, "strict", f"{path}.strict")
        if strict is not None:
            out["strict"] = strict
        return {"type": "json_schema", "json_schema": out}
    bad(f"{path}.type: must be text, json_object or json_schema; got {kind!r}", param=f"{path}.type")


class CallIds:
    """Maps provider tool-call ids to canonical `call_<n>` ids, in conversation order."""

    def __init__(self) -> None:
        self.by_original: dict[str, str] = {}
        self.names: dict[str, str] = {}  # canonical id → tool name
        self.original: dict[str, str] = {}  # canonical id → provider id
        self._n = 0

    def new_call(self, original: str | None, name: str) -> str:
        cid = f"call_{self._n}"
        self._n += 1
        if original:
            self.by_original[original] = cid
            self.original[cid] = original
        self.names[cid] = name
        return cid

    def result(self, original: str | None) -> str:
        """The canonical id a tool result refers to (an unknown id gets a fresh one)."""
        if original and original in self.by_original:
            return self.by_original[original]
        return self.new_call(original, "")


def tool_message(cid: str, ids: CallIds, content: str | list[dict[str, Any]]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "tool", "tool_call_id": cid}
    name = ids.names.get(cid)
    if name:
        msg["name"] = name
    msg["content"] = content
    return msg


def assistant_message(
    content: str | list[dict[str, Any]], tool_calls: list[dict[str, Any]], reasoning: str | None
) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


def tool_call_dict(cid: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def with_system(system_texts: list[str], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prepend the merged system message (separate system / developer texts joined by a blank line)."""
    texts = [t for t in system_texts if t]
    if not texts:
        return messages
    return [{"role": "system", "content": "\n\n".join(texts)}, *messages]


def check_conversation(messages: list[dict[str, Any]], path: str) -> None:
    if not any(m["role"] != "system" for m in messages):
        bad(f"{path}: at least one non-system message is required", param=path)


# --------------------------------------------------------------------------------------------- rendering


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def prefixed_id(raw: str, prefix: str) -> str:
    """A response id in the provider's scheme (an engine id gets the prefix, a missing one is generated)."""
    if not raw:
        return new_id(prefix)
    return raw if raw.startswith(prefix) else prefix + raw


class UniqueIds:
    """Tool-call ids for one reply: an engine id as given, a fresh `<prefix>…` id when it is empty or repeated."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.used: set[str] = set()

    def take(self, raw: str) -> str:
        cid = raw if raw and raw not in self.used else new_id(self.prefix)
        self.used.add(cid)
        return cid


def now_s() -> int:
    return int(time.time())


def has_tool_calls(result: ChatResult) -> bool:
    return bool(result.tool_calls)


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def sse(data: Any, event: str | None = None) -> bytes:
    """One SSE frame (`event:` line only when named)."""
    payload = data if isinstance(data, bytes) else orjson.dumps(data)
    if event is None:
        return b"data: " + payload + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"


def retry_headers(err: ProviderError) -> dict[str, str]:
    if err.retry_after_s is None:
        return {}
    return {"retry-after": str(max(0, math.ceil(err.retry_after_s)))}


class Catchup:
    """Tracks what a stream has sent so `finish(result)` can emit what the engine never streamed.

    A renderer fed no events at all (a replayed or forced answer) thereby renders the whole `result` at finish.
    """

    def __init__(self) -> None:
        self.text = ""
        self.reasoning = ""
        self.calls: dict[int, list[str]] = {}  # index → [id, name, arguments so far]

    def missing_text(self, full: str) -> str:
        return full[len(self.text) :] if full.startswith(self.text) else ""

    def missing_reasoning(self, full: str | None) -> str:
        full = full or ""
        return full[len(self.reasoning) :] if full.startswith(self.reasoning) else ""

    def missing_calls(self, result: ChatResult) -> list[tuple[int, ToolCall, str]]:
        """(index, call, arguments not yet sent) for every call of `result`."""
        out: list[tuple[int, ToolCall, str]] = []
        for i, tc in enumerate(result.tool_calls):
            sent = self.calls.get(i)
            rest = tc.arguments
            if sent is not None and tc.arguments.startswith(sent[2]):
                rest = tc.arguments[len(sent[2]) :]
            elif sent is not None:
                rest = ""
            out.append((i, tc, rest))
        return out


class StreamRendererBase:
    """What the four dialects' `StreamRenderer`s share: `feed` routes each `StreamEvent` kind to the dialect's
    hooks after the stream's opening frames (`_start`), and `finish` catches up through the same hooks.

    A dialect sets `_seen` (a `Catchup`), names its text and reasoning blocks (`_TEXT`, `_REASONING`: what its
    `_text(kind, text)` is handed), and renders `_call` (a tool call starts), `_args` (a piece of its arguments, if
    it streams them), `finish` and `error`. The hooks record what they send in `_seen`.
    """

    _TEXT = "text"
    _REASONING = "reasoning"
    _seen: Catchup

    def _start(self) -> list[bytes]:
        """The stream's opening frames, the first time only (none unless the dialect has some)."""
        return []

    def _text(self, kind: str, text: str) -> list[bytes]:
        raise NotImplementedError

    def _call(self, index: int, call_id: str, name: str) -> list[bytes]:
        raise NotImplementedError

    def _args(self, index: int, text: str) -> list[bytes]:
        """A piece of a started call's arguments; by default kept for `finish`, nothing sent (the call goes out
        whole at the end)."""
        if index in self._seen.calls:
            self._seen.calls[index][2] += text
        return []

    def feed(self, ev: StreamEvent) -> list[bytes]:
        frames = self._start()
        if ev.kind == "text" and ev.text:
            frames += self._text(self._TEXT, ev.text)
        elif ev.kind == "reasoning" and ev.text:
            frames += self._text(self._REASONING, ev.text)
        elif ev.kind == "tool_call":
            frames += self._call(ev.index, ev.id or "", ev.name or "")
        elif ev.kind == "tool_args":
            frames += self._args(ev.index, ev.text)
        return frames

    def _catch_up_text(self, result: ChatResult) -> list[bytes]:
        """The reasoning, then the text, of `result` that the stream has not carried."""
        frames: list[bytes] = []
        if rest := self._seen.missing_reasoning(result.reasoning):
            frames += self._text(self._REASONING, rest)
        if rest := self._seen.missing_text(result.content):
            frames += self._text(self._TEXT, rest)
        return frames

    def _catch_up_calls(self, result: ChatResult) -> list[bytes]:
        """The tool calls of `result` the stream has not started, and the arguments it has not carried."""
        frames: list[bytes] = []
        for i, tc, rest in self._seen.missing_calls(result):
            if i not in self._seen.calls:
                frames += self._call(i, tc.id, tc.name)
            frames += self._args(i, rest)
        return frames
