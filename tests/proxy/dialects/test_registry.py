# SPDX-License-Identifier: Apache-2.0
"""The dialect registry: path → dialect detection, module shape, and ROUTES usable as aiohttp routes."""

from __future__ import annotations

import asyncio
import inspect
import re

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from nemo_polar.proxy.dialects import DIALECTS, detect, strip_key_prefix
from nemo_polar.types import Dialect

DETECT = [
    ("POST", "/v1/messages", "anthropic_messages", "messages", {}),
    ("POST", "/v1/messages?beta=true", "anthropic_messages", "messages", {}),
    ("POST", "/v1/messages/count_tokens?beta=true", "anthropic_messages", "count_tokens", {}),
    ("POST", "/s/sk-polar-123/v1/messages?beta=true", "anthropic_messages", "messages", {}),
    ("POST", "/v1/chat/completions", "openai_chat", "chat_completions", {}),
    ("POST", "/s/k/v1/chat/completions", "openai_chat", "chat_completions", {}),
    ("POST", "/v1/responses", "openai_responses", "responses", {}),
    ("POST", "/v1/responses/", "openai_responses", "responses", {}),
    (
        "POST",
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
        "google_genai",
        "stream_generate_content",
        {"model": "gemini-2.5-pro", "method": "streamGenerateContent"},
    ),
    (
        "POST",
        "/v1beta/models/gemini-2.5-flash-lite:generateContent",
        "google_genai",
        "generate_content",
        {"model": "gemini-2.5-flash-lite", "method": "generateContent"},
    ),
    (
        "POST",
        "/s/abc/v1beta/models/qwen3.5:countTokens",
        "google_genai",
        "count_tokens",
        {"model": "qwen3.5", "method": "countTokens"},
    ),
    (
        "POST",
        "/v1/models/g:generateContent",
        "google_genai",
        "generate_content",
        {"model": "g", "method": "generateContent"},
    ),
]


@pytest.mark.parametrize("method,path,dialect,route,params", DETECT, ids=[p for _, p, *_ in DETECT])
def test_detect(method: str, path: str, dialect: str, route: str, params: dict[str, str]) -> None:
    hit = detect(method, path, {"X-Api-Key": "k"})
    assert hit is not None
    module, match = hit
    assert module is DIALECTS[dialect]
    assert match.name == route and match.params == params
    assert match.headers == {"x-api-key": "k"}
    if "?" in path:
        assert match.query == dict([path.split("?")[1].split("=")])


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/v1/messages"),
        ("HEAD", "/"),
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("POST", "/v1beta/models/g:embedContent"),
        ("POST", "/v1beta/models/a/b:generateContent"),
        ("POST", "/s/key"),
        ("POST", "/v2/messages"),
    ],
)
def test_detect_misses(method: str, path: str) -> None:
    assert detect(method, path) is None


def test_strip_key_prefix() -> None:
    assert strip_key_prefix("/s/xyz/v1/responses") == "/v1/responses"
    assert strip_key_prefix("/v1/responses") == "/v1/responses"
    assert strip_key_prefix("/s/xyz") == "/s/xyz"


def test_registry_covers_every_dialect_with_the_same_shape() -> None:
    assert set(DIALECTS) == {d.value for d in Dialect}
    order = ["DIALECT", "ROUTES", "parse_request", "render_response", "StreamRenderer", "render_error"]
    for name, module in DIALECTS.items():
        assert module.DIALECT.value == name
        src = inspect.getsource(module)
        positions = [re.search(rf"^(?:def |class )?{sym}\b", src, re.M).start() for sym in order]  # type: ignore[union-attr]
        assert positions == sorted(positions), name
        for sym in ("feed", "finish", "error"):
            assert callable(getattr(module.StreamRenderer, sym))
        has_count = any(r[2] == "count_tokens" for r in module.ROUTES)
        assert hasattr(module, "count_tokens_response") == has_count
    assert DIALECTS["anthropic_messages"].count_tokens_response(7) == {"input_tokens": 7}
    assert DIALECTS["google_genai"].count_tokens_response(7) == {"totalTokens": 7}


def test_routes_resolve_in_aiohttp_and_agree_with_detect() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    for module in DIALECTS.values():
        for method, pattern, name in module.ROUTES:
            app.router.add_route(method, pattern, handler, name=f"{module.DIALECT.value}.{name}")

    async def resolve_all() -> None:
        for module in DIALECTS.values():
            for method, pattern, name in module.ROUTES:
                path = pattern.replace("{model}", "gemini-2.5-pro")
                info = await app.router.resolve(make_mocked_request(method, path, app=app))
                assert info.route.name == f"{module.DIALECT.value}.{name}"
                if "{model}" in pattern:
                    assert info["model"] == "gemini-2.5-pro"
                hit = detect(method, path)
                assert hit is not None and hit[0] is module and hit[1].name == name

    asyncio.run(resolve_all())
