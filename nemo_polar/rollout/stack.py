# SPDX-License-Identifier: Apache-2.0
"""The Polar service stack, assembled in one place: model-API proxy → gateway node(s) → rollout server.

`start_stack(StackConfig(...))` starts, in this event loop and each on its own port, the rollout server (when
`serve_rollout`), then per gateway node its hosted proxy (when `upstreams` are given) and the gateway registering
with the server (or with `server_url`); with no gateway, a standalone proxy (what `polar session run` needs). It
returns a `Stack` whose one `close()` tears everything down in reverse order (gateways first: they cancel their
sessions and kill the agents). Every entry point — `polar serve` / `serve-rollout` / `serve-gateway` / `launch
--ray`, `polar collect`, `polar session run` and the NeMo Gym `polar_swe` server — builds a `StackConfig` and calls
`start_stack`; `add_stack_flags` / `config_from_args` give every CLI the same flags for the same options
(`OPTION_GROUPS`). Prefix-preserving generation is only ever on when `prefix_preserving` says so (docs/contracts.md);
the run directory's layout is `nemo_polar.rundir`'s. This module assembles and tears down; it schedules nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_polar.keywords import same_named
from nemo_polar.proxy.config import ProxyConfig as _ProxyDefaults
from nemo_polar.rollout.auth import check_bind, resolve_secret
from nemo_polar.rollout.gateway import Gateway, GatewayConfig
from nemo_polar.rollout.proxylink import HostedProxy
from nemo_polar.rollout.server import RolloutServer, ServerConfig
from nemo_polar.rundir import RunDir
from nemo_polar.types import CompletionRecord

__all__ = [
    "OPTION_GROUPS",
    "Stack",
    "StackConfig",
    "add_option_flags",
    "add_stack_flags",
    "config_from_args",
    "flag_of",
    "parse_eot",
    "start_stack",
]

log = logging.getLogger(__name__)


class StackConfig(BaseModel):
    """One validated description of a stack. Unknown keys are refused (`extra="forbid"`)."""

    model_config = ConfigDict(extra="forbid")

    work_dir: str = Field("polar-run", description="the run directory (docs/run_directory.md)")
    host: str = Field("127.0.0.1", description="the address the rollout server and the gateways bind and advertise")
    secret: str | None = Field(
        default_factory=resolve_secret,
        repr=False,
        description="the rollout service's shared secret (auth.py; default: POLAR_ROLLOUT_SECRET(_FILE)); "
        "required for a host other than loopback",
    )

    # -- the model-API proxy: one per gateway node (its store in that node's run directory) --------------------------
    upstreams: list[str] = Field(default_factory=list, description="vLLM base URLs; none: simulation agents only")
    served_model: str | None = Field(None, description="the served model name (default: the upstream's)")
    prefix_preserving: Literal["splice", "nemo_rl"] | None = Field(
        None, description="splice (stock vLLM, needs model_dir) | nemo_rl (required_prefix_token_ids) | None: off"
    )
    model_dir: str | None = Field(
        None, description="the model's folder (tokenizer + chat template) for splice and canonical forced tokens"
    )
    forced_tokens: Literal["grammar", "canonical"] = Field(
        "grammar",
        description="forced and choose plan steps: grammar (the model spells the text under a grammar, re-scored) "
        "| canonical (the tokenizer's own spelling, scored; needs model_dir)",
    )
    eot_token_ids: list[int] | None = Field(None, description="end-of-turn ids (splice and the trajectory builders)")
    sampling: dict[str, Any] = Field(default_factory=dict, description="sampling the proxy enforces")
    routing: Literal["sticky", "round_robin"] = Field(
        "sticky",
        description="how the proxy spreads requests over several upstreams: sticky (a session stays on one; "
        "prefix-cache reuse) | round_robin (each request to the next)",
    )
    stream_headers_after_s: float | None = Field(
        _ProxyDefaults.stream_headers_after_s,
        gt=0,
        description="a stream whose first token takes longer gets its headers alone (Gemini CLI gives up on headers "
        "after 60 s; proxy/streaming.py), as does a Google generateContent call | None: headers with the answer",
    )
    session_deltas: bool = Field(
        True,
        description="the proxy's record store writes a record whose prompt extends an earlier one of its session as "
        "a delta (proxy/deltas.py; readers see whole records)",
    )
    read_timeout_s: float = Field(
        _ProxyDefaults.read_timeout_s,
        gt=0,
        description="the longest silence the proxy waits for from vLLM while reading an answer (then a 504)",
    )
    pause_wait_s: float = Field(
        _ProxyDefaults.pause_wait_s,
        gt=0,
        description="how long a call waits while admission is paused for a weight update (then a 503); the CLIs' "
        "own idle limits are raised past this and read_timeout_s together (harness_adapters.cli_idle_limit_s)",
    )

    # -- the rollout server: hosted here, or joined by URL -----------------------------------------------------------
    serve_rollout: bool = Field(True, description="host the rollout server in this stack")
    server_url: str | None = Field(None, description="the rollout server to register with (serve_rollout off)")
    port: int = Field(0, ge=0, description="the rollout server's port (0: any free port)")
    journal_path: str | None = Field(
        None, description="the rollout server's journal (default: WORK_DIR/rollout.sqlite)"
    )
    max_attempts: int = Field(2, ge=1, description="attempts per sample the server dispatches")
    node_timeout_s: float = Field(60.0, gt=0, description="a gateway silent this long is declared lost")
    dispatch_grace_s: float = Field(5.0, ge=0)

    # -- gateway nodes -----------------------------------------------------------------------------------------------
    gateways: int = Field(1, ge=0, description="gateway nodes in this process (more than one: WORK_DIR/<node_id>/)")
    node_ids: list[str] = Field(default_factory=list, description="their ids (default node-0, node-1, …)")
    gateway_port: int = Field(0, ge=0, description="the first gateway's port (0: any free port; others: any)")
    init_workers: int = Field(2, ge=1)
    ready_buffer: int = Field(2, ge=1)
    run_slots: int = Field(2, ge=1, description="concurrent agent sessions per gateway")
    postrun_workers: int = Field(2, ge=1)
    heartbeat_s: float = Field(1.0, gt=0)
    builder_options: dict[str, Any] = Field(default_factory=dict, description="defaults for the trajectory builders")
    keep_runtimes: bool = False

    @model_validator(mode="after")
    def _check(self) -> StackConfig:
        if self.prefix_preserving == "splice" and not self.model_dir:
            raise ValueError("prefix_preserving=splice needs model_dir (the model's tokenizer and chat template)")
        if self.forced_tokens == "canonical" and not self.model_dir:
            raise ValueError("forced_tokens=canonical needs model_dir (the model's tokenizer)")
        if self.serve_rollout and self.server_url:
            raise ValueError("give either serve_rollout or server_url, not both")
        if not self.node_ids:
            self.node_ids = [f"node-{i}" for i in range(self.gateways)]
        if len(self.node_ids) != self.gateways or len(set(self.node_ids)) != len(self.node_ids):
            raise ValueError(f"node_ids must be {self.gateways} distinct ids, got {self.node_ids}")
        if not self.gateways and not self.serve_rollout and not self.upstreams:
            raise ValueError("nothing to run: no rollout server, no gateway and no upstream for a proxy")
        return self

    def node_dir(self, node_id: str) -> RunDir:
        """A gateway's run directory: the stack's own with one gateway, `<work_dir>/<node_id>` with several."""
        rd = RunDir(self.work_dir)
        return rd if self.gateways <= 1 else rd.node(node_id)

    def proxy_config(self, store_dir: str) -> Any:
        from nemo_polar.proxy.app import ProxyConfig

        return ProxyConfig(
            **same_named(
                self,
                ProxyConfig,
                store_dir=store_dir,
                upstreams=list(self.upstreams),
                sampling=dict(self.sampling),
                eot_token_ids=list(self.eot_token_ids) if self.eot_token_ids else None,
            )
        )

    def gateway_config(self, node_id: str, server_url: str | None) -> GatewayConfig:
        builder_options = dict(self.builder_options)
        if self.eot_token_ids:
            builder_options.setdefault("eot_token_ids", list(self.eot_token_ids))
        cfg = GatewayConfig(
            **same_named(
                self,
                GatewayConfig,
                node_id=node_id,
                work_dir=str(self.node_dir(node_id).root),
                server_url=server_url,
                model=self.served_model or "polar",
                builder_options=builder_options,
            )
        )
        cfg.check()
        return cfg

    def server_config(self) -> ServerConfig:
        return ServerConfig(
            **same_named(
                self, ServerConfig, journal_path=self.journal_path or str(RunDir(self.work_dir).rollout_journal)
            )
        )


@dataclass
class Stack:
    """A started stack. `server_url` is the rollout server's (hosted or joined); `proxies[i]` serves
    `gateways[i]` (a standalone proxy when there is no gateway). `close()` once; `async with` closes too."""

    config: StackConfig
    server_url: str | None = None
    gateways: list[Gateway] = field(default_factory=list)
    gateway_urls: list[str] = field(default_factory=list)
    proxies: list[HostedProxy] = field(default_factory=list)
    _server_runner: web.AppRunner | None = None
    _closed: bool = False

    @property
    def proxy(self) -> HostedProxy | None:
        return self.proxies[0] if self.proxies else None

    @property
    def gateway(self) -> Gateway | None:
        return self.gateways[0] if self.gateways else None

    async def records(self, session_id: str) -> list[CompletionRecord]:
        """A session's committed records, from whichever of the stack's proxies served it."""
        for p in self.proxies:
            recs = await p.records(session_id)
            if recs:
                return recs
        return []

    async def close(self) -> None:
        """Reverse order: gateways (cancel their sessions, tear runtimes down), proxies, the rollout server.
        Every part is closed even when one fails; the first failure is raised after."""
        if self._closed:
            return
        self._closed = True
        first: BaseException | None = None
        steps: list[Any] = [g.close for g in reversed(self.gateways)] + [p.stop for p in reversed(self.proxies)]
        if self._server_runner is not None:
            steps.append(self._server_runner.cleanup)
        for step in steps:
            try:
                await step()
            except Exception as exc:
                log.exception("stack close: %s failed", step)
                first = first or exc
        self.gateways, self.proxies, self._server_runner = [], [], None
        if first is not None:
            raise first

    async def __aenter__(self) -> Stack:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def start_stack(config: StackConfig) -> Stack:
    """Start the stack `config` describes (rollout server → per node: proxy, gateway); returns once every part
    serves (the gateways register with the server in the background, as separate processes do). On any failure
    what was started is closed before the error propagates."""
    if config.serve_rollout or config.node_ids:  # refused before anything binds
        check_bind(config.host, config.secret, "the rollout service")
    stack = Stack(config)
    try:
        await asyncio.to_thread(RunDir(config.work_dir).root.mkdir, parents=True, exist_ok=True)
        if config.serve_rollout:
            runner = web.AppRunner(RolloutServer(config.server_config()).make_app(), access_log=None)
            stack._server_runner = runner
            await runner.setup()
            await web.TCPSite(runner, config.host, config.port).start()
            stack.server_url = f"http://{config.host}:{runner.addresses[0][1]}"
        else:
            stack.server_url = config.server_url
        for i, node_id in enumerate(config.node_ids):
            gw_cfg = config.gateway_config(node_id, stack.server_url)
            proxy = None
            if config.upstreams:
                proxy = await HostedProxy(config.proxy_config(gw_cfg.work_dir)).start()
                stack.proxies.append(proxy)
            gw = Gateway(gw_cfg, proxy=proxy)
            stack.gateways.append(gw)
            stack.gateway_urls.append(await gw.serve(config.host, config.gateway_port if i == 0 else 0))
        if not config.node_ids and config.upstreams:
            stack.proxies.append(await HostedProxy(config.proxy_config(config.work_dir)).start())
    except BaseException:
        await stack.close()
        raise
    log.info(
        "polar stack: rollout %s, gateways %s, proxies %s",
        stack.server_url or "none",
        ", ".join(stack.gateway_urls) or "none",
        ", ".join(p.base_url for p in stack.proxies) or "none (simulation agents only)",
    )
    return stack


# -- the CLIs' flags -------------------------------------------------------------------------------------------------

# the options a user chooses, per part of the stack a command runs; a CLI that runs a part exposes all of its
# options (tests/rollout/test_stack.py checks every CLI and the Gym config against this table)
OPTION_GROUPS: dict[str, tuple[str, ...]] = {
    "proxy": (
        "upstreams",
        "served_model",
        "prefix_preserving",
        "model_dir",
        "eot_token_ids",
        "sampling",
        "routing",
        "forced_tokens",
        "session_deltas",
        "read_timeout_s",
        "pause_wait_s",
    ),
    "server": ("max_attempts", "node_timeout_s"),
    "gateway": ("init_workers", "ready_buffer", "run_slots", "postrun_workers", "gateways", "work_dir"),
}

# option -> (flag, argparse keywords)
_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "upstreams": ("--upstream", {"action": "append", "default": [], "help": "vLLM base URL (repeatable)"}),
    "served_model": ("--model", {"default": None, "help": "served model name (default: the upstream's)"}),
    "prefix_preserving": (
        "--prefix-preserving",
        {
            "choices": ("splice", "nemo_rl", "off"),
            "default": "off",
            "help": "prefix-preserving generation: splice (stock vLLM; needs --model-dir) | nemo_rl | off",
        },
    ),
    "model_dir": (
        "--model-dir",
        {"default": None, "help": "the model's folder (tokenizer, chat template) for splice"},
    ),
    "eot_token_ids": ("--eot-token-ids", {"default": None, "help": "comma-separated end-of-turn token ids"}),
    "sampling": (
        "--sampling",
        {"default": None, "help": 'sampling the proxy enforces, JSON (e.g. {"temperature": 1})'},
    ),
    "routing": (
        "--routing",
        {
            "choices": ("sticky", "round_robin"),
            "default": "sticky",
            "help": "several upstreams: sticky (each session stays on one; prefix-cache reuse) | round_robin",
        },
    ),
    "forced_tokens": (
        "--forced-tokens",
        {
            "choices": ("grammar", "canonical"),
            "default": "grammar",
            "help": "forced and choose plan steps: grammar (spelled under a grammar, re-scored) | canonical (the "
            "tokenizer's own spelling, scored; needs --model-dir)",
        },
    ),
    "session_deltas": (
        "--no-session-deltas",
        {
            "action": "store_false",
            "help": "the proxy writes every record whole (default: a record whose prompt extends an earlier one of "
            "its session is written as what is new; readers see whole records either way)",
        },
    ),
    "read_timeout_s": (
        "--read-timeout-s",
        {
            "type": float,
            "default": _ProxyDefaults.read_timeout_s,
            "help": "the longest silence the proxy waits for from vLLM in an answer, then a 504 (default: %(default)s)",
        },
    ),
    "pause_wait_s": (
        "--pause-wait-s",
        {
            "type": float,
            "default": _ProxyDefaults.pause_wait_s,
            "help": "how long a call waits while the proxy's admission is paused (a weight update), then a 503 "
            "(default: %(default)s)",
        },
    ),
    "max_attempts": ("--max-attempts", {"type": int, "default": 2, "help": "attempts per sample"}),
    "node_timeout_s": ("--node-timeout-s", {"type": float, "default": 60.0, "help": "gateway loss timeout"}),
    "init_workers": ("--init-workers", {"type": int, "default": 2}),
    "ready_buffer": ("--ready-buffer", {"type": int, "default": 2}),
    "run_slots": ("--run-slots", {"type": int, "default": 2, "help": "concurrent agent sessions per gateway"}),
    "postrun_workers": ("--postrun-workers", {"type": int, "default": 2}),
    "gateways": ("--gateways", {"type": int, "default": 1, "help": "gateway nodes"}),
    "work_dir": (
        "--work-dir",
        {
            "default": "polar-run",
            "help": "run directory: rollout.sqlite, records.sqlite, sessions/<session_id>/ (docs/run_directory.md)",
        },
    ),
}


def flag_of(option: str) -> str:
    """The CLI flag of a stack option (`run_slots` -> `--run-slots`)."""
    return _FLAGS[option][0]


def add_stack_flags(
    parser: argparse.ArgumentParser, parts: tuple[str, ...], *, skip: tuple[str, ...] = (), **defaults: Any
) -> None:
    """Add the flags of every option of `parts` (keys of `OPTION_GROUPS`) except `skip`; `defaults` overrides a
    flag's default by option name (`gateways=1`)."""
    add_option_flags(parser, [opt for part in parts for opt in OPTION_GROUPS[part] if opt not in skip], **defaults)


