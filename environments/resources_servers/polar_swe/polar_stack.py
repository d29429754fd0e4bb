# SPDX-License-Identifier: Apache-2.0
"""The Polar stack the `polar_swe` process hosts (docs/nemo.md): the model-API proxy (capture of token ids and
logprobs from vLLM), the gateway node (staged pools, runtimes, builders, evaluators) and the rollout server it
registers with — all in this process's event loop, each on its own 127.0.0.1 port, assembled by
`nemo_polar.rollout.stack` from the server config's fields (`stack_config`: every stack option is a config field).

The upstream (vLLM's OpenAI endpoint) comes from the server config (`upstream_urls`) or, when that is empty, from
the first `seed_session` (the agent resolves it from Gym's model server config). A later seed naming another
upstream is refused: one process, one policy. This module knows nothing of Gym's request models.

Around a trainer's weight update the process's proxies are paused, stamped with the new policy version and resumed
together (`pause` / `set_policy_version` / `resume`: what `POST /polar/admin/*` calls, docs/nemo.md). The state is
kept here, so a pause or a version that arrives before the stack has started (NeMo RL refits once before its first
rollout, the stack starts on the first seed) applies to the proxies as they start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from nemo_polar.errors import PolarError
from nemo_polar.rollout.stack import OPTION_GROUPS, Stack, StackConfig, start_stack
from nemo_polar.types import CompletionRecord, SessionResult

__all__ = ["GYM_FIELD", "PolarStack", "UpstreamMismatch", "stack_config"]

log = logging.getLogger(__name__)

# stack option -> the polar_swe config field that sets it, where the names differ (every other option of
# `OPTION_GROUPS` is a config field of the same name)
GYM_FIELD = {"upstreams": "upstream_urls"}


class UpstreamMismatch(PolarError, ValueError):
    """A seed asked for an upstream other than the one this process already proxies."""


def stack_config(work_dir: str, options: Mapping[str, Any]) -> StackConfig:
    """The stack of a `polar_swe` process from its config's fields (`options`: the config as a mapping). Node
    `polar_swe-0` (`polar_swe-<i>` with several gateways); the gateways live in this process, so a heartbeat late
    because the loop was busy (a tokenizer load, a burst of commits on a loaded machine) is not a lost node: the
    loss timeout defaults to a generous 300 s here."""
    values: dict[str, Any] = {"node_timeout_s": 300.0, "dispatch_grace_s": 60.0, "heartbeat_s": 0.5}
    for group in OPTION_GROUPS.values():
        for opt in group:
            key = GYM_FIELD.get(opt, opt)
            if opt != "work_dir" and options.get(key) is not None:
                values[opt] = options[key]
    n = int(values.get("gateways", 1))
    values["node_ids"] = ["polar_swe-0"] if n == 1 else [f"polar_swe-{i}" for i in range(n)]
    return StackConfig(work_dir=work_dir, **values)


def _norm(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class PolarStack:
    """The process's stack, started once (lazily: the upstream may come with the first seed)."""

    def __init__(self, config: StackConfig):
        self.config = config
        self.stack: Stack | None = None
        self._lock = asyncio.Lock()
        self.paused = False
        self.policy_version: int | str | None = None

    @property
    def started(self) -> bool:
        return self.stack is not None

    @property
    def proxy_url(self) -> str:
        proxy = self.stack.proxy if self.stack is not None else None
        return proxy.base_url if proxy is not None else ""

    @property
    def rollout_url(self) -> str:
        return (self.stack.server_url or "") if self.stack is not None else ""

    @property
    def gateway_url(self) -> str:
        return self.stack.gateway_urls[0] if self.stack is not None and self.stack.gateway_urls else ""

    @property
    def upstreams(self) -> list[str]:
        return [_norm(u) for u in self.config.upstreams]

    async def ensure(self, upstream_url: str | None = None, model: str | None = None) -> None:
        """Start the stack once (with `upstream_url` when the config names none); refuse a different upstream."""
        async with self._lock:
            if self.started:
                if upstream_url and self.config.upstreams and _norm(upstream_url) not in self.upstreams:
                    raise UpstreamMismatch(
                        f"this polar_swe process proxies {self.upstreams}; a seed asked for {_norm(upstream_url)}"
                    )
                return
            update: dict[str, Any] = {"upstreams": self.upstreams}
            if not self.config.upstreams:
                if not upstream_url:
                    raise UpstreamMismatch("no upstream: set upstream_urls in the config or pass upstream_url")
                update["upstreams"] = [_norm(upstream_url)]
            if model and not self.config.served_model:
                update["served_model"] = model
            self.config = StackConfig(**{**self.config.model_dump(), **update})
            stack = await start_stack(self.config)
            for hosted in stack.proxies:  # what the trainer asked for before the stack existed
                if self.policy_version is not None:
                    hosted.proxy.set_policy_version(self.policy_version)
                if self.paused:
                    hosted.proxy.admission.admitting.clear()
            self.stack = stack

    def _proxies(self) -> list[Any]:
        return [hosted.proxy for hosted in self.stack.proxies] if self.stack is not None else []

    async def pause(self, timeout_s: float) -> dict[str, Any]:
        """Stop admitting model calls on every proxy; wait up to `timeout_s` for the calls in flight to finish."""
        self.paused = True
        proxies = self._proxies()
        drained = await asyncio.gather(*(p.admission.pause(timeout_s) for p in proxies))
        return {
            "paused": True,
            "drained": all(drained),
            "in_flight": sum(p.admission.in_flight for p in proxies),
            "proxies": len(proxies),
        }

    def resume(self) -> dict[str, Any]:
        self.paused = False
        for p in self._proxies():
            p.admission.admitting.set()
        return {"paused": False, "policy_version": self.policy_version, "proxies": len(self._proxies())}

    def set_policy_version(self, version: int | str | None) -> dict[str, Any]:
        """Records made from now on (by every proxy of this process, started or not yet) carry `version`."""
        self.policy_version = version
        for p in self._proxies():
            p.set_policy_version(version)
        return {"policy_version": version, "proxies": len(self._proxies())}

    async def stop(self) -> None:
        """Gateway(s) (cancel sessions, tear runtimes down) → proxies → rollout server."""
        if self.stack is not None:
            stack, self.stack = self.stack, None
            await stack.close()

    async def records(self, session_id: str) -> list[CompletionRecord]:
        if self.stack is None:
            return []
        return await self.stack.records(session_id)

    def diff(self, session_id: str) -> str | None:
        for node_id in self.config.node_ids:
            path = self.config.node_dir(node_id).session(session_id).diff
            if path.is_file():
                return path.read_text()
        return None

    def result(self, session_id: str) -> SessionResult | None:
        """A finished session's `SessionResult` (its gateway wrote it at the end of POSTRUN), else None."""
        for node_id in self.config.node_ids:
            path = self.config.node_dir(node_id).session(session_id).result
            if path.is_file():
                return SessionResult.from_json(path.read_bytes())
        return None

    def status(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "proxy_url": self.proxy_url,
            "rollout_url": self.rollout_url,
            "gateway_url": self.gateway_url,
            "upstreams": self.upstreams,
            "served_model": self.config.served_model,
            "work_dir": self.config.work_dir,
            "paused": self.paused,
            "policy_version": self.policy_version,
        }
