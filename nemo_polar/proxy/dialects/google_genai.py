# SPDX-License-Identifier: Apache-2.0
"""Google Generative Language dialect: `/v1beta/models/{model}:generateContent`, `:streamGenerateContent`
(`?alt=sse`, or a streamed JSON array without it) and `:countTokens`.

Parses a GenerateContent request into the OpenAI-Chat `ChatRequest`: `systemInstruction` → the system message;
`contents` with role user/model; text parts (`thought: true` → `reasoning_content`; a model turn's parts are
concatenated as generated, a user turn's joined like any part array), inline/file data → image parts;
`functionCall` / `functionResponse` parts → tool calls / tool messages with canonical ids (calls and responses
without `id`, as Pi sends them, are paired by name and position within the turn); `thoughtSignature`s kept in
`extra`; tools from `functionDeclarations` (`parametersJsonSchema`, or OpenAPI-style `parameters` with its upper-case
types lowered); `toolConfig.functionCallingConfig` modes; `generationConfig` sampling, `responseMimeType` +
`responseJsonSchema`/`responseSchema` (upper-case types lowered in both: Gemini CLI's router sends them) →
`response_format`. Field names are accepted in camelCase and snake_case (both are valid proto JSON). Renders a
`ChatResult` as a GenerateContentResponse body or its SSE chunks, the last carrying `finishReason` and
`usageMetadata`. Does no I/O; never renders token ids or logprobs.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

from nemo_polar.proxy.dialects import _common as common
from nemo_polar.proxy.normalized import ChatRequest, ChatResult, ProviderError, RouteMatch, Sampling
from nemo_polar.types import Dialect

DIALECT = Dialect.GOOGLE_GENAI
# Gemini CLI's fetch gives up on any response whose headers take 60 s, non-streamed calls too: a slow plain call gets
# its headers early, like a slow stream (proxy/streaming.py, `reply_plain`)
EARLY_PLAIN_HEADERS = True
# ... and on a body that stays idle for 300 s after them: until the answer, a newline each `stream_headers_after_s`
# keeps it alive (JSON and the SDK's SSE parser, `^\s*data: `, both skip leading whitespace)
EARLY_KEEPALIVE = b"\n"
ROUTES: list[tuple[str, str, str]] = [
    ("POST", "/v1beta/models/{model}:generateContent", "generate_content"),
    ("POST", "/v1beta/models/{model}:streamGenerateContent", "stream_generate_content"),
    ("POST", "/v1beta/models/{model}:countTokens", "count_tokens"),
]
# The SDKs default to v1beta; google-genai's `api_version` may also be v1 or v1alpha: all three serve the same routes.
_PATH = re.compile(
    r"^/(?:v1beta|v1alpha|v1)/models/(?P<model>[^/:]+):(?P<verb>generateContent|streamGenerateContent|countTokens)$"
)
_VERB_ROUTES = {pattern.rsplit(":", 1)[1]: name for _, pattern, name in ROUTES}


def match_path(path: str) -> tuple[str, dict[str, str]] | None:
    """The route name and path params of a templated route (`ROUTES` with `{model}`, any API version)."""
    m = _PATH.match(path)
    if m is None:
        return None
    return _VERB_ROUTES[m.group("verb")], {"model": unquote(m.group("model")), "method": m.group("verb")}


_SNAKE = re.compile(r"_([a-z0-9])")


def _camel(d: dict[str, Any]) -> dict[str, Any]:
    """Shallow snake_case → camelCase of a proto-JSON object's keys (values are left alone)."""
    if "_" not in "".join(d):
        return d
    return {(_SNAKE.sub(lambda m: m.group(1).upper(), k) if "_" in k else k): v for k, v in d.items()}


def _obj(v: Any, path: str) -> dict[str, Any]:
    return _camel(common.as_dict(v, path))


# ------------------------------------------------------------------------------------------ parse request


