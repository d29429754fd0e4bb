# SPDX-License-Identifier: Apache-2.0
"""The proxy's HTTP surface: routes, session auth, error mapping, and the flow of one harness call.

A harness call is matched to its provider dialect by the dialect registry (`nemo_polar.proxy.dialects.resolve`,
also under the path prefix `/s/{api_key}`), authenticated by its session key (unknown key → 401 in the caller's
provider shape, never a new session), parsed into a `ChatRequest`, classified (`main|subagent|side`) by the
session's classifier, given its plan step, its sampling enforced (gateway and session `sampling` override the
harness), generated (`generation.Generator`), recorded (`recording`), committed to the store, and only then answered
(`streaming` for SSE replies: the terminal event is written after the commit). Every error reaches the client in
its provider's shape. The admin API is `admin.AdminAPI`. `Proxy` and `ProxyConfig` are the Python API; `run()`
serves until interrupted (`polar proxy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from nemo_polar.proxy import dialects, recording
from nemo_polar.proxy.admin import AdminAPI, Admission
from nemo_polar.proxy.config import ProxyConfig
from nemo_polar.proxy.engines.base import Engine, EngineCall, Generation, UpstreamError, Upstreams
from nemo_polar.proxy.generation import CallContext, Generator, plan_kind
from nemo_polar.proxy.normalized import ChatRequest, ProviderError, RouteMatch
from nemo_polar.proxy.sessions import Session, SessionManager
from nemo_polar.proxy.store import RecordStore, StoreWriteError
from nemo_polar.proxy.streaming import client_left, reply_plain, reply_stream
from nemo_polar.proxy.tuning import serving_loop, tune_serving_process
from nemo_polar.types import CallKind, CompletionRecord

if TYPE_CHECKING:
    from nemo_polar.proxy.front import Front

__all__ = ["Proxy", "ProxyConfig", "run"]

log = logging.getLogger(__name__)

STORE_RETRY_AFTER_S = 2.0  # a full disk is not freed at once
# aiohttp server options of every proxy server (`Proxy.runner`, `run`): a handler is cancelled when its client hangs up
SERVER_OPTIONS: dict[str, Any] = {"handler_cancellation": True}
_SAMPLING_OVERRIDES = ("temperature", "top_p", "top_k", "seed")
_KINDS = {
    400: "invalid_request",
    401: "authentication",
    403: "permission",
    404: "not_found",
    405: "invalid_request",
    413: "request_too_large",
    429: "rate_limit",
}


def make_engine(name: str, upstreams: Upstreams, *, stream_interval: int | None = None) -> Engine:
    if name == "vllm":
        from nemo_polar.proxy.engines.vllm import VLLMEngine

        return VLLMEngine(upstreams, stream_interval=stream_interval)
    if name == "sglang":
        from nemo_polar.proxy.engines.sglang import SGLangEngine

        return SGLangEngine(upstreams)
    raise ValueError(f"unknown engine {name!r} (vllm | sglang)")


class Proxy:
    """The proxy server. `make_app()` gives the aiohttp application; the Python API creates sessions directly."""

    def __init__(self, config: ProxyConfig):
        self.config = config
        if config.http_server not in ("lean", "aiohttp"):
            raise ValueError(f"unknown http_server {config.http_server!r} (lean | aiohttp)")
        self.fronts: list[Front] = []  # the HTTP fronts of this proxy's sites (`site`; the admin status counts)
        self.control_token = config.control_token or os.environ.get("POLAR_CONTROL_TOKEN") or secrets.token_urlsafe(24)
        self.store = RecordStore(
            config.store_dir,
            fsync=config.fsync,
            session_deltas=config.session_deltas,
            page_cache_mb=config.store_page_cache_mb,
            direct_io=config.store_direct_io,
        )
        self.sessions = SessionManager(self.store)
        # Python API: create a session, with an optional request classifier (the adapter's `classify_request`)
        self.create_session = self.sessions.create
        self.upstreams = Upstreams(
            config.upstreams,
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
            routing=config.routing,
        )
        self.engine: Engine = make_engine(config.engine, self.upstreams, stream_interval=config.stream_interval)
        self.generator = Generator(config, self.engine, self.store)
        self.admission = Admission(config.pause_wait_s)
        self.admin = AdminAPI(self)
        self.policy_version: int | str | None = None
        self.base_url = config.public_base_url or ""
        self.served_models: list[str] = [config.served_model] if config.served_model else []

    @property
    def _in_flight(self) -> int:  # read by tests and the admin status
        return self.admission.in_flight

    def _alone(self) -> bool:  # the store's `write_at_once`: no other call's commit could share a batch
        return self.admission.in_flight <= 1

    @property
    def _splicer(self) -> Any:  # the prefix splicer once made (tests read its tokenizer)
        return self.generator.splicer

    # -- lifecycle -------------------------------------------------------------------------------------------------

    async def _lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        self.store.open()
        self.store.write_at_once = self._alone
        n = self.sessions.load()
        if n:
            log.info("loaded %d session(s) from %s", n, self.store.path)
        self.admission.open()
        try:
            yield
        finally:
            await self.admission.pause(10)  # stop admitting; let what is in flight finish (at most 10 s)
            await self.upstreams.close()
            self.store.close()

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[self._error_middleware])
        app.cleanup_ctx.append(self._lifecycle)
        r = app.router
        r.add_get("/", self._head)  # also answers HEAD /
        r.add_get("/v1/models", self._models)
        r.add_get("/s/{polar_key}/v1/models", self._models)
        self.admin.add_routes(r)
        r.add_route("*", "/{tail:.*}", self._dialect_route)  # harness calls: the dialect registry routes them
        return app

    def runner(self) -> web.AppRunner:
        """The app's runner as every server of the proxy runs it (`run`, `rollout.proxylink.HostedProxy`): with
        aiohttp's handler cancellation, so a harness that hangs up mid-call (its own timeout, a killed session)
        stops the engine's work on the answer and leaves a `client_disconnected` failure record (`streaming.client_left`)."""
        return web.AppRunner(self.make_app(), access_log=None, **SERVER_OPTIONS)

    def site(self, runner: web.AppRunner, host: str, port: int) -> web.TCPSite:
        """The site that serves `runner` (set up) on host:port: the proxy's own HTTP front for harness calls
        (`proxy/front.py`), or aiohttp's server for everything (`ProxyConfig.http_server`)."""
        if self.config.http_server == "aiohttp":
            return web.TCPSite(runner, host, port)
        from nemo_polar.proxy.front import FrontSite

        def handle(request: Any) -> Any:
            if request.method != "POST":  # GET or HEAD / (front.served_here)
                return self._head(request)
            return self._error_middleware(request, self._dialect_route)

        site = FrontSite(runner, handle, self.config.max_body_bytes, host, port)
        self.fronts.append(site.front)
        return site

    # -- Python API ------------------------------------------------------------------------------------------------

    def set_policy_version(self, version: int | str | None) -> None:
        self.policy_version = version

    # -- errors ----------------------------------------------------------------------------------------------------

    @staticmethod
    def _error_response(mod: ModuleType, err: ProviderError) -> web.Response:
        status, body, headers = mod.render_error(err)
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json", headers=headers)

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        try:
            resp: web.StreamResponse = await handler(request)
            return resp
        except web.HTTPRequestEntityTooLarge as exc:
            log.info("413 %s %s", request.method, request.path)
            err = ProviderError(
                413, "request_too_large", f"request body exceeds {self.config.max_body_bytes} bytes: {exc.text}"
            )
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            err = ProviderError(exc.status, _KINDS.get(exc.status, "invalid_request"), exc.reason)
        except ProviderError as e:
            log.info("%d %s %s: %s", e.status, request.method, request.path, e.message)
            err = e
        except StoreWriteError as e:  # disk full / I/O error: ours, retryable, answered in the caller's shape
            log.warning("503 %s %s: %s", request.method, request.path, e)
            err = ProviderError(503, "overloaded", f"{e}; retry later", retry_after_s=STORE_RETRY_AFTER_S)
        return self._error_response(dialects.error_dialect(request.path), err)

    # -- small routes ----------------------------------------------------------------------------------------------

    async def _head(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        self._auth(request, request.match_info.get("polar_key"))
        served = await self._served()
        now = int(time.time())
        data = [
            {
                "id": m,
                "object": "model",
                "created": now,
                "owned_by": "nemo-polar",
                "type": "model",
                "display_name": m,
                "created_at": "1970-01-01T00:00:00Z",
            }
            for m in served
        ]
        body = {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _served(self) -> list[str]:
        if not self.served_models:
            self.served_models = await self.engine.list_models()
            if not self.served_models:
                raise UpstreamError(502, "api_error", "the upstream serves no model")
        return self.served_models

    # -- auth ------------------------------------------------------------------------------------------------------

    def _auth(self, request: web.Request, key: str | None) -> Session:
        if not key:
            h = request.headers
            key = h.get("x-api-key") or h.get("x-goog-api-key")
            if not key:
                auth = h.get("Authorization", "")
                if auth[:7].lower() == "bearer ":
                    key = auth[7:].strip()
            if not key:
                key = request.query.get("key")
        if not key:
            raise ProviderError(
                401,
                "authentication",
                "missing API key (x-api-key, Authorization: Bearer, x-goog-api-key or /s/{key}/ path prefix)",
            )
        session = self.sessions.by_key(key)
        if session is None:
            raise ProviderError(401, "authentication", "invalid API key: no such session")
        return session

    # -- harness calls ---------------------------------------------------------------------------------------------

    async def _dialect_route(self, request: web.Request) -> web.StreamResponse:
        key, path = dialects.split_key_prefix(request.raw_path.partition("?")[0])
        hit = dialects.resolve(request.method, path)
        if hit is None:
            log.info("404 unknown route %s %s", request.method, request.path)
            return self._error_response(
                dialects.error_dialect(request.path),
                ProviderError(404, "not_found", f"unknown route {request.method} {request.path}"),
            )
        mod, name, params = hit
        route = RouteMatch(name=name, params=params, query=dict(request.query), headers=dict(request.headers))
        return await self._handle(request, mod, route, key)

    async def _handle(
        self, request: web.Request, mod: ModuleType, route: RouteMatch, key: str | None
    ) -> web.StreamResponse:
        arrived = time.time()
        try:
            session = self._auth(request, key)
        except ProviderError as err:
            log.info("401 %s %s", request.method, request.path)
            return self._error_response(mod, err)
        raw = await request.read()
        counting = "count" in route.name.lower()
        try:
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise ProviderError(400, "invalid_request", f"malformed JSON body: {exc}") from exc
            if not isinstance(body, dict):
                raise ProviderError(400, "invalid_request", "the request body must be a JSON object")
            try:
                req: ChatRequest = mod.parse_request(body, route)
            except ProviderError:
                raise
            except Exception as exc:  # a parser bug must still answer the client with a 4xx, never a 500
                log.exception("dialect %s failed to parse a request", mod.DIALECT.value)
                raise ProviderError(400, "invalid_request", f"could not parse the request: {exc}") from exc
            if session.closed:
                raise ProviderError(403, "permission", f"session {session.session_id} is closed")
            if counting:
                return await self._count_tokens(mod, session, req)
        except ProviderError as err:
            log.info("%d %s %s: %s", err.status, request.method, request.path, err.message)
            if not counting:
                await self.store.commit(recording.rejected(session, mod.DIALECT.value, raw, arrived, err))
            return self._error_response(mod, err)
        return await self._generate(request, mod, session, req, body, arrived)

    async def _count_tokens(self, mod: ModuleType, session: Session, req: ChatRequest) -> web.Response:
        served = await self._resolve_model(session, req.model)
        sampling = self._enforce(req, session)
        ids = await self.engine.tokenize(EngineCall(req, served, sampling, session.session_id))
        return web.Response(body=orjson.dumps(mod.count_tokens_response(len(ids))), content_type="application/json")

    async def _resolve_model(self, session: Session, requested: str) -> str:
        served = await self._served()
        mapped = session.models.get(requested)
        if isinstance(mapped, str):
            return mapped
        if requested in served:
            return requested
        if self.config.strict_models or session.models.get("strict") is True:
            raise ProviderError(404, "not_found", f"model {requested!r} is not served here (served: {served})")
        default = session.models.get("default")
        return default if isinstance(default, str) else served[0]

    def _enforce(self, req: ChatRequest, session: Session) -> dict[str, Any]:
        """Sampling actually sent: the harness's, overridden by the gateway's and then the session's."""
        out = req.sampling.to_dict()
        out.pop("n", None)
        caps = []
        for src in (self.config.sampling, session.sampling):
            for k, v in src.items():
                if k == "max_tokens":
                    caps.append(v)
                elif k == "chat_template_kwargs":
                    out[k] = {**(out.get(k) or {}), **v}
                elif k in _SAMPLING_OVERRIDES:
                    out[k] = v
        if caps:
            cap = min(caps)
            out["max_tokens"] = min(out.get("max_tokens") or cap, cap)
        return out

    def _classify(self, session: Session, normalized: dict[str, Any]) -> str:
        try:
            return session.classify(normalized)
        except Exception:  # an adapter's classifier bug must not fail the harness's call
            log.exception("session %s: classifier failed; treating the call as main", session.session_id)
            return CallKind.MAIN.value

    async def _generate(
        self,
        request: web.Request,
        mod: ModuleType,
        session: Session,
        req: ChatRequest,
        body: dict[str, Any],
        arrived: float,
    ) -> web.StreamResponse:
        rec = recording.open_record(session, mod.DIALECT.value, arrived, body, req.model)
        stepped = False

        def give_back() -> None:  # the harness saw nothing of this call's answer: its retry gets the same plan step
            session.give_back_step(rec.call_kind)

        try:
            normalized = req.normalized_dict()
            rec.call_kind = self._classify(session, normalized)
            step = session.next_step(rec.call_kind)
            stepped = True
            kind, text = plan_kind(step, self.config.tool_call_format)
            rec.served_model = await self._resolve_model(session, req.model)
            sampling = self._enforce(req, session)
            rec.request = {**normalized, "sampling": sampling}
        except ProviderError as err:
            if stepped:
                give_back()
            return await self._fail(mod, rec, err, None)
        except asyncio.CancelledError:  # the client hung up while the served model was being resolved
            await client_left(request, self.store, rec, None, give_back if stepped else None)
            raise
        call = EngineCall(req, rec.served_model, sampling, session.session_id)
        ctx = CallContext(session, rec.call_kind, call, step, kind, text)
        rec.origin = ctx.origin
        rec.policy_version = self.policy_version
        admitted = self.admission.try_enter()

        async def admit() -> None:
            """A call held by a paused admission (a weight update) waits inside its reply, so a slow stream's (and
            Google's plain call's) early headers cover the wait (proxy/streaming.py); a wait past `pause_wait_s` is
            a 503, or a dropped connection once the headers left."""
            nonlocal admitted
            await self.admission.admit()
            self.admission.enter()
            admitted = True
            rec.policy_version = self.policy_version  # the weights that answer it

        async def fail(err: ProviderError) -> web.Response:
            give_back()
            return await self._fail(mod, rec, err, call)

        try:
            if req.stream:
                gen = Generation()
                events = self.generator.events(ctx, gen)
                return await reply_stream(
                    request,
                    mod,
                    req,
                    rec,
                    call,
                    events,
                    gen,
                    self.store,
                    fail,
                    headers_after_s=self.config.stream_headers_after_s,
                    give_back=give_back,
                    admit=None if admitted else admit,
                )
            early_plain = vars(mod).get("EARLY_PLAIN_HEADERS", False)  # Google's: proxy/streaming.py (no getattr miss)
            return await reply_plain(
                request,
                mod,
                req,
                rec,
                call,
                lambda: self.generator.run(ctx),
                self.store,
                fail,
                headers_after_s=self.config.stream_headers_after_s if early_plain else None,
                give_back=give_back,
                admit=None if admitted else admit,
            )
        except ProviderError as err:
            return await fail(err)
        finally:
            if admitted:
                self.admission.leave()

    async def _fail(
        self, mod: ModuleType, rec: CompletionRecord, err: ProviderError, call: EngineCall | None
    ) -> web.Response:
        log.info("call %s failed: %d %s", rec.id, err.status, err.message)
        await self.store.commit(recording.failed(rec, recording.error_dict(err), call))
        return self._error_response(mod, err)


async def _settle(app: web.Application) -> None:
    """Once the standalone server is up: `tune_serving_process` (its docstring)."""
    tune_serving_process()


def run(
    config: ProxyConfig, *, host: str = "127.0.0.1", port: int = 8080, loop: asyncio.AbstractEventLoop | None = None
) -> None:
    """Serve until interrupted (used by `polar proxy`), on `loop` (default: `proxy.tuning.serving_loop()`); SIGINT and
    SIGTERM stop it as `web.run_app` would (in-flight calls get the runner's shutdown timeout)."""
    loop = loop or serving_loop()
    proxy = Proxy(config)
    if not proxy.base_url:
        proxy.base_url = f"http://{host}:{port}"
    print(
        f"polar proxy on {proxy.base_url} → {', '.join(config.upstreams)} (store {Path(config.store_dir)})", flush=True
    )
    if not config.control_token and not os.environ.get("POLAR_CONTROL_TOKEN"):
        print(f"control token: {proxy.control_token}", flush=True)
    asyncio.set_event_loop(loop)
    main = loop.create_task(_serve(proxy, host, port))
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        if not main.done():
            main.cancel()
            # its `finally` runs the runner's cleanup: the sites, the calls in flight, the store
            with contextlib.suppress(asyncio.CancelledError, web.GracefulExit, KeyboardInterrupt):
                loop.run_until_complete(main)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _serve(proxy: Proxy, host: str, port: int) -> None:
    app = proxy.make_app()
    app.on_startup.append(_settle)
    runner = web.AppRunner(app, access_log=None, handle_signals=True, **SERVER_OPTIONS)
    await runner.setup()
    try:
        await proxy.site(runner, host, port).start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