def add_option_flags(parser: argparse.ArgumentParser, options: Sequence[str], **defaults: Any) -> None:
    """Add the flags of these stack options (a CLI that defines the others itself); `defaults` as above."""
    for opt in options:
        flag, kw = _FLAGS[opt]
        kw = dict(kw)
        if opt in defaults:
            kw["default"] = defaults[opt]
        parser.add_argument(flag, dest=opt, **kw)


def parse_eot(text: str | None) -> list[int] | None:
    return [int(x) for x in text.split(",") if x.strip()] if text else None


def config_from_args(args: argparse.Namespace, **fixed: Any) -> StackConfig:
    """A `StackConfig` from the flags `add_stack_flags` added (whichever are present) plus `fixed` values.
    Raises `SystemExit` with a clear message (exit 2) when they do not form a valid stack."""
    from pydantic import ValidationError

    values: dict[str, Any] = {}
    for opt in _FLAGS:
        if hasattr(args, opt):
            values[opt] = getattr(args, opt)
    if "upstreams" in values:
        values["upstreams"] = list(values["upstreams"] or [])
    if "prefix_preserving" in values and values["prefix_preserving"] == "off":
        values["prefix_preserving"] = None
    if "eot_token_ids" in values:
        try:
            values["eot_token_ids"] = parse_eot(values["eot_token_ids"])
        except ValueError as exc:
            raise SystemExit(f"--eot-token-ids: comma-separated integers expected ({exc})") from None
    if "sampling" in values:
        try:
            values["sampling"] = json.loads(values["sampling"]) if values["sampling"] else {}
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--sampling: not JSON ({exc})") from None
        if not isinstance(values["sampling"], dict):
            raise SystemExit("--sampling: a JSON object expected")
    values.update(fixed)
    try:
        return StackConfig(**values)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'stack'}: {e['msg']}" for e in exc.errors())
        raise SystemExit(f"invalid stack options: {msgs}") from None
