# SPDX-License-Identifier: Apache-2.0
"""`polar_swe`: a NeMo Gym resources server that hosts a Polar gateway and verifies SWE tasks with `swe_tests`.

Gym endpoints: `POST /seed_session` (starts the hosted Polar stack once — proxy, gateway, rollout server — and
returns where the agent submits its task), `POST /verify` (the agent's diff applied to a FRESH runtime of the task
repo, exactly the FAIL_TO_PASS / PASS_TO_PASS tests run; reward = resolved; infrastructure failures set
`mask_sample` and a `failure_kind`; with `polar_session_id` naming a session of the hosted stack whose gateway ran
those very tests on that very diff — in the evaluation runtime it prewarmed while the agent ran — that verdict is
returned and no runtime is built: `evaluated_in` says which), `POST /close_session`, `POST /aggregate_metrics`,
`GET /reverify_mode`.
Polar endpoints: `GET /polar/status`, `GET /polar/sessions/{session_id}` (the session's diff and its proxy
records, for the agent's conversion), and the trainer's refit hooks: `POST /polar/admin/pause` (`{"timeout_s": T}`),
`POST /polar/admin/policy_version` (`{"policy_version": N}`), `POST /polar/admin/resume`, `GET /polar/admin/status`
— the hosted proxies' admin API (they bind loopback) for every proxy of this process, guarded by
`POLAR_CONTROL_TOKEN` (`Authorization: Bearer`) when that is set; the launcher finds this server through Gym's head
server (`nemo_polar.credit.nemo_rl.hosted`). The stack itself is `polar_stack.py`; `VERIFIER_FIXTURE` exercises `verify`
without a server (`tests/verifier_cases.jsonl`). This module does not run agents.
"""

from __future__ import annotations

import faulthandler
import io
import os
import secrets
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar, Literal

from fastapi import FastAPI, HTTPException, Request
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.verifier_fixture import VerifierFixture
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictInt, StrictStr

sys.path.insert(0, str(Path(__file__).resolve().parent))  # siblings, however Gym or a test imports this file
from gym_compat import (
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
)
from polar_stack import PolarStack, UpstreamMismatch, stack_config

from nemo_polar.evaluators import EvalContext, run_evaluator
from nemo_polar.evaluators.base import failure
from nemo_polar.proxy.tuning import tune_serving_process
from nemo_polar.rollout.runtime import Runtime, RuntimeSetupError, create_runtime
from nemo_polar.rollout.spec import RuntimeSpec
from nemo_polar.types import EvalResult


def enable_crash_stacks() -> bool:
    """`faulthandler` on in this serving process (unless it is on already): a fatal error, such as a crash in a C
    module the hosted stack loads, then prints every thread's stack to stderr, which Gym and Ray pass on. False
    where stderr has no file descriptor to write to."""
    if faulthandler.is_enabled():
        return True
    try:
        faulthandler.enable()
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return False
    return True


# swe_tests failure kinds that measure the policy (kept for training); every other kind is infrastructure
_POLICY_FAILURES = frozenset({"patch_apply_failed", "test_timeout"})


