# SPDX-License-Identifier: Apache-2.0
"""Proxy sessions: per-session secrets, sampling overrides, model maps, plans and the request classifier.

A session is created through the admin API (`POST /sessions`) or the Python API (`SessionManager.create`, which
also accepts a `classify(normalized_request_dict) -> "main"|"subagent"|"side"` callable: the harness adapter's
classifier, handed over without the proxy importing any adapter). Harness calls authenticate with the session's
`api_key`; an unknown key is never turned into a new session. Sessions persist in the `RecordStore`; after a
restart the sequence counter and the plan cursor continue from what the store holds.

This module does no HTTP and no inference.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nemo_polar.errors import PlanError, PolarError
from nemo_polar.proxy import plans
from nemo_polar.proxy.store import RecordStore
from nemo_polar.types import CallKind, check_think, mixed_thinking

__all__ = ["Classifier", "Plan", "PlanError", "Session", "SessionError", "SessionManager"]

Classifier = Callable[[dict[str, Any]], str]

_SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "max_tokens", "seed", "chat_template_kwargs"})
_STEP_KINDS = ("tool", "text", "live", "replay", "next_best", "choose")


class SessionError(PolarError):
    """A session operation failed (unknown id, duplicate id, closed session, bad fields)."""

    def __init__(self, message: str, *, session_id: str | None = None, status: int = 400):
        super().__init__(message)
        self.session_id = session_id
        self.status = status


@dataclass(slots=True)
class Plan:
    """A resolved plan (docs/contracts.md): steps for main-agent calls in arrival order, and the side-call policy."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    side: Any = "live"

    @classmethod
    def parse(cls, data: Any) -> Plan:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise PlanError("plan must be an object")
        if data.get("version", 1) != 1:
            raise PlanError(f"unsupported plan version {data.get('version')!r}")
        steps = data.get("steps", [])
        if not isinstance(steps, list):
            raise PlanError("plan.steps must be a list")
        for i, step in enumerate(steps):
            cls._check_step(step, f"plan.steps[{i}]")
        side = data.get("side", "live")
        if side != "live":
            if not (isinstance(side, dict) and isinstance(side.get("text"), str)):
                raise PlanError('plan.side must be "live" or {"text": "..."}')
        return cls(steps=list(steps), side=side)

    @staticmethod
    def _check_step(step: Any, where: str) -> None:
        if not isinstance(step, dict):
            raise PlanError(f"{where} must be an object")
        kinds = [k for k in _STEP_KINDS if k in step]
        if len(kinds) != 1:
            if any(k in step for k in ("shell", "edit", "write")):
                raise PlanError(f"{where}: harness-neutral steps must be resolved to tool steps before the proxy")
            raise PlanError(f"{where} must have exactly one of {list(_STEP_KINDS)}")
        kind = kinds[0]
        if "think" in step:
            if kind not in ("tool", "text"):
                raise PlanError(f"{where}.think: only tool and text steps force a reasoning block")
            try:
                check_think(step["think"])
            except ValueError as exc:
                raise PlanError(f"{where}: {exc}") from None
        if kind == "tool":
            if not isinstance(step["tool"], str) or not step["tool"]:
                raise PlanError(f"{where}.tool must be a tool name")
            if not isinstance(step.get("arguments", {}), dict):
                raise PlanError(f"{where}.arguments must be an object")
        elif kind == "text" and not isinstance(step["text"], str):
            raise PlanError(f"{where}.text must be a string")
        elif kind == "choose":
            options = step["choose"]
            if not isinstance(options, list) or not options:
                raise PlanError(f"{where}.choose must be a non-empty list of tool or text steps")
            for i, option in enumerate(options):
                if not isinstance(option, dict) or not any(k in option for k in ("tool", "text")):
                    raise PlanError(f"{where}.choose[{i}] must be a tool or text step")
                Plan._check_step(option, f"{where}.choose[{i}]")
            if mixed_thinking(options):
                raise PlanError(f"{where}.choose: the options must all think or all not (one prompt renders them)")
        elif kind == "live" and step["live"] is not True:
            raise PlanError(f"{where}.live must be true")
        elif kind == "replay":
            if not isinstance(step["replay"], str):
                raise PlanError(f"{where}.replay must be a record id")
            if "record" in step:
                try:
                    plans.record_from_inline(step["replay"], step["record"])
                except (ValueError, TypeError, AttributeError) as exc:
                    raise PlanError(f"{where}.record: {exc}") from exc
        elif kind == "next_best":
            try:
                plans.next_best_options(step)
            except ValueError as exc:
                raise PlanError(f"{where}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "steps": self.steps, "side": self.side}


@dataclass(slots=True)
class Session:
    """One harness session as the proxy sees it."""

    session_id: str
    api_key: str
    task_id: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    plan: Plan = field(default_factory=Plan)
    models: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    closed_at: float | None = None
    classifier: Classifier | None = None
    # runtime state (derived from the store after a restart)
    next_seq: int = 0
    main_calls: int = 0
    chain_tip: list[int] | None = None

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def classify(self, normalized: dict[str, Any]) -> str:
        """The call kind of a request: the classifier's verdict, `main` when there is none."""
        if self.classifier is None:
            return CallKind.MAIN.value
        kind = self.classifier(normalized)
        return kind if kind in CallKind._value2member_map_ else CallKind.MAIN.value

    def next_step(self, call_kind: str) -> dict[str, Any] | None:
        """The plan step for the next call of this kind (`None` = live). Advances the cursor for main calls."""
        if call_kind == CallKind.MAIN.value:
            idx = self.main_calls
            self.main_calls += 1
            return self.plan.steps[idx] if idx < len(self.plan.steps) else None
        if call_kind == CallKind.SIDE.value and self.plan.side != "live":
            return dict(self.plan.side)
        return None

    def give_back_step(self, call_kind: str) -> None:
        """A main call failed: its plan step applies to the harness's retry (unless a later call already moved on)."""
        if call_kind == CallKind.MAIN.value and self.main_calls > 0:
            self.main_calls -= 1

    def public(self, base_url: str) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "api_key": self.api_key,
            "base_url": base_url,
            "task_id": self.task_id,
            "sampling": self.sampling,
            "plan": self.plan.to_dict(),
            "models": self.models,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "closed": self.closed,
            "closed_at": self.closed_at,
            "has_classifier": self.classifier is not None,
        }

    def persisted(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "sampling": self.sampling,
            "plan": self.plan.to_dict(),
            "models": self.models,
            "metadata": self.metadata,
            "closed_at": self.closed_at,
        }


