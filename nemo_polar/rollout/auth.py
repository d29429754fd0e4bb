# SPDX-License-Identifier: Apache-2.0
"""The shared secret of the rollout service: who may talk to the rollout server and its gateway nodes.

Every route of the rollout server and of a gateway (tasks, results, events, node registration and heartbeats,
sessions, health, metrics) requires `Authorization: Bearer <secret>` when a secret is configured, compared in
constant time; a request without it gets `401 {"error": {"message", "type": "unauthorized"}}`. Gateways send it to
the server, the server to its gateways (never to a task's `callback_url`, which is someone else's endpoint), and
`PolarClient` to the server. The secret comes from a file (`--secret-file`, or `POLAR_ROLLOUT_SECRET_FILE`) or
the environment (`POLAR_ROLLOUT_SECRET`), as the proxy's control token does. Without one the service only binds
loopback: `check_bind` refuses any other address, because anyone reaching the port could run commands through
tasks, read every session's records and register a gateway of their own.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from nemo_polar.errors import PolarError

__all__ = [
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "AuthConfigError",
    "auth_headers",
    "auth_middleware",
    "check_bind",
    "is_loopback",
    "resolve_secret",
    "service_app",
]

MAX_BODY = 64 * 1024 * 1024  # the largest request body a rollout service reads

SECRET_ENV = "POLAR_ROLLOUT_SECRET"
SECRET_FILE_ENV = "POLAR_ROLLOUT_SECRET_FILE"


class AuthConfigError(PolarError, ValueError):
    """The service's authentication set-up is unsafe or unreadable (e.g. a public bind without a secret)."""


def resolve_secret(secret_file: str | os.PathLike[str] | None = None) -> str | None:
    """The shared secret: `secret_file`, else `$POLAR_ROLLOUT_SECRET_FILE`, else `$POLAR_ROLLOUT_SECRET`, else None.
    A file's surrounding whitespace is stripped; an empty or unreadable one is an error, never "no secret"."""
    path = secret_file or os.environ.get(SECRET_FILE_ENV) or None
    if path:
        try:
            secret = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthConfigError(f"cannot read the rollout secret file {path}: {exc}") from exc
        if not secret:
            raise AuthConfigError(f"the rollout secret file {path} is empty")
        return secret
    return os.environ.get(SECRET_ENV) or None


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1); False for anything else, `0.0.0.0` included."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to a public interface


def check_bind(host: str, secret: str | None, what: str = "the rollout service") -> None:
    """Refuse to serve `what` on a non-loopback `host` without a secret."""
    if secret is None and not is_loopback(host):
        raise AuthConfigError(
            f"{what} will not bind {host!r} without a shared secret: anyone who reaches the port could submit tasks "
            f"that run commands and read every session's records. Set {SECRET_ENV} (or {SECRET_FILE_ENV}, or "
            "--secret-file) on the server, every gateway and every client, or bind 127.0.0.1."
        )


def auth_headers(secret: str | None) -> dict[str, str]:
    """The request headers that authenticate to a rollout server or gateway (none without a secret)."""
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def _presented(request: web.Request) -> bytes | None:
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip().encode("utf-8", "surrogateescape")


def service_app(
    secret: str | None,
    lifecycle: Callable[[web.Application], AsyncIterator[None]],
    routes: Sequence[tuple[str, str, Handler]],
) -> web.Application:
    """The aiohttp app of a rollout service (the server or a gateway node): bodies up to `MAX_BODY`, every route
    behind the secret, `lifecycle` as its start-up / clean-up context, and `routes` as (method, path, handler); a GET
    route answers HEAD too, as aiohttp's `add_get` does."""
    app = web.Application(client_max_size=MAX_BODY, middlewares=[auth_middleware(secret)])
    app.cleanup_ctx.append(lifecycle)
    for method, path, handler in routes:
        if method == "GET":
            app.router.add_get(path, handler)
        else:
            app.router.add_route(method, path, handler)
    return app


def auth_middleware(secret: str | None) -> Middleware:
    """An aiohttp middleware that lets a request through only with the secret (every request when it is None)."""
    expected = secret.encode("utf-8") if secret else None

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is not None:
            presented = _presented(request)
            # constant time in the secret's content (hmac.compare_digest); a missing header is refused the same way
            if presented is None or not hmac.compare_digest(presented, expected):
                return web.json_response(
                    {
                        "error": {
                            "message": "missing or wrong rollout secret (Authorization: Bearer <secret>)",
                            "type": "unauthorized",
                        }
                    },
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="polar-rollout"'},
                )
        return await handler(request)

    return authenticate