def parse_request(body: bytes | dict[str, Any], route: RouteMatch) -> ChatRequest:
    d = _camel(common.load_body(body))
    model = route.params.get("model", "").removeprefix("models/")
    if not model:
        common.bad("the model name is missing from the request path", param="model")
    if route.name == "count_tokens" and d.get("generateContentRequest") is not None:
        d = _obj(d["generateContentRequest"], "generateContentRequest")
    raw_contents = common.opt_list(d, "contents", "contents", required=True)
    assert raw_contents is not None
    if not raw_contents:
        common.bad("contents: at least one content is required", param="contents")
    extra: dict[str, Any] = {}
    system_texts = _system(d.get("systemInstruction"))
    ids = common.CallIds()
    conv = _Contents(ids, extra)
    for i, c in enumerate(raw_contents):
        conv.content(_obj(c, f"contents[{i}]"), f"contents[{i}]", i)
    messages = common.with_system(system_texts, conv.out)
    common.check_conversation(messages, "contents")
    if ids.original:
        extra["tool_call_ids"] = dict(ids.original)
    tools = _tools(d.get("tools"), extra)
    tool_choice = _tool_config(d.get("toolConfig"))
    gc = _camel(common.opt_dict(d, "generationConfig", "generationConfig") or {})
    reasoning = _thinking(gc, extra)
    common.opt_list(d, "safetySettings", "safetySettings")
    common.opt_str(d, "cachedContent", "cachedContent")
    streaming = route.name == "stream_generate_content"
    if streaming:
        extra["stream_format"] = "sse" if route.query.get("alt") == "sse" else "json_array"
    sampling = Sampling(
        max_tokens=common.opt_int(
            gc, "maxOutputTokens", "generationConfig.maxOutputTokens", lo=1, hi=common.MAX_TOKENS_LIMIT
        ),
        temperature=common.opt_num(gc, "temperature", "generationConfig.temperature", lo=0.0, hi=2.0),
        top_p=common.opt_num(gc, "topP", "generationConfig.topP", lo=0.0, hi=1.0),
        top_k=common.opt_int(gc, "topK", "generationConfig.topK", lo=0),
        seed=common.opt_int(gc, "seed", "generationConfig.seed"),
        stop=common.str_list(gc.get("stopSequences"), "generationConfig.stopSequences") or None,
        presence_penalty=common.opt_num(gc, "presencePenalty", "generationConfig.presencePenalty", lo=-2.0, hi=2.0),
        frequency_penalty=common.opt_num(gc, "frequencyPenalty", "generationConfig.frequencyPenalty", lo=-2.0, hi=2.0),
        n=common.opt_int(gc, "candidateCount", "generationConfig.candidateCount", lo=1, hi=8),
    )
    return ChatRequest(
        dialect=DIALECT.value,
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        response_format=_response_format(gc),
        sampling=sampling,
        stream=streaming,
        include_usage=True,
        reasoning=reasoning,
        extra=extra,
    )