def check_sampling(sampling: Any) -> dict[str, Any]:
    if sampling is None:
        return {}
    if not isinstance(sampling, dict):
        raise SessionError("sampling must be an object")
    unknown = set(sampling) - _SAMPLING_KEYS
    if unknown:
        raise SessionError(f"unknown sampling field(s) {sorted(unknown)}; allowed: {sorted(_SAMPLING_KEYS)}")
    for k in ("temperature", "top_p"):
        if k in sampling and (isinstance(sampling[k], bool) or not isinstance(sampling[k], (int, float))):
            raise SessionError(f"sampling.{k} must be a number")
    for k in ("top_k", "max_tokens", "seed"):
        if k in sampling and (isinstance(sampling[k], bool) or not isinstance(sampling[k], int)):
            raise SessionError(f"sampling.{k} must be an integer")
    if "chat_template_kwargs" in sampling and not isinstance(sampling["chat_template_kwargs"], dict):
        raise SessionError("sampling.chat_template_kwargs must be an object")
    return dict(sampling)


class SessionManager:
    """Creates, finds (by id or key), closes and persists sessions."""

    def __init__(self, store: RecordStore):
        self.store = store
        self._by_id: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}

    def load(self) -> int:
        """Load persisted sessions and their counters from the store (after a restart)."""
        for sid, key, created, data in self.store.load_sessions():
            s = Session(
                session_id=sid,
                api_key=key,
                task_id=data.get("task_id"),
                sampling=data.get("sampling") or {},
                plan=Plan.parse(data.get("plan")),
                models=data.get("models") or {},
                metadata=data.get("metadata") or {},
                created_at=created,
                closed_at=data.get("closed_at"),
            )
            stats = self.store.session_stats(sid)
            s.next_seq = stats["next_seq"]
            s.main_calls = self.store.count_records(
                sid, lambda r: r.call_kind == CallKind.MAIN.value and r.error is None
            )
            self._index(s)
        return len(self._by_id)

    def _index(self, s: Session) -> None:
        self._by_id[s.session_id] = s
        self._by_key[s.api_key] = s

    async def create(
        self,
        *,
        session_id: str | None = None,
        task_id: str | None = None,
        sampling: dict[str, Any] | None = None,
        plan: dict[str, Any] | Plan | None = None,
        models: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        classifier: Classifier | None = None,
    ) -> Session:
        """Create and persist a session; raises `SessionError` on bad fields or a duplicate id."""
        if session_id is not None and (not isinstance(session_id, str) or not session_id or len(session_id) > 200):
            raise SessionError("session_id must be a non-empty string of at most 200 characters")
        sid = session_id or uuid.uuid4().hex
        if sid in self._by_id:
            raise SessionError(f"session {sid!r} already exists", session_id=sid, status=409)
        if task_id is not None and not isinstance(task_id, str):
            raise SessionError("task_id must be a string")
        if models is not None and not isinstance(models, dict):
            raise SessionError("models must be an object")
        if metadata is not None and not isinstance(metadata, dict):
            raise SessionError("metadata must be an object")
        try:
            resolved = plan if isinstance(plan, Plan) else Plan.parse(plan)
        except PlanError as exc:
            raise SessionError(str(exc)) from exc
        s = Session(
            session_id=sid,
            api_key="polar-" + secrets.token_urlsafe(24),
            task_id=task_id,
            sampling=check_sampling(sampling),
            plan=resolved,
            models=dict(models or {}),
            metadata=dict(metadata or {}),
            created_at=time.time(),
            classifier=classifier,
        )
        self._index(s)
        await self.store.put_session(s.session_id, s.api_key, s.created_at, s.persisted())
        return s

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def by_key(self, api_key: str) -> Session | None:
        return self._by_key.get(api_key)

    def set_classifier(self, session_id: str, classifier: Classifier | None) -> None:
        s = self._by_id.get(session_id)
        if s is None:
            raise SessionError(f"unknown session {session_id!r}", session_id=session_id, status=404)
        s.classifier = classifier

    async def close(self, session_id: str) -> Session:
        s = self._by_id.get(session_id)
        if s is None:
            raise SessionError(f"unknown session {session_id!r}", session_id=session_id, status=404)
        if s.closed_at is None:
            s.closed_at = time.time()
            await self.store.put_session(s.session_id, s.api_key, s.created_at, s.persisted())
            self.store.session_ended(s.session_id)
        return s

    def all(self) -> list[Session]:
        return list(self._by_id.values())