class PolarSweResourcesServerConfig(BaseResourcesServerConfig):
    work_dir: str | None = Field(default=None, description="run directory (default: the cache dir, per process)")
    upstream_urls: list[str] = Field(default_factory=list, description="vLLM base URLs; empty: from the first seed")
    served_model: str | None = None
    prefix_preserving: Literal["splice", "nemo_rl"] | None = Field(
        default=None, description="None | splice (stock vLLM; needs model_dir) | nemo_rl"
    )
    model_dir: str | None = Field(
        default=None, description="model directory (tokenizer + chat template) for splice and canonical forced tokens"
    )
    forced_tokens: Literal["grammar", "canonical"] = Field(
        default="grammar",
        description="forced and choose plan steps: grammar (spelled under a grammar, re-scored) | canonical "
        "(the tokenizer's own spelling, scored; needs model_dir)",
    )
    eot_token_ids: list[int] | None = None
    sampling: dict[str, Any] = Field(default_factory=dict, description="sampling the proxy enforces")
    routing: Literal["sticky", "round_robin"] = Field(
        default="sticky", description="several upstreams: sticky (a session stays on one) | round_robin"
    )
    session_deltas: bool = Field(
        default=True, description="the record store writes a record extending its session's prompt as what is new"
    )
    read_timeout_s: float = Field(
        default=600.0, gt=0, description="the longest silence the proxy waits for from vLLM in an answer (then 504)"
    )
    pause_wait_s: float = Field(
        default=600.0, gt=0, description="how long a call waits while admission is paused for a weight update (503)"
    )
    init_workers: int = 2
    ready_buffer: int = 2
    run_slots: int = 2
    postrun_workers: int = 2
    gateways: int = Field(default=1, ge=1, description="gateway nodes in this process (several: work_dir/<node>/)")
    max_attempts: int = Field(default=2, ge=1, description="attempts per sample the rollout server dispatches")
    node_timeout_s: float = Field(default=300.0, gt=0, description="a gateway silent this long is declared lost")
    verify_timeout_s: float = 600.0


class PolarSweSeedSessionRequest(BaseSeedSessionRequest):
    """The agent's seed: the Gym row plus where the proxy's upstream is (extra row keys are ignored)."""

    model_config = ConfigDict(extra="allow")

    upstream_url: str | None = None
    model: str | None = None


class PolarSweSeedSessionResponse(BaseSeedSessionResponse):
    rollout_url: str
    proxy_url: str
    served_model: str | None = None


class PolarSweVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    instance_id: str
    runtime: dict[str, Any]
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    diff: str
    polar_session_id: str | None = Field(
        default=None, description="the hosted stack's session that produced `diff` (its gateway's evaluation)"
    )


class PolarSweVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    resolved: bool = False
    fail_to_pass_rate: float = 0.0
    pass_to_pass_rate: float = 0.0
    test_outcomes: dict[str, str] = Field(default_factory=dict, description="node id -> PASSED / FAILED / ...")
    empty_patch: bool = False
    evaluated_in: Literal["session", "fresh"] = Field(
        default="fresh", description="session: the gateway's evaluation of this session; fresh: a runtime built here"
    )


class PolarAdminPauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(default=60.0, ge=0, description="wait this long for the calls in flight")


class PolarAdminPolicyVersionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy_version: StrictInt | StrictStr | None


CONTROL_TOKEN_ENV = "POLAR_CONTROL_TOKEN"


def check_control(request: Request) -> None:
    """401 unless the request carries this process's `POLAR_CONTROL_TOKEN` (no token set: the admin routes are as
    open as Gym's own endpoints)."""
    want = os.environ.get(CONTROL_TOKEN_ENV)
    if not want:
        return
    tok = request.headers.get("x-polar-control-token")
    if tok is None:
        auth = request.headers.get("Authorization", "")
        tok = auth[7:].strip() if auth[:7].lower() == "bearer " else None
    if tok is None or not secrets.compare_digest(tok, want):
        raise HTTPException(401, "bad or missing control token")


