# SPDX-License-Identifier: Apache-2.0
"""One module per provider dialect (parse → normalise → render response → render stream → errors), and THE registry.

The registry is the only place that maps a request to a dialect, for the server and the tests alike:
`DIALECTS` maps the `Dialect` value recorded on a CompletionRecord to its module; `detect(method, path, headers)`
maps a request path (with or without its query string, with or without the `/s/{api_key}` prefix) to the dialect
module and a `RouteMatch`, from each module's `ROUTES` (exact paths) and, for templated routes, the module's own
`match_path` (Google's `{model}` and API versions); `error_dialect(path)` picks whose error shape answers a request
no route serves (an unknown path, a body over the size limit). This package does no I/O and holds no session state.

Beyond the shape in `nemo_polar.proxy.normalized` (additive, same in all four modules):
- every `StreamRenderer` derives from `_common.StreamRendererBase`: one `feed` routes each event kind to the
  dialect's hooks (`_text`, `_call`, `_args`), and `finish` catches up through the same hooks.
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
from urllib.parse import parse_qsl

from nemo_polar.proxy.dialects import anthropic_messages, google_genai, openai_chat, openai_responses
from nemo_polar.proxy.normalized import RouteMatch

__all__ = ["DIALECTS", "detect", "error_dialect", "split_key_prefix", "strip_key_prefix"]

_MODULES = (anthropic_messages, openai_chat, openai_responses, google_genai)
DIALECTS: dict[str, ModuleType] = {m.DIALECT.value: m for m in _MODULES}

_EXACT: dict[tuple[str, str], tuple[ModuleType, str]] = {
    (method, path): (m, name) for m in _MODULES for method, path, name in m.ROUTES if "{" not in path
}
_TEMPLATED: list[ModuleType] = [m for m in _MODULES if any("{" in path for _, path, _ in m.ROUTES)]
# whose error shape answers a path no route serves: the first marker found in the path; OpenAI Chat otherwise
_ERROR_MARKERS = (
    ("/v1beta/", google_genai),
    ("/v1/messages", anthropic_messages),
    ("/v1/responses", openai_responses),
)
_KEY_PREFIX = re.compile(r"^/s/([^/]+)(?=/)")


def split_key_prefix(path: str) -> tuple[str | None, str]:
    """`/s/{api_key}/v1/messages` → (`api_key`, `/v1/messages`); other paths → (None, path)."""
    m = _KEY_PREFIX.match(path)
    if m is None:
        return None, path
    return m.group(1), path[m.end() :]


def strip_key_prefix(path: str) -> str:
    """`/s/{api_key}/v1/messages` → `/v1/messages` (other paths unchanged)."""
    return split_key_prefix(path)[1]


def resolve(method: str, path: str) -> tuple[ModuleType, str, dict[str, str]] | None:
    """The dialect module, route name and path params for a key-less path without query string."""
    if len(path) > 1:
        path = path.rstrip("/")
    method = method.upper()
    hit = _EXACT.get((method, path))
    if hit is not None:
        return hit[0], hit[1], {}
    if method == "POST":
        for m in _TEMPLATED:
            found = m.match_path(path)
            if found is not None:
                return m, found[0], found[1]
    return None


def detect(method: str, path: str, headers: dict[str, str] | None = None) -> tuple[ModuleType, RouteMatch] | None:
    """The dialect module and route for a request, or None when no dialect serves it (a 404 for the server)."""
    path, _, qs = path.partition("?")
    hit = resolve(method, strip_key_prefix(path))
    if hit is None:
        return None
    module, name, params = hit
    query = dict(parse_qsl(qs, keep_blank_values=True))
    hdrs = {k.lower(): v for k, v in (headers or {}).items()}
    return module, RouteMatch(name=name, params=params, query=query, headers=hdrs)


def error_dialect(path: str) -> ModuleType:
    """The dialect whose error shape answers a request that no route serves."""
    p = strip_key_prefix(path)
    for marker, module in _ERROR_MARKERS:
        if marker in p:
            return module
    return openai_chat