def _system(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    c = _obj(v, "systemInstruction")
    parts = common.opt_list(c, "parts", "systemInstruction.parts") or []
    texts = [
        common.req_str(_obj(p, f"systemInstruction.parts[{k}]"), "text", f"systemInstruction.parts[{k}].text")
        for k, p in enumerate(parts)
    ]
    return ["\n".join(texts)] if texts else []


def lower_types(schema: Any, path: str = "schema") -> Any:
    """OpenAPI-style Gemini schema (`type: "OBJECT"`) → JSON schema (`type: "object"`), recursively."""
    try:
        return _lower(schema)
    except RecursionError:
        common.bad(f"{path}: nested too deeply", param=path)


def _lower(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else _lower(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_lower(v) for v in schema]
    return schema


# -------------------------------------------------------------------------------------------- normalise


class _Contents:
    """Converts `contents`; remembers the last model turn's calls to pair responses that carry no id."""

    def __init__(self, ids: common.CallIds, extra: dict[str, Any]):
        self.ids = ids
        self.extra = extra
        self.out: list[dict[str, Any]] = []
        self._open_calls: list[tuple[str, str]] = []  # (canonical id, name) not yet answered

    def content(self, c: dict[str, Any], path: str, index: int) -> None:
        role = c.get("role", "user")
        parts = common.opt_list(c, "parts", f"{path}.parts", required=True)
        assert parts is not None
        if not parts:
            common.bad(f"{path}.parts: must not be empty", param=f"{path}.parts")
        if all(type(p) is dict for p in parts):  # the common case, without building error paths
            objs = [_camel(p) for p in parts]
        else:
            objs = [_obj(p, f"{path}.parts[{j}]") for j, p in enumerate(parts)]
        for j, p in enumerate(objs):
            if "thoughtSignature" not in p:
                continue
            sig = common.opt_str(p, "thoughtSignature", f"{path}.parts[{j}].thoughtSignature")
            if sig:
                self.extra.setdefault("thought_signatures", []).append({"content": index, "part": j, "signature": sig})
        if role == "model":
            self._model(objs, path)
        elif role in ("user", "function"):
            self._user(objs, path)
        else:
            common.bad(f"{path}.role: must be 'user' or 'model', got {role!r}", param=f"{path}.role")

    def _model(self, parts: list[dict[str, Any]], path: str) -> None:
        # A streamed turn comes back as many parts (Gemini CLI merges adjacent text parts but keeps every thought
        # chunk as its own part): the model's output is their concatenation, so they are joined with "".
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        self._open_calls = []
        for j, p in enumerate(parts):
            ppath = f"{path}.parts[{j}]"
            if "text" in p:
                text = common.req_str(p, "text", f"{ppath}.text")
                if common.opt_bool(p, "thought", f"{ppath}.thought"):
                    reasoning.append(text)
                else:
                    texts.append(text)
            elif "functionCall" in p:
                fc = _obj(p["functionCall"], f"{ppath}.functionCall")
                name = common.check_tool_name(fc.get("name"), f"{ppath}.functionCall.name")
                args = common.opt_dict(fc, "args", f"{ppath}.functionCall.args") or {}
                cid = self.ids.new_call(common.opt_str(fc, "id", f"{ppath}.functionCall.id") or None, name)
                self._open_calls.append((cid, name))
                calls.append(common.tool_call_dict(cid, name, common.canonical_arguments(args)))
            elif "executableCode" in p or "codeExecutionResult" in p:
                self.extra.setdefault("dropped_parts", []).append(next(iter(p)))
            elif set(p) <= {"thoughtSignature", "thought"}:
                continue
            else:
                common.bad(f"{ppath}: unsupported part in a model content (keys {sorted(p)})", param=ppath)
        self.out.append(common.assistant_message("".join(texts), calls, "".join(reasoning) if reasoning else None))

    def _pair(self, rid: str | None, name: str) -> str:
        """The canonical id a functionResponse answers: by id, else the first open call with its name."""
        if rid and rid in self.ids.by_original:
            cid = self.ids.by_original[rid]
        else:
            match = next((c for c, n in self._open_calls if n == name), None)
            if match is None:
                match = self.ids.new_call(rid, name)
            cid = match
        self._open_calls = [(c, n) for c, n in self._open_calls if c != cid]
        return cid

    def _user(self, parts: list[dict[str, Any]], path: str) -> None:
        tool_msgs: list[dict[str, Any]] = []
        user_parts: list[dict[str, Any]] = []
        for j, p in enumerate(parts):
            ppath = f"{path}.parts[{j}]"
            if "functionResponse" in p:
                fr = _obj(p["functionResponse"], f"{ppath}.functionResponse")
                name = common.check_tool_name(fr.get("name"), f"{ppath}.functionResponse.name")
                resp = common.opt_dict(fr, "response", f"{ppath}.functionResponse.response", required=True)
                assert resp is not None
                cid = self._pair(common.opt_str(fr, "id", f"{ppath}.functionResponse.id") or None, name)
                if set(resp) == {"error"}:
                    self.extra.setdefault("tool_errors", []).append(cid)
                tool_msgs.append(common.tool_message(cid, self.ids, _response_text(resp)))
            elif "text" in p:
                user_parts.append(common.text_part(common.req_str(p, "text", f"{ppath}.text")))
            elif "inlineData" in p:
                blob = _obj(p["inlineData"], f"{ppath}.inlineData")
                mime = common.req_str(blob, "mimeType", f"{ppath}.inlineData.mimeType", nonempty=True)
                if not mime.startswith("image/"):
                    common.bad(f"{ppath}.inlineData.mimeType: only images are supported, got {mime!r}", param=ppath)
                user_parts.append(
                    common.image_part(f"data:{mime};base64,{common.req_str(blob, 'data', f'{ppath}.inlineData.data')}")
                )
            elif "fileData" in p:
                fd = _obj(p["fileData"], f"{ppath}.fileData")
                user_parts.append(
                    common.image_part(common.req_str(fd, "fileUri", f"{ppath}.fileData.fileUri", nonempty=True))
                )
            elif set(p) <= {"thoughtSignature", "thought"}:
                continue
            else:
                common.bad(f"{ppath}: unsupported part in a user content (keys {sorted(p)})", param=ppath)
        self.out.extend(tool_msgs)
        if user_parts or not tool_msgs:
            self.out.append({"role": "user", "content": common.collapse_parts(user_parts)})


def _response_text(resp: dict[str, Any]) -> str:
    """A functionResponse's `response` as tool-message text: the bare string of `{output}` / `{error}`, else JSON."""
    if len(resp) == 1:
        ((key, value),) = resp.items()
        if key in ("output", "error", "result", "content") and isinstance(value, str):
            return value
    return json.dumps(resp, ensure_ascii=False)


def _tools(v: Any, extra: dict[str, Any]) -> list[dict[str, Any]]:
    def read(t: dict[str, Any], path: str) -> list[dict[str, Any]]:
        t = _camel(t)
        for key in t:
            if key != "functionDeclarations":
                extra.setdefault("dropped_tools", []).append(key)
        out = []
        for j, fd in enumerate(common.opt_list(t, "functionDeclarations", f"{path}.functionDeclarations") or []):
            fpath = f"{path}.functionDeclarations[{j}]"
            fd = _obj(fd, fpath)
            name, desc = common.tool_header(fd, fpath)
            if fd.get("parametersJsonSchema") is not None:
                params = common.schema_dict(fd["parametersJsonSchema"], f"{fpath}.parametersJsonSchema")
            else:
                params = lower_types(common.schema_dict(fd.get("parameters"), f"{fpath}.parameters"))
            out.append(common.function_tool(name, desc, params))
        return out

    return common.read_tools(v, read)


def _tool_config(v: Any) -> Any:
    if v is None:
        return None
    fcc = common.opt_dict(_obj(v, "toolConfig"), "functionCallingConfig", "toolConfig.functionCallingConfig")
    if fcc is None:
        return None
    fcc = _camel(fcc)
    path = "toolConfig.functionCallingConfig"
    mode = common.opt_str(fcc, "mode", f"{path}.mode") or "AUTO"
    allowed = common.str_list(fcc.get("allowedFunctionNames"), f"{path}.allowedFunctionNames")
    mode = mode.upper()
    if mode in ("AUTO", "MODE_UNSPECIFIED", "VALIDATED"):
        return "auto"
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        if len(allowed) == 1:
            return {"type": "function", "function": {"name": allowed[0]}}
        return "required"
    common.bad(f"{path}.mode: must be AUTO, ANY, NONE or VALIDATED; got {mode!r}", param=f"{path}.mode")


def _thinking(gc: dict[str, Any], extra: dict[str, Any]) -> bool | None:
    tc = common.opt_dict(gc, "thinkingConfig", "generationConfig.thinkingConfig")
    if tc is None:
        return None
    tc = _camel(tc)
    budget = common.opt_int(tc, "thinkingBudget", "generationConfig.thinkingConfig.thinkingBudget", lo=-1)
    common.opt_bool(tc, "includeThoughts", "generationConfig.thinkingConfig.includeThoughts")
    common.opt_str(tc, "thinkingLevel", "generationConfig.thinkingConfig.thinkingLevel")
    extra["thinking_config"] = tc
    return None if budget is None else budget != 0


def _response_format(gc: dict[str, Any]) -> dict[str, Any] | None:
    mime = common.opt_str(gc, "responseMimeType", "generationConfig.responseMimeType")
    if gc.get("responseJsonSchema") is not None:
        schema = lower_types(common.schema_dict(gc["responseJsonSchema"], "generationConfig.responseJsonSchema"))
    elif gc.get("responseSchema") is not None:
        schema = lower_types(common.schema_dict(gc["responseSchema"], "generationConfig.responseSchema"))
    else:
        return {"type": "json_object"} if mime == "application/json" else None
    if mime is not None and mime != "application/json":
        common.bad(
            "generationConfig.responseMimeType: a response schema needs application/json", param="responseMimeType"
        )
    return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}


# ---------------------------------------------------------------------------------------- render response


# our finish reason → GenerateContent's finishReason (any other: STOP)
_FINISH_REASONS = {"length": "MAX_TOKENS", "content_filter": "SAFETY"}


def finish_reason(result: ChatResult) -> str:
    return _FINISH_REASONS.get(result.finish_reason, "STOP")


def _usage(result: ChatResult) -> dict[str, Any]:
    return {
        "promptTokenCount": result.prompt_tokens,
        "candidatesTokenCount": result.completion_tokens,
        "totalTokenCount": result.prompt_tokens + result.completion_tokens,
    }


def _call_part(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    fc: dict[str, Any] = {"name": name, "args": common.arguments_object(arguments)}
    if call_id:
        fc["id"] = call_id
    return {"functionCall": fc}


def _chunk(parts: list[dict[str, Any]], req: ChatRequest, rid: str, final: ChatResult | None) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    body: dict[str, Any] = {"candidates": [cand]}
    if final is not None:
        cand["finishReason"] = finish_reason(final)
        body["usageMetadata"] = _usage(final)
    body["modelVersion"] = req.model
    body["responseId"] = rid
    return body


def render_response(result: ChatResult, req: ChatRequest) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if result.reasoning:
        parts.append({"text": result.reasoning, "thought": True})
    if result.content:
        parts.append({"text": result.content})
    ids = common.UniqueIds("call_")
    parts.extend(_call_part(ids.take(t.id), t.name, t.arguments) for t in result.tool_calls)
    if not parts:
        parts.append({"text": ""})
    return _chunk(parts, req, result.response_id or common.new_id(""), result)


# ------------------------------------------------------------------------------------------ render stream


class StreamRenderer(common.StreamRendererBase):
    """GenerateContentResponse chunks: `data:` lines (alt=sse) or the elements of a streamed JSON array.

    Text and thoughts go out as they come; a function call goes out whole once its arguments are complete (the
    next call starts, or finish), as Gemini sends them. The last chunk carries `finishReason` and `usageMetadata`.
    """

    def __init__(self, req: ChatRequest, response_id: str):
        self.req = req
        self.id = response_id or common.new_id("")
        self._sse = req.extra.get("stream_format", "sse") == "sse"
        self._count = 0
        self._pending: list[int] = []  # tool indices started but not yet sent
        self._seen = common.Catchup()
        self._ids = common.UniqueIds("call_")

    def _frame(self, body: dict[str, Any]) -> bytes:
        data = common.dumps(body)
        self._count += 1
        if self._sse:
            return b"data: " + data + b"\r\n\r\n"
        return (b"[" if self._count == 1 else b",\r\n") + data

    def _flush_calls(self) -> list[dict[str, Any]]:
        parts = []
        for i in self._pending:
            cid, name, args = self._seen.calls[i]
            parts.append(_call_part(self._ids.take(cid), name, args))
        self._pending = []
        return parts

    def _text(self, kind: str, text: str) -> list[bytes]:
        if kind == "reasoning":
            self._seen.reasoning += text
            parts = [*self._flush_calls(), {"text": text, "thought": True}]
        else:
            self._seen.text += text
            parts = [*self._flush_calls(), {"text": text}]
        return [self._frame(_chunk(parts, self.req, self.id, None))]

    def _call(self, index: int, call_id: str, name: str) -> list[bytes]:
        """A tool call starts: the calls still pending go out (their arguments are complete); this one waits."""
        if index in self._seen.calls:
            return []
        frames = []
        if self._pending:
            frames.append(self._frame(_chunk(self._flush_calls(), self.req, self.id, None)))
        self._seen.calls[index] = [call_id, name, ""]
        self._pending.append(index)
        return frames

    def finish(self, result: ChatResult) -> list[bytes]:
        """Catch up on what was not streamed; the last chunk has the pending calls, finishReason and usage."""
        parts: list[dict[str, Any]] = []
        if rest := self._seen.missing_reasoning(result.reasoning):
            parts.append({"text": rest, "thought": True})
        if rest := self._seen.missing_text(result.content):
            parts.append({"text": rest})
        for i, tc, rest in self._seen.missing_calls(result):
            if i not in self._seen.calls:
                self._seen.calls[i] = [tc.id, tc.name, ""]
                self._pending.append(i)
            self._seen.calls[i][2] += rest
        parts.extend(self._flush_calls())
        if not parts:
            parts.append({"text": ""})
        frames = [self._frame(_chunk(parts, self.req, self.id, result))]
        if not self._sse:
            frames.append(b"]")
        return frames

    def error(self, err: ProviderError) -> list[bytes]:
        """A mid-stream failure as an error object in the stream."""
        _, body, _ = render_error(err)
        return [self._frame(body)] + ([] if self._sse else [b"]"])


# ------------------------------------------------------------------------------------------------ errors

_STATUS = {
    "invalid_request": "INVALID_ARGUMENT",
    "context_length_exceeded": "INVALID_ARGUMENT",
    "request_too_large": "INVALID_ARGUMENT",
    "authentication": "UNAUTHENTICATED",
    "permission": "PERMISSION_DENIED",
    "not_found": "NOT_FOUND",
    "rate_limit": "RESOURCE_EXHAUSTED",
    "overloaded": "UNAVAILABLE",
    "timeout": "DEADLINE_EXCEEDED",
    "api_error": "INTERNAL",
}


def render_error(err: ProviderError) -> tuple[int, dict[str, Any], dict[str, str]]:
    body = {"error": {"code": err.status, "message": err.message, "status": _STATUS.get(err.kind, "INTERNAL")}}
    return err.status, body, common.retry_headers(err)


def count_tokens_response(n: int) -> dict[str, Any]:
    return {"totalTokens": n}
