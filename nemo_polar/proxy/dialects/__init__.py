# SPDX-License-Identifier: Apache-2.0
"""One module per provider dialect (parse → normalise → render response → render stream → errors), and a registry.

`DIALECTS` maps the `Dialect` value recorded on a CompletionRecord to its module; `detect(method, path, headers)`
maps a request path (with or without its query string, with or without the `/s/{api_key}` prefix) to the dialect
module and a `RouteMatch`. This package does no I/O and holds no session state.

Beyond the shape in `nemo_polar.proxy.normalized` (additive, same in all four modules):
- `StreamRenderer.finish(result)` first emits whatever of `result` the stream has not carried yet, so a renderer
  fed no events at all (a replayed or forced answer) renders the whole answer; tool calls are taken from `result`.
- `StreamRenderer.error(err)` renders a mid-stream failure the provider's way (Anthropic `event: error`, Responses
  `response.failed`, an error object as a Chat / Google data line) for a server that wants to end a broken stream
  cleanly instead of dropping the connection.
- `ChatRequest.extra` carries what rendering needs: `tool_map` (Responses namespace/custom tools),
  `stream_format` (Google `sse` | `json_array`), and for the record `tool_call_ids` (canonical → provider id),
  `tool_errors`, `dropped_tools`, `thought_signatures`, `billing_header_removed`, `thinking`, `reasoning`, …
"""

from __future__ import annotations

import re
from types import ModuleType
from urllib.parse import parse_qsl, unquote

from nemo_polar.proxy.dialects import anthropic_messages, google_genai, openai_chat, openai_responses
from nemo_polar.proxy.normalized import RouteMatch

__all__ = ["DIALECTS", "detect", "strip_key_prefix"]

DIALECTS: dict[str, ModuleType] = {
    m.DIALECT.value: m for m in (anthropic_messages, openai_chat, openai_responses, google_genai)
}

_EXACT: dict[str, tuple[ModuleType, str]] = {
    "/v1/messages": (anthropic_messages, "messages"),
    "/v1/messages/count_tokens": (anthropic_messages, "count_tokens"),
    "/v1/chat/completions": (openai_chat, "chat_completions"),
    "/v1/responses": (openai_responses, "responses"),
}
_GOOGLE = re.compile(
    r"^/(?:v1beta|v1alpha|v1)/models/(?P<model>[^/:]+):(?P<verb>generateContent|streamGenerateContent|countTokens)$"
)
_GOOGLE_ROUTES = {
    "generateContent": "generate_content",
    "streamGenerateContent": "stream_generate_content",
    "countTokens": "count_tokens",
}
_KEY_PREFIX = re.compile(r"^/s/[^/]+(?=/)")


def strip_key_prefix(path: str) -> str:
    """`/s/{api_key}/v1/messages` → `/v1/messages` (other paths unchanged)."""
    return _KEY_PREFIX.sub("", path, count=1)


def detect(method: str, path: str, headers: dict[str, str] | None = None) -> tuple[ModuleType, RouteMatch] | None:
    """The dialect module and route for a request, or None when no dialect serves it (a 404 for the server)."""
    if method.upper() != "POST":
        return None
    path, _, qs = path.partition("?")
    path = strip_key_prefix(path)
    if len(path) > 1:
        path = path.rstrip("/")
    query = dict(parse_qsl(qs, keep_blank_values=True))
    hdrs = {k.lower(): v for k, v in (headers or {}).items()}
    hit = _EXACT.get(path)
    if hit is not None:
        module, name = hit
        return module, RouteMatch(name=name, params={}, query=query, headers=hdrs)
    m = _GOOGLE.match(path)
    if m is not None:
        params = {"model": unquote(m.group("model")), "method": m.group("verb")}
        return google_genai, RouteMatch(name=_GOOGLE_ROUTES[m.group("verb")], params=params, query=query, headers=hdrs)
    return None
