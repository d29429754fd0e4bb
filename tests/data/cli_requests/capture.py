# SPDX-License-Identifier: Apache-2.0
"""Capture the first requests of the real harness CLIs (test-data tool, not part of the product).

Runs each installed CLI headless, configured by its own adapter (`prepare`, `env`, `command`), against a
loopback RECORDER that stores method, path, query, headers and body of every request. With `--server proxy`
(the default) the recorder relays each request to the Polar proxy (in-process, with a session of its own and a
FAKE vLLM upstream answering one sentence) and hands the proxy's answer back: the CLI talks to the proxy, and the
proxy's records are checked to hold the very bodies recorded. With `--server fake` the recorder itself answers
with a minimal provider-shaped reply (a one-sentence text answer, streamed when asked; a JSON object for
JSON-schema calls; a model list for GET …/models). Secrets are removed before writing:
API keys (headers, query, anywhere in bodies), auth headers, cookies, user ids (`metadata.user_id`); the
temporary HOME and workdir paths become `/sandbox/home` and `/sandbox/workdir`.

    .venv/bin/python tests/data/cli_requests/capture.py all          # or one harness name
    -> tests/data/cli_requests/<harness>.json

Variant `gemini_cli_router`: Gemini CLI without a model (`-m`, `GEMINI_MODEL`), so its model router runs a
non-streaming `generateContent` call with `responseJsonSchema` before the turn (a side call).
Variants `<harness>_tool` (behind the proxy only): the session's plan makes the first main call a shell tool call
(`{"shell": "echo polar"}` resolved by the adapter into its own tool) and the second a text answer, so the capture
holds the CLI's own wire form of a tool call and its result in the second main request.

Each file: harness, package, version, server, command (argv, redacted), exit code, `first_model_request` (index
into `requests`), `requests` (every request the CLI sent, in arrival order) and, behind the proxy,
`proxy_records` (per record: seq, dialect, call kind, origin, error, whether its `original_request` is the
recorded body).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from nemo_polar.harness_adapters import BUILTIN, HarnessContext, get_adapter
from nemo_polar.harness_adapters.install import cache_root, status

from nemo_polar.proxy.app import Proxy, ProxyConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # polar_lab lives at the repository root
from polar_lab.fake_upstream import FakeUpstream

HERE = Path(__file__).resolve().parent
KEY = "sk-polar-capture-KEY-0123456789"
MODEL = "tiny-qwen3"
INSTRUCTION = "Say hello in one short sentence."
ANSWER = "Hello from the capture fake."
SECRET_HEADERS = {"authorization", "x-api-key", "x-goog-api-key", "api-key", "cookie", "proxy-authorization"}
# identifiers of the machine or the user, wherever they appear (also inside JSON-encoded strings)
ID_VALUES = re.compile(r'(?:installation_id|installation-id|device_id|account_uuid|user_id)\\?"\s*:\s*\\?"([^"\\]+)')
MODEL_PATH = re.compile(r"/(chat/completions|responses|messages|models/[^/]+:(stream)?[gG]enerateContent)$")


# --- minimal provider-shaped replies ---------------------------------------------------------------------------


def _sse(events: list[tuple[str | None, dict[str, Any] | str]]) -> bytes:
    out = []
    for name, data in events:
        payload = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "") + f"data: {payload}\n\n")
    return "".join(out).encode()


def _anthropic(body: dict[str, Any]) -> web.Response:
    usage = {"input_tokens": 10, "output_tokens": 5}
    msg = {"id": "msg_capture", "type": "message", "role": "assistant", "model": body.get("model", MODEL)}
    if not body.get("stream"):
        content = [{"type": "text", "text": ANSWER}]
        return web.json_response({**msg, "content": content, "stop_reason": "end_turn", "usage": usage})
    events: list[tuple[str | None, dict[str, Any] | str]] = [
        ("message_start", {"type": "message_start", "message": {**msg, "content": [], "usage": usage}}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ANSWER}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return web.Response(body=_sse(events), content_type="text/event-stream")


def _chat(body: dict[str, Any]) -> web.Response:
    base = {"id": "chatcmpl-capture", "created": int(time.time()), "model": body.get("model", MODEL)}
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if not body.get("stream"):
        choice = {"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
        return web.json_response({**base, "object": "chat.completion", "choices": [choice], "usage": usage})
    chunk = {**base, "object": "chat.completion.chunk"}
    events: list[tuple[str | None, dict[str, Any] | str]] = [
        (None, {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ANSWER}}]}),
        (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        (None, {**chunk, "choices": [], "usage": usage}),
        (None, "[DONE]"),
    ]
    return web.Response(body=_sse(events), content_type="text/event-stream")


def _responses(body: dict[str, Any]) -> web.Response:
    text_part = {"type": "output_text", "text": ANSWER, "annotations": []}
    item = {"id": "msg_capture", "type": "message", "role": "assistant", "status": "completed", "content": [text_part]}
    usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    resp = {"id": "resp_capture", "object": "response", "model": body.get("model", MODEL), "status": "completed"}
    if not body.get("stream"):
        return web.json_response({**resp, "output": [item], "usage": usage})
    pending = {**resp, "status": "in_progress", "output": []}
    events: list[tuple[str | None, dict[str, Any] | str]] = [
        ("response.created", {"type": "response.created", "response": pending}),
        ("response.in_progress", {"type": "response.in_progress", "response": pending}),
        (
            "response.output_item.added",
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "status": "in_progress", "content": []},
            },
        ),
        (
            "response.content_part.added",
            {
                "type": "response.content_part.added",
                "item_id": "msg_capture",
                "output_index": 0,
                "content_index": 0,
                "part": {**text_part, "text": ""},
            },
        ),
        (
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "item_id": "msg_capture",
                "output_index": 0,
                "content_index": 0,
                "delta": ANSWER,
            },
        ),
        (
            "response.output_text.done",
            {
                "type": "response.output_text.done",
                "item_id": "msg_capture",
                "output_index": 0,
                "content_index": 0,
                "text": ANSWER,
            },
        ),
        (
            "response.content_part.done",
            {
                "type": "response.content_part.done",
                "item_id": "msg_capture",
                "output_index": 0,
                "content_index": 0,
                "part": text_part,
            },
        ),
        ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "response": {**resp, "output": [item], "usage": usage}}),
    ]
    return web.Response(body=_sse(events), content_type="text/event-stream")


def _google(body: dict[str, Any], streaming: bool) -> web.Response:
    cfg = body.get("generationConfig") or {}
    text = ANSWER
    if cfg.get("responseJsonSchema") or cfg.get("responseMimeType") == "application/json":
        text = json.dumps({"reasoning": "capture fake", "model_choice": "flash", "next_speaker": "user"})
    chunk = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": MODEL,
    }
    if not streaming:
        return web.json_response(chunk)
    return web.Response(body=_sse([(None, chunk)]), content_type="text/event-stream")


# --- the recording server ---------------------------------------------------------------------------------------


HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "accept-encoding"}


class Recorder:
    """Records every request; answers it itself, or relays it to `forward_to` (the proxy) and returns its answer."""

    def __init__(self, forward_to: str | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.forward_to = forward_to
        self.http: aiohttp.ClientSession | None = None

    async def relay(self, request: web.Request, raw: bytes) -> web.Response:
        assert self.http is not None and self.forward_to is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self.http.request(
            request.method, self.forward_to + request.path_qs, headers=headers, data=raw or None
        ) as resp:
            body = await resp.read()
            keep = {k: v for k, v in resp.headers.items() if k.lower() in ("content-type", "retry-after")}
            return web.Response(status=resp.status, body=body, headers=keep)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "body": body,
            }
        )
        if self.forward_to is not None:
            return await self.relay(request, raw)
        path = request.path
        if request.method == "GET" and path.endswith("/models"):
            return web.json_response(
                {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "polar"}]}
            )
        if request.method != "POST" or not isinstance(body, dict):
            return web.json_response(
                {"error": {"message": "capture fake: not found", "type": "not_found"}}, status=404
            )
        if path.endswith("/messages"):
            return _anthropic(body)
        if path.endswith("/chat/completions"):
            return _chat(body)
        if path.endswith("/responses"):
            return _responses(body)
        if ":streamGenerateContent" in path or ":generateContent" in path:
            return _google(body, ":streamGenerateContent" in path)
        return web.json_response(
            {"error": {"message": "capture fake: unknown route", "type": "not_found"}}, status=404
        )


# --- redaction ------------------------------------------------------------------------------------------------


def _scrub(obj: Any, replacements: list[tuple[str, str]]) -> Any:
    if isinstance(obj, str):
        for old, new in replacements:
            obj = obj.replace(old, new)
        return obj
    if isinstance(obj, list):
        return [_scrub(v, replacements) for v in obj]
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "user_id" or k == "userId":
                out[k] = "<redacted>"
            elif k == "metadata" and isinstance(v, dict) and "user_id" in v:
                out[k] = {**_scrub(v, replacements), "user_id": "<redacted>"}
            else:
                out[k] = _scrub(v, replacements)
        return out
    return obj


def redact(req: dict[str, Any], replacements: list[tuple[str, str]]) -> dict[str, Any]:
    headers = {k: ("<redacted>" if k in SECRET_HEADERS else v) for k, v in req["headers"].items()}
    query = {k: ("<redacted>" if k.lower() in ("key", "api_key") else v) for k, v in req["query"].items()}
    return _scrub({**req, "headers": headers, "query": query}, replacements)


# --- one capture ------------------------------------------------------------------------------------------------


TOOL_HARNESSES = ("claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi")
VARIANTS = {"gemini_cli_router": "gemini_cli", **{f"{h}_tool": h for h in TOOL_HARNESSES}}
TOOL_COMMAND = "echo polar"


def _example(schema: Any) -> Any:
    """A value of a (small) JSON schema: what a JSON-schema side call (Gemini CLI's router) accepts."""
    kind = str(schema.get("type", "object")).lower() if isinstance(schema, dict) else "string"
    if kind == "object":
        return {k: _example(v) for k, v in (schema.get("properties") or {}).items()}
    if "enum" in schema:
        return schema["enum"][0]
    return {"string": "capture", "integer": 1, "number": 1, "boolean": True, "array": []}.get(kind)


class CaptureUpstream(FakeUpstream):
    """The FAKE vLLM: a forced plan step's text, a JSON value matching `response_format`'s schema, or one sentence."""

    def _content(self, body: dict[str, Any]) -> str:
        if body.get("structured_outputs"):  # a forced plan step: the fake answers the forced text
            return super()._content(body)
        fmt = body.get("response_format") or {}
        if fmt.get("type") == "json_schema":
            return json.dumps(_example(fmt["json_schema"]["schema"]))
        if fmt.get("type") == "json_object":
            return "{}"
        return ANSWER

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self._cache.clear()  # the fake caches answers by model and tools, not by response_format
        return await super()._chat(request)


class ProxySide:
    """The Polar proxy in-process on loopback, a FAKE vLLM upstream behind it, and one session for the CLI."""

    def __init__(self, store_dir: Path) -> None:
        self.fake = CaptureUpstream()
        self.fake.behaviour.n_gen = 8
        self.store_dir = store_dir
        self.url = ""
        self.key = ""
        self.session_id = ""
        self.proxy: Proxy | None = None
        self.runner: web.AppRunner | None = None

    async def start(self) -> ProxySide:
        await self.fake.start()
        self.proxy = Proxy(ProxyConfig(upstreams=[self.fake.base_url], store_dir=str(self.store_dir)))
        self.runner = self.proxy.runner()
        await self.runner.setup()
        await self.proxy.site(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def open_session(self, plan: dict[str, Any] | None, classifier: Any) -> str:
        assert self.proxy is not None
        session = await self.proxy.create_session(task_id="capture", plan=plan, classifier=classifier)
        self.key, self.session_id = session.api_key, session.session_id
        return self.key

    def records(self, recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What the proxy recorded, and whether each record's `original_request` is a body the recorder saw."""
        assert self.proxy is not None
        bodies = [r["body"] for r in recorded]
        return [
            {
                "seq": rec.seq,
                "dialect": rec.dialect,
                "call_kind": rec.call_kind,
                "origin": rec.origin,
                "error": rec.error,
                "original_request_is_recorded_body": rec.original_request in bodies,
            }
            for rec in self.proxy.store.list_records(self.session_id, limit=10_000)
        ]

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        await self.fake.stop()


async def capture(name: str, timeout_s: float, server: str = "proxy") -> dict[str, Any]:
    adapter = get_adapter(VARIANTS.get(name, name))
    st = status(adapter)
    if not st.installed:
        raise SystemExit(f"{name} is not installed: run `polar harness install {name}` first")
    if name.endswith("_tool") and server != "proxy":
        raise SystemExit(f"{name} needs the proxy (its plan forces the tool call)")
    tmp = Path(tempfile.mkdtemp(prefix=f"polar-capture-{name}-"))
    side = await ProxySide(tmp / "store").start() if server == "proxy" else None
    recorder = Recorder(forward_to=side.url if side is not None else None)
    recorder.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    home, work = tmp / "home", tmp / "workdir"
    home.mkdir()
    work.mkdir()
    ctx = HarnessContext(
        base_url=f"http://127.0.0.1:{port}",
        api_key=KEY,
        model=MODEL,
        workdir=str(work),
        home=str(home),
        install_dir=str(st.path) if st.path else None,
    )
    key = KEY
    if side is not None:
        plan = None
        if name.endswith("_tool"):
            steps = [*adapter.resolve_step({"shell": TOOL_COMMAND}, ctx), {"text": "Done: it printed polar."}]
            plan = {"version": 1, "steps": steps, "side": "live"}
        key = await side.open_session(plan, adapter.classify_request)
    ctx = dataclasses.replace(
        ctx,
        api_key=key,
        command_line=f"curl -s -H 'Authorization: Bearer {key}' http://127.0.0.1:{port}/v1/chat/completions "
        f'-d \'{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}]}}\'',
    )
    for rel, text in adapter.prepare(ctx).items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TERM": "dumb"}
    env.update(adapter.env(ctx))
    for var in adapter.env_unset:
        env.pop(var, None)
    argv = adapter.command(ctx, INSTRUCTION)
    if name == "gemini_cli_router":
        env.pop("GEMINI_MODEL")
        argv = argv[: argv.index("-m")] + argv[argv.index("-m") + 2 :]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = await proc.communicate()
    await runner.cleanup()
    await recorder.http.close()
    proxy_records = side.records(recorder.requests) if side is not None else None
    if side is not None:
        await side.close()
    shutil.rmtree(tmp, ignore_errors=True)
    slug = re.sub(r"[^A-Za-z0-9]", "-", str(work))  # project directories named after the workdir
    replacements = [
        (KEY, "<redacted-key>"),
        (key, "<redacted-key>"),
        (str(home), "/sandbox/home"),
        (str(work), "/sandbox/workdir"),
        (slug, "-sandbox-workdir"),
        (slug.replace("--", "-"), "-sandbox-workdir"),
        (f"127.0.0.1:{port}", "127.0.0.1:PORT"),
        (str(tmp), "/sandbox"),
        (str(cache_root()), "~/.cache/nemo-polar"),
        (str(Path.home()) + "/", "~/"),
    ]
    ids = set(ID_VALUES.findall(json.dumps(recorder.requests))) | {
        v for r in recorder.requests for k, v in r["headers"].items() if "installation-id" in k
    }
    replacements += [(v, "<redacted-id>") for v in sorted(ids) if len(v) >= 8]
    requests = [redact(r, replacements) for r in recorder.requests]
    first = next((i for i, r in enumerate(requests) if r["method"] == "POST" and MODEL_PATH.search(r["path"])), None)
    return {
        "harness": adapter.name,
        "variant": name,
        "package": adapter.package,
        "version": adapter.version,
        "server": "polar proxy (FAKE vLLM upstream)" if side is not None else "capture fake",
        "command": _scrub(argv, replacements),
        "exit_code": proc.returncode,
        "stdout_tail": _scrub(out.decode("utf-8", "replace")[-2000:], replacements),
        "stderr_tail": _scrub(err.decode("utf-8", "replace")[-2000:], replacements),
        "first_model_request": first,
        "requests": requests,
        **({"proxy_records": _scrub(proxy_records, replacements)} if proxy_records is not None else {}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=[*BUILTIN, *VARIANTS, "all"])
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--out-dir", type=Path, default=HERE)
    parser.add_argument("--server", choices=["proxy", "fake"], default="proxy", help="who answers the CLI")
    args = parser.parse_args()
    names = [*(n for n in BUILTIN if n != "shell"), *VARIANTS] if args.name == "all" else [args.name]
    for name in names:
        result = asyncio.run(capture(name, args.timeout_s, args.server))
        path = args.out_dir / f"{name}.json"
        path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        paths = [f"{r['method']} {r['path']}" for r in result["requests"]]
        print(
            f"{name}: exit {result['exit_code']}, {len(paths)} requests, first model request "
            f"#{result['first_model_request']} -> {path}\n  " + "\n  ".join(paths)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
