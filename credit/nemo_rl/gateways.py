# SPDX-License-Identifier: Apache-2.0
"""Pause, stamp and resume the Polar gateways around each NeMo RL weight refit.

A refit swaps the weights behind the vLLM servers the Polar proxies forward to. Around it the launcher's patch
calls, on each gateway's proxy (`nemo_polar.proxy.app` admin API, control token from `POLAR_CONTROL_TOKEN` as
`Authorization: Bearer`): `POST /admin/pause` with `{"timeout_s": T}` (stop admitting new model calls and wait
up to T for in-flight calls to finish on the old weights; a pause that did not drain is logged), then after the
update `POST /admin/policy_version` with `{"policy_version": N}` (records made from now on carry N) and
`POST /admin/resume`. N counts the refits done in this process (the first
refit, before step 1, stamps 1). A failed resume is retried and then raised: a gateway left paused would stall
every rollout.

The targets are the proxies listed under `polar.gateways` in the recipe (standalone gateways, `polar launch
--ray`) plus whatever `discover()` returns at each refit: in a Gym launch, the `polar_swe` servers hosting a Polar
stack (`hosted.HostedStacks`; their `/polar/admin/*` routes mirror the proxy's, so a target is `http://HOST:PORT/
polar`). The targets found at the pause are the ones stamped and resumed.

Does: a small synchronous admin client (the trainer's driver is synchronous; every request has a timeout) and
the wrapper of `refit_policy_generation`. Does not: find the hosted stacks itself (`hosted.py`) or import
`nemo_rl` at module level.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from nemo_polar.errors import PolarError

from .pinned import REFIT_NAME
from .wrapping import wrap

log = logging.getLogger(__name__)

_WRAPPED_FLAG = "__polar_refit_wrapped__"
CONTROL_TOKEN_ENV = "POLAR_CONTROL_TOKEN"


class GatewayAdminError(PolarError, RuntimeError):
    """A gateway did not accept an admin call (after retries)."""

    def __init__(self, url: str, detail: str):
        self.url = url
        self.detail = detail
        super().__init__(f"{url}: {detail}")


class GatewayAdmin:
    """Admin calls to a set of Polar gateway proxies (`base_urls`, loopback in tests) and to those `discover()`
    returns when a pause begins (the hosted stacks of a Gym launch)."""

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        timeout_s: float = 30.0,
        attempts: int = 3,
        discover: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self.static_urls = [u.rstrip("/") for u in base_urls]
        self.base_urls = list(self.static_urls)
        self.discover = discover
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.policy_version = 0
        self._token = os.environ.get(CONTROL_TOKEN_ENV)

    def refresh(self) -> list[str]:
        """The targets from now until the next pause: the static ones, then the discovered ones."""
        found = [u.rstrip("/") for u in self.discover()] if self.discover is not None else []
        self.base_urls = [*self.static_urls, *(u for u in found if u not in self.static_urls)]
        return self.base_urls

    def _post(self, base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{base}{path}"
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        last = ""
        for attempt in range(self.attempts):
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                # the pause waits up to timeout_s on the gateway side: give the HTTP call a margin on top
                with urllib.request.urlopen(request, timeout=self.timeout_s + 10.0) as response:
                    if 200 <= response.status < 300:
                        payload = response.read()
                        try:
                            reply = json.loads(payload) if payload else {}
                        except ValueError:
                            reply = {}
                        return reply if isinstance(reply, dict) else {}
                    last = f"HTTP {response.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read()[:200]!r}"
                if 400 <= exc.code < 500 and exc.code != 429:
                    break  # the gateway refused the call itself; retrying will not help
            except (urllib.error.URLError, TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < self.attempts:
                time.sleep(min(2.0, 0.2 * 2**attempt) * (0.5 + random.random() / 2))
        raise GatewayAdminError(url, last)

    def _all(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        errors = []
        replies = []
        for base in self.base_urls:
            try:
                replies.append(self._post(base, path, body))
            except GatewayAdminError as exc:
                errors.append(str(exc))
        if errors:
            raise GatewayAdminError(path, "; ".join(errors))
        return replies

    def pause(self) -> None:
        self.refresh()
        for base, reply in zip(self.base_urls, self._all("/admin/pause", {"timeout_s": self.timeout_s}), strict=True):
            if reply.get("drained") is False:
                log.warning("Polar gateway %s paused with %s call(s) still in flight", base, reply.get("in_flight"))

    def set_policy_version(self, version: int) -> None:
        self._all("/admin/policy_version", {"policy_version": version})
        self.policy_version = version

    def resume(self) -> None:
        self._all("/admin/resume", {})


def wrap_refit(grpo_module: ModuleType, admin: GatewayAdmin) -> Callable[..., Any]:
    """Wrap `<grpo_module>.refit_policy_generation` with pause → refit → policy_version → resume (idempotent)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def refit_policy_generation(*args: Any, **kwargs: Any) -> Any:
            admin.pause()
            try:
                result = original(*args, **kwargs)
            except BaseException:
                admin.resume()  # the old weights are still serving: let rollouts continue, then re-raise
                raise
            admin.set_policy_version(admin.policy_version + 1)
            admin.resume()
            log.info("Polar gateways resumed at policy_version %d", admin.policy_version)
            return result

        return refit_policy_generation

    return wrap(grpo_module, REFIT_NAME, make, _WRAPPED_FLAG)
