# SPDX-License-Identifier: Apache-2.0
"""The proxy's internal contract between provider dialects and inference engines.

Every dialect module (`nemo_polar.proxy.dialects.<name>`) turns a provider request into a `ChatRequest`
(OpenAI-Chat form, full fidelity) and turns an engine's `ChatResult` (or a stream of `StreamEvent`s) back into
the provider's response body or SSE event sequence. Engines (`nemo_polar.proxy.engines`) turn a `ChatRequest`
into a vLLM/SGLang call and produce `ChatResult` / `StreamEvent`s carrying token ids and logprobs, which never
go back to the harness. This module holds data only: no I/O, no provider knowledge.

Dialect module shape (same functions, same order, in every dialect module):

    DIALECT: Dialect                                  # the enum value recorded on CompletionRecord.dialect
    ROUTES: list[tuple[str, str, str]]                # (method, aiohttp path pattern, route name) it serves
    def parse_request(body: bytes | dict, route: RouteMatch) -> ChatRequest       # raises ProviderError (4xx)
    def render_response(result: ChatResult, req: ChatRequest) -> dict              # non-streaming body
    class StreamRenderer:                             # one per streaming reply
        def __init__(self, req: ChatRequest, response_id: str): ...
        def feed(self, ev: StreamEvent) -> list[bytes]    # SSE frames ready to write (b"event: …\\ndata: …\\n\\n")
        def finish(self, result: ChatResult) -> list[bytes]  # the terminal frames (usage, stop, [DONE], …)
    def render_error(err: ProviderError) -> tuple[int, dict, dict[str, str]]       # status, body, extra headers
    def count_tokens_response(n: int) -> dict          # only dialects with a count route (anthropic, google)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_polar.errors import PolarError
from nemo_polar.types import TokenIds

__all__ = [
    "ChatRequest",
    "ChatResult",
    "ProviderError",
    "RouteMatch",
    "Sampling",
    "StreamEvent",
    "ToolCall",
]


@dataclass(slots=True)
class Sampling:
    """Sampling parameters in OpenAI-Chat / vLLM names. `None` means "not set by the caller"."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    n: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}  # type: ignore[attr-defined]


@dataclass(slots=True)
class ToolCall:
    """One tool call in OpenAI form; `arguments` is the JSON text as the model produced it."""

    id: str
    name: str
    arguments: str
    type: str = "function"


@dataclass(slots=True)
class ChatRequest:
    """A provider request normalised to OpenAI Chat.

    `messages` are OpenAI Chat messages (roles system/user/assistant/tool; assistant may carry `tool_calls` and
    `reasoning_content`; contents are strings or OpenAI part arrays). System blocks and developer-role messages are
    merged, in order, into one leading system message. `tools` are OpenAI function tools
    (`{"type": "function", "function": {"name", "description", "parameters"}}`). `tool_choice` is OpenAI's
    (`"auto"|"none"|"required"|{"type": "function", "function": {"name"}}`). `response_format` is OpenAI's, when the
    provider asked for JSON output (Google's `responseJsonSchema`). `extra` keeps provider fields the dialect needs
    to render the answer (e.g. Anthropic `thinking`, Google `thoughtSignature`s, Responses `include`), never sent
    upstream.
    """

    dialect: str
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False
    include_usage: bool = False
    reasoning: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def chat_fields(self, model: str) -> dict[str, Any]:
        """`model`, `messages` and, when set, `tools`, `tool_choice`, `response_format`: an OpenAI-Chat body's core."""
        out: dict[str, Any] = {"model": model, "messages": self.messages}
        if self.tools:
            out["tools"] = self.tools
        if self.tool_choice is not None:
            out["tool_choice"] = self.tool_choice
        if self.response_format is not None:
            out["response_format"] = self.response_format
        return out

    def normalized_dict(self) -> dict[str, Any]:
        """The `request` field of a CompletionRecord (what was normalised; sampling is replaced by the engine)."""
        out = self.chat_fields(self.model)
        out["sampling"] = self.sampling.to_dict()
        return out


FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error"]


@dataclass(slots=True)
class ChatResult:
    """What the engine produced for one call, with token data (kept in the record, never sent to the harness)."""

    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_token_ids: list[int] | TokenIds = field(default_factory=list)
    generation_token_ids: list[int] = field(default_factory=list)
    generation_log_probs: list[float] = field(default_factory=list)
    served_model: str = ""
    response_id: str = ""

    def response_dict(self) -> dict[str, Any]:
        """The `response` field of a CompletionRecord."""
        return {
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": [
                {"id": t.id, "type": t.type, "function": {"name": t.name, "arguments": t.arguments}}
                for t in self.tool_calls
            ],
        }

    def as_events(self) -> list[StreamEvent]:
        """The whole answer as stream events (a forced, replayed or non-streamed answer sent to a streaming client)."""
        out: list[StreamEvent] = []
        if self.reasoning:
            out.append(StreamEvent("reasoning", text=self.reasoning))
        if self.content:
            out.append(StreamEvent("text", text=self.content))
        for i, tc in enumerate(self.tool_calls):
            out.append(StreamEvent("tool_call", index=i, id=tc.id, name=tc.name))
            if tc.arguments:
                out.append(StreamEvent("tool_args", index=i, text=tc.arguments))
        return out


@dataclass(slots=True)
class StreamEvent:
    """One incremental piece of a streaming generation, in order.

    kind:
      - "text": `text` is appended to the answer's content.
      - "reasoning": `text` is appended to the reasoning (thinking) content.
      - "tool_call": a new tool call starts at `index` with `id` and `name` (arguments follow).
      - "tool_args": `text` is appended to the arguments of tool call `index`.
    """

    kind: Literal["text", "reasoning", "tool_call", "tool_args"]
    text: str = ""
    index: int = 0
    id: str | None = None
    name: str | None = None


@dataclass(slots=True)
class RouteMatch:
    """The matched route: its path params (e.g. Google `model`, `method`) and the query string."""

    name: str
    params: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


class ProviderError(PolarError):
    """A failure to report to the caller in its own provider's error shape.

    `status` is the HTTP status; `kind` a provider-neutral category the dialect maps to its own error type:
    invalid_request | authentication | permission | not_found | request_too_large | rate_limit | overloaded |
    api_error | timeout | context_length_exceeded. `retry_after_s` becomes a `retry-after` header when set.
    """

    def __init__(
        self, status: int, kind: str, message: str, *, param: str | None = None, retry_after_s: float | None = None
    ):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s
