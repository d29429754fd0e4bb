# SPDX-License-Identifier: Apache-2.0
"""`polar_agent`: a NeMo Gym agent that runs one unmodified coding-agent CLI session through Polar.

`POST /run` (one Gym row) = seed `polar_swe` (which starts its hosted Polar stack, with the upstream this agent
resolves from Gym's model server config) → `POST /tasks` to the rollout server in `polar_swe`'s process: a
one-sample TaskSpec with the configured `harness` and `builder` → the session's main chain as Gym output items
whose last item per model call carries `prompt_token_ids` / `generation_token_ids` / `generation_log_probs`
(one contiguous chain, as NeMo RL requires) → `polar_swe /verify` (the swe_tests verdict the gateway computed in
the evaluation runtime it prewarmed while the agent ran; `polar_session_id` names the session) → the verify
JSON plus `polar_calls` (docs/nemo.md: one entry per generated segment of the delivered chain) and `polar` (builder
stats with `delivered_fraction`, and every other chain, reported rather than silently lost), and the delivery numbers
as top-level keys (`polar_delivered_tokens_fraction`, ...: NeMo RL logs them per step); the first time a session
leaves a kind of chain out, a warning says how much (docs/nemo.md).

The agent runs no model calls itself (`/v1/responses` is refused): the harness talks to the proxy.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

from fastapi import Body, HTTPException
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
from nemo_gym.global_config import get_first_server_config_dict
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import get_response_json, raise_for_status
from pydantic import ConfigDict, Field

sys.path.insert(0, str(Path(__file__).resolve().parent))  # siblings, however Gym or a test imports this file
from convert import delivery_metrics, gym_response, polar_calls, polar_summary, undelivered_note

from nemo_polar.data.swe_gym import task_from_gym_row
from nemo_polar.rollout.client import PolarClient
from nemo_polar.types import CompletionRecord, SessionResult

log = logging.getLogger("polar_agent")


class PolarAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    harness: str = Field(default="qwen_code", description="harness adapter name (claude_code, codex, pi, ...)")
    builder: str = Field(default="prefix_merging", description="prefix_merging | per_request")
    model: str | None = Field(default=None, description="served model name (default: the model server's `model`)")
    upstream_url: str | None = Field(
        default=None, description="vLLM base URL for the proxy (default: the model server's base_url)"
    )
    sampling: dict[str, Any] = Field(default_factory=dict)
    agent_options: dict[str, Any] = Field(default_factory=dict, description="harness options, e.g. max_turns")
    builder_options: dict[str, Any] = Field(default_factory=dict)
    agent_timeout_s: float = 900.0
    session_timeout_s: float = 1800.0
    evaluator_timeout_s: float = 600.0
    annotate_calls: bool = Field(default=True, description="attach CALL-CREDIT `polar_calls` to each result")


class PolarAgentRunRequest(BaseRunRequest):
    """One `polar_swe` row (schema: resources_servers/polar_swe/task_data.py); extra keys pass through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    instance_id: str
    runtime: dict[str, Any]
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)


class PolarAgentVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    polar_calls: list[dict[str, Any]] | None = None
    polar: dict[str, Any] = Field(default_factory=dict)
    # NeMo RL reads the mask flag from here (`full_result["instance_config"]["mask_sample"]`, rollouts.py at the
    # pinned commit); the top-level `mask_sample` stays for Gym's own metrics and readers of the verify JSON
    instance_config: dict[str, Any] = Field(default_factory=dict)
    # what of the session this one record delivers (convert.delivery_metrics); NeMo RL logs top-level numbers
    polar_delivered_calls_fraction: float | None = None
    polar_delivered_tokens_fraction: float | None = None
    polar_delivered_trainable_fraction: float | None = None
    polar_undelivered_calls: int | None = None
    polar_undelivered_tokens: int | None = None