def _default_work_dir(name: str) -> str:
    cache = Path(os.environ.get("POLAR_CACHE_DIR") or Path.home() / ".cache" / "nemo-polar")
    return str(cache / "run" / "gym" / f"{name or 'polar_swe'}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


class PolarSweVerifier:
    """`verify` alone (what VERIFIER_FIXTURE exercises): swe_tests on a fresh runtime under `runtimes_dir`."""

    def verify_timeout_s(self) -> float:
        return 600.0

    def runtimes_dir(self) -> Path:
        return Path(tempfile.gettempdir()) / "polar_swe-verify"

    async def verify(self, body: PolarSweVerifyRequest) -> PolarSweVerifyResponse:
        ev = self.session_verdict(body)
        evaluated_in = "session" if ev is not None else "fresh"
        if ev is None:
            ev = await self._evaluate(body)
        kind = ev.failure_kind
        return PolarSweVerifyResponse(
            **body.model_dump(),
            reward=float(ev.reward),
            resolved=ev.resolved,
            mask_sample=ev.mask_sample,
            failure_kind=None if kind is None else f"polar_swe:{kind}",
            failure_reason=ev.failure_reason,
            fail_to_pass_rate=float(ev.metrics.get("fail_to_pass_rate", 0.0)),
            pass_to_pass_rate=float(ev.metrics.get("pass_to_pass_rate", 0.0)),
            test_outcomes={**ev.details.get("FAIL_TO_PASS", {}), **ev.details.get("PASS_TO_PASS", {})},
            empty_patch=bool(ev.details.get("empty_patch", False)),
            evaluated_in=evaluated_in,
        )

    def session_verdict(self, body: PolarSweVerifyRequest) -> EvalResult | None:
        """The evaluation a hosted gateway already made for this request (None: none here that fits)."""
        return None

    async def _evaluate(self, body: PolarSweVerifyRequest) -> EvalResult:
        try:
            spec = RuntimeSpec.model_validate(body.runtime)
        except ValueError as exc:
            return failure("runtime_invalid", str(exc), mask_sample=True)
        root = self.runtimes_dir() / f"{body.instance_id}-{uuid.uuid4().hex[:12]}"
        made: list[Runtime] = []

        async def fresh() -> Runtime:
            rt = await create_runtime(f"verify-{body.instance_id}", spec, root / f"fresh{len(made)}")
            made.append(rt)
            return rt

        ctx = EvalContext(
            task_id=body.instance_id,
            sample_index=0,
            instruction="",
            options={"FAIL_TO_PASS": body.FAIL_TO_PASS, "PASS_TO_PASS": body.PASS_TO_PASS},
            status="COMPLETED",
            diff=body.diff,
            session_dir=root,
            fresh_runtime=fresh,
        )
        try:
            ev = await run_evaluator("swe_tests", ctx, timeout_s=self.verify_timeout_s())
        except RuntimeSetupError as exc:  # pragma: no cover - run_evaluator contains evaluator errors
            ev = failure("runtime_unavailable", str(exc), mask_sample=True)
        finally:
            for rt in made:
                await rt.destroy()
        if ev.failure_kind is not None and ev.failure_kind not in _POLICY_FAILURES:
            ev.mask_sample = True
        return ev


class PolarSweResourcesServer(PolarSweVerifier, SimpleResourcesServer):
    # the Polar stack schedules its own sessions; this process needs no Ray connection
    ray_enabled: ClassVar[bool | None] = False
    config: PolarSweResourcesServerConfig
    _stack: PolarStack | None = PrivateAttr(default=None)
    _closed: set[str] = PrivateAttr(default_factory=set)

    @property
    def stack(self) -> PolarStack:
        if self._stack is None:
            c = self.config
            self._stack = PolarStack(stack_config(c.work_dir or _default_work_dir(c.name), c.model_dump()))
        return self._stack

    def verify_timeout_s(self) -> float:
        return self.config.verify_timeout_s

    def runtimes_dir(self) -> Path:
        return Path(self.stack.config.work_dir) / "verify"

    def session_verdict(self, body: PolarSweVerifyRequest) -> EvalResult | None:
        """The swe_tests verdict the gateway computed for `body.polar_session_id`, when it ran exactly this
        request's tests on exactly this diff (else None: a fresh runtime evaluates). A verdict without test
        outcomes (a patch that did not apply, an infrastructure failure) is evaluated again here."""
        if not body.polar_session_id:
            return None
        result = self.stack.result(body.polar_session_id)
        ev = result.eval if result is not None else None
        if ev is None or ev.failure_kind is not None or self.stack.diff(body.polar_session_id) != body.diff:
            return None
        if not body.diff.strip():  # nothing to test: swe_tests' empty-patch verdict (no runtime either way)
            return ev if ev.details.get("empty_patch") else None
        ran = (ev.details.get("FAIL_TO_PASS"), ev.details.get("PASS_TO_PASS"))
        if not all(isinstance(r, dict) for r in ran) or [list(r) for r in ran] != [
            body.FAIL_TO_PASS,
            body.PASS_TO_PASS,
        ]:
            return None
        return ev

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.get("/polar/status")(self.polar_status)
        app.get("/polar/sessions/{session_id}")(self.polar_session)
        app.post("/polar/admin/pause")(self.polar_pause)
        app.post("/polar/admin/resume")(self.polar_resume)
        app.post("/polar/admin/policy_version")(self.polar_policy_version)
        app.get("/polar/admin/status")(self.polar_admin_status)
        inner = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
            enable_crash_stacks()
            tune_serving_process()  # this process serves the stack's model calls (nemo_polar/proxy/tuning.py)
            if self.config.upstream_urls:  # configured upstream: up before the first request
                await self.stack.ensure()
            async with inner(app) as state:
                try:
                    yield state
                finally:
                    await self.stack.stop()

        app.router.lifespan_context = lifespan
        return app

    async def seed_session(
        self, body: ResourcesSeedSessionRequest | PolarSweSeedSessionRequest
    ) -> ResourcesSeedSessionResponse | PolarSweSeedSessionResponse:
        if isinstance(body, ResourcesSeedSessionRequest):  # an Environment Server seeding: no per-session state
            if body.resources_session_id in self._closed:
                raise HTTPException(409, f"resources session {body.resources_session_id!r} is closed")
            return ResourcesSeedSessionResponse(resources_session_id=body.resources_session_id)
        try:
            await self.stack.ensure(body.upstream_url, body.model)
        except UpstreamMismatch as exc:
            raise HTTPException(409, str(exc)) from exc
        s = self.stack
        return PolarSweSeedSessionResponse(
            rollout_url=s.rollout_url, proxy_url=s.proxy_url, served_model=s.config.served_model
        )

    async def close_resources_session(self, body: ResourcesCloseSessionRequest) -> ResourcesCloseSessionResponse:
        self._closed.add(body.resources_session_id)
        return ResourcesCloseSessionResponse(resources_session_id=body.resources_session_id)

    async def polar_status(self) -> dict[str, Any]:
        return {"pid": os.getpid(), **self.stack.status()}

    async def polar_pause(self, request: Request, body: PolarAdminPauseRequest) -> dict[str, Any]:
        check_control(request)
        return await self.stack.pause(body.timeout_s)

    async def polar_resume(self, request: Request) -> dict[str, Any]:
        check_control(request)
        return self.stack.resume()

    async def polar_policy_version(self, request: Request, body: PolarAdminPolicyVersionRequest) -> dict[str, Any]:
        check_control(request)
        return self.stack.set_policy_version(body.policy_version)

    async def polar_admin_status(self, request: Request) -> dict[str, Any]:
        check_control(request)
        return {"pid": os.getpid(), **self.stack.status()}

    async def polar_session(self, session_id: str) -> dict[str, Any]:
        diff = self.stack.diff(session_id)
        if diff is None:
            raise HTTPException(404, f"no finished session {session_id!r} here")
        records = await self.stack.records(session_id)
        return {"session_id": session_id, "diff": diff, "records": [r.to_dict() for r in records]}


VERIFIER_FIXTURE = VerifierFixture(
    server_factory=PolarSweVerifier,
    request_model=PolarSweVerifyRequest,
    cases_path=Path(__file__).parent / "tests" / "verifier_cases.jsonl",
)


if __name__ == "__main__":
    PolarSweResourcesServer.run_webserver()