class PolarAgent(SimpleResponsesAPIAgent):
    ray_enabled: ClassVar[bool | None] = False  # Gym 0.7 reads it from the class; 0.5.1 does not know it
    config: PolarAgentConfig
    _warned_chains: ClassVar[set[str]] = set()  # chain kinds already warned about in this process

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        raise HTTPException(400, "polar_agent runs a harness CLI through the Polar proxy; POST /run a task row")

    def _upstream(self) -> tuple[str, str | None]:
        """(vLLM base URL, served model): the config's, else the model server's `base_url` and `model` (the
        vLLM endpoint itself, docs/nemo.md), else Gym's own model server URL for this rollout."""
        model = self.config.model
        if self.config.upstream_url:
            return self.config.upstream_url, model
        cfg = get_first_server_config_dict(self.server_client.global_config_dict, self.config.model_server.name)
        base = cfg.get("base_url") if cfg is not None else None
        if isinstance(base, (list, tuple)) or (base is not None and type(base).__name__ == "ListConfig"):
            base = next(iter(base), None)
        model = model or (cfg.get("model") if cfg is not None else None)
        if base:
            return str(base), model
        return self.resolve_model_base_url(self.config.model_server.name), model

    async def _post(self, url_path: str, json: dict[str, Any]) -> Any:
        resp = await self.server_client.post(
            server_name=self.config.resources_server.name, url_path=url_path, json=json
        )
        await raise_for_status(resp)
        return await get_response_json(resp)

    async def _get(self, url_path: str) -> Any:
        resp = await self.server_client.get(server_name=self.config.resources_server.name, url_path=url_path)
        await raise_for_status(resp)
        return await get_response_json(resp)

    async def run(self, body: PolarAgentRunRequest = Body()) -> PolarAgentVerifyResponse:
        row = body.model_dump(mode="json")
        upstream, model = self._upstream()
        seed = await self._post("/seed_session", {**row, "upstream_url": upstream, "model": model})
        c = self.config
        task = task_from_gym_row(
            row,
            task_id=f"{body.instance_id}.{uuid.uuid4().hex[:12]}",
            harness=c.harness,
            builder=c.builder,
            model=seed.get("served_model") or model,
            sampling=c.sampling,
            agent_options=c.agent_options,
            agent_timeout_s=c.agent_timeout_s,
            timeout_s=c.session_timeout_s,
            builder_options=c.builder_options,
            evaluator_timeout_s=c.evaluator_timeout_s,
        )
        # The gateway's POSTRUN runs swe_tests in the evaluation runtime it prewarmed while the agent ran; polar_swe's
        # /verify (the verdict) returns that evaluation for this session instead of building a runtime of its own
        t0 = time.monotonic()
        async with PolarClient(seed["rollout_url"], poll_wait_s=10.0) as polar:
            await polar.submit(task)
            results = await polar.collect(task.task_id)
        if len(results) != 1:
            raise HTTPException(502, f"the rollout service returned {len(results)} results for one sample")
        result: SessionResult = results[0]
        session = await self._get(f"/polar/sessions/{result.session_id}")
        records = [CompletionRecord.from_dict(r) for r in session["records"]]
        response = gym_response(result, records, model=task.agent.model or "polar", created_at=int(time.time()))
        verify = await self._post(
            "/verify", {**row, "response": response, "diff": session["diff"], "polar_session_id": result.session_id}
        )
        out = PolarAgentVerifyResponse.model_validate(verify)
        out.polar = polar_summary(result, elapsed_s=time.monotonic() - t0, records=records)
        sent = out.polar["delivery"]
        for key, value in delivery_metrics(sent).items():
            setattr(out, key, value)
        self._warn_undelivered(sent, result.session_id)
        if c.annotate_calls:
            out.polar_calls = polar_calls(result, records, harness=c.harness)
        ev = result.eval
        failed = result.metadata.get("failure")  # the rollout itself failed (not the evaluation: /verify owns it)
        if result.status == "ERROR" or (failed and ev is not None and ev.mask_sample):
            out.mask_sample = True
            kind = (result.metadata.get("failure") or {}).get("kind") or (ev.failure_kind if ev else None)
            out.failure_kind = f"polar_swe:{kind or 'rollout_failed'}"
            out.failure_reason = (ev.failure_reason if ev else None) or out.failure_reason
        return with_instance_config(out)

    def _warn_undelivered(self, sent: dict[str, Any], session_id: str) -> None:
        """Warn when a session leaves out a kind of chain not seen left out before in this process (the per-step
        numbers are in NeMo RL's metrics; one line per new kind keeps a 64-session step readable)."""
        kinds = {c["chain"] for c in sent["chains"] if not c["delivered"] and c["calls"]}
        if kinds - self._warned_chains:
            self._warned_chains.update(kinds)
            note = undelivered_note(sent, session_id=session_id)
            if note:
                log.warning("polar_agent (%s): %s", self.config.harness, note)


def with_instance_config(out: PolarAgentVerifyResponse) -> PolarAgentVerifyResponse:
    """`instance_config.mask_sample` = the result's `mask_sample` (False when absent): where NeMo RL looks."""
    masked = bool(getattr(out, "mask_sample", False))
    out.instance_config = {**out.instance_config, "mask_sample": masked}
    return out


if __name__ == "__main__":
    PolarAgent.run_webserver()
