# SPDX-License-Identifier: Apache-2.0
"""The record types every layer of nemo-polar exchanges (docs/contracts.md), with validation and JSON round-trip.

This module is a leaf: it imports nothing of ours but `token_ids` (the packed token-id sequence) and the optional C
encoder `_arrays`, which import nothing. It
defines `CompletionRecord` (one proxied model call), `Trace` (one trainer-facing token chain), `Trajectory` (a
session's traces and stats), `EvalResult` and `SessionResult`. Field names are contracts: other layers, NeMo Gym
and NeMo RL read them by name.

JSON: `to_json()` writes token-id arrays as compact base64 int32 and logprob arrays as base64 float64
(lossless); `from_json()` accepts both that form and plain lists.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

import numpy as np
import orjson

from nemo_polar.errors import PolarError
from nemo_polar.token_ids import TokenIds, id_list

__all__ = [
    "CallKind",
    "ChainKind",
    "CompletionRecord",
    "Dialect",
    "EvalResult",
    "Origin",
    "SessionResult",
    "SplitReason",
    "TokenIds",
    "Trace",
    "Trajectory",
    "TrajectoryStats",
    "TrajectoryStatus",
    "ValidationError",
    "check_think",
    "decode_array",
    "encode_array",
    "id_list",
    "mixed_thinking",
]


class ValidationError(PolarError, ValueError):
    """A record violates its contract (lengths disagree, a reward is not finite, …)."""

    def __init__(self, kind: str, errors: list[str]):
        self.kind = kind
        self.errors = errors
        super().__init__(f"invalid {kind}: " + "; ".join(errors))


class Dialect(StrEnum):
    ANTHROPIC_MESSAGES = "anthropic_messages"
    OPENAI_CHAT = "openai_chat"
    OPENAI_RESPONSES = "openai_responses"
    GOOGLE_GENAI = "google_genai"


class Origin(StrEnum):
    LIVE = "live"
    FORCED = "forced"
    REPLAYED = "replayed"


class CallKind(StrEnum):
    MAIN = "main"
    SUBAGENT = "subagent"
    SIDE = "side"


class ChainKind(StrEnum):
    MAIN = "main"
    SUBAGENT = "subagent"
    SIDE = "side"
    POST_COMPACTION = "post_compaction"


class TrajectoryStatus(StrEnum):
    COMPLETED = "COMPLETED"
    TIMEOUT = "TIMEOUT"
    ERROR = "ERROR"


class SplitReason(StrEnum):
    """Why a builder started a new chain (or masked tokens) instead of extending one."""

    DRIFT = "drift"
    SIBLING = "sibling"
    COMPACTION = "compaction"
    NO_EOT = "no_eot"
    TRUNCATED = "truncated"
    FORCED_MASKED = "forced_masked"


# ---------------------------------------------------------------------------------------------------------------
# compact arrays


_I32 = "b64:i32:"
_F64 = "b64:f64:"


_FAST_ENCODE: dict[str, Callable[[object], str | None]] = {}
try:  # a list in one pass in C (nemo_polar/_arrays.c, no Python dependencies); numpy below does the rest
    from nemo_polar import _arrays

    _FAST_ENCODE = {"i32": _arrays.encode_i32, "f64": _arrays.encode_f64}
    _encode_packed: Callable[[bytes], str] = _arrays.encode_i32_packed
except ImportError:

    def _encode_packed(packed: bytes) -> str:
        return _I32 + base64.b64encode(packed).decode("ascii")


def encode_array(values: Iterable[int] | Iterable[float], kind: str) -> str:
    """Encode a token-id (`kind="i32"`) or logprob (`kind="f64"`) array as compact base64 (lossless).

    A list of plain ints (in int32 range) or floats goes through `_arrays`, which writes the same string; anything
    else (numpy arrays, other iterables, bools, out-of-range ids: it returns None) through numpy."""
    if kind == "i32" and type(values) is TokenIds:  # packed already
        return _encode_packed(values.packed)
    fast = _FAST_ENCODE.get(kind)
    if fast is not None and (out := fast(values)) is not None:
        return out
    if kind == "i32":
        arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype="<i8")
        if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
            raise ValueError("token id out of int32 range")
        return _I32 + base64.b64encode(arr.astype("<i4").tobytes()).decode("ascii")
    if kind == "f64":
        arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype="<f8")
        return _F64 + base64.b64encode(arr.tobytes()).decode("ascii")
    raise ValueError(f"unknown array kind {kind!r}")


def decode_array(value: Any) -> list[Any]:
    """Inverse of `encode_array`; plain lists pass through (as lists)."""
    if value is None:
        return []
    if isinstance(value, str):
        if value.startswith(_I32):
            return np.frombuffer(base64.b64decode(value[len(_I32) :]), dtype="<i4").tolist()
        if value.startswith(_F64):
            return np.frombuffer(base64.b64decode(value[len(_F64) :]), dtype="<f8").tolist()
        raise ValueError(f"not an encoded array: {value[:16]!r}")
    return list(value)


def check_think(think: Any) -> None:
    """A plan step's `think` (docs/contracts.md, plans) must be non-empty text without `</think>` (ValueError)."""
    if not isinstance(think, str) or not think.strip() or "</think>" in think:
        raise ValueError(f"a step's think must be non-empty text without </think>: {think!r}")


def mixed_thinking(options: Iterable[Any]) -> bool:
    """Whether some options of a `choose` step think and others do not (one prompt cannot render both)."""
    return len({isinstance(o, dict) and o.get("think") is not None for o in options}) > 1


def _check_ids(name: str, ids: Any, errors: list[str]) -> None:
    if type(ids) is TokenIds:  # token ids by construction
        return
    if not isinstance(ids, list):
        errors.append(f"{name} must be a list, got {type(ids).__name__}")
        return
    for i, t in enumerate(ids):
        if type(t) is not int or t < 0:
            errors.append(f"{name}[{i}] must be a non-negative int, got {t!r}")
            return


def _check_floats(name: str, values: Any, errors: list[str], *, allow_inf: bool = True) -> None:
    if not isinstance(values, list):
        errors.append(f"{name} must be a list, got {type(values).__name__}")
        return
    for i, v in enumerate(values):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(v):
            errors.append(f"{name}[{i}] must be a number, got {v!r}")
            return
        if not allow_inf and math.isinf(v):
            errors.append(f"{name}[{i}] must be finite, got {v!r}")
            return


T = TypeVar("T", bound="_JsonMixin")


class _JsonMixin:
    """Shared JSON plumbing: subclasses name their array fields and nested types."""

    _ID_FIELDS: ClassVar[tuple[str, ...]] = ()
    _FLOAT_FIELDS: ClassVar[tuple[str, ...]] = ()

    def to_dict(self, *, compact: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if compact and f.name in self._ID_FIELDS:
                v = encode_array(v, "i32")
            elif f.name in self._FLOAT_FIELDS:
                # JSON has no infinities: plain form spells them as strings, compact form is binary.
                v = encode_array(v, "f64") if compact else [x if math.isfinite(x) else str(x) for x in v]
            else:
                v = _plain(v, compact)
            out[f.name] = v
        return out

    def to_json(self, *, compact: bool = True) -> bytes:
        return orjson.dumps(self.to_dict(compact=compact), option=orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = set(data) - names
        if unknown:
            raise ValidationError(cls.__name__, [f"unknown field(s): {sorted(unknown)}"])
        kwargs = dict(data)
        for name in cls._ID_FIELDS:
            if name in kwargs:
                kwargs[name] = decode_array(kwargs[name])
        for name in cls._FLOAT_FIELDS:
            if name in kwargs:
                kwargs[name] = [float(x) for x in decode_array(kwargs[name])]  # "-inf" strings included
        return cls._from_kwargs(kwargs)

    @classmethod
    def _from_kwargs(cls: type[T], kwargs: dict[str, Any]) -> T:
        return cls(**kwargs)

    @classmethod
    def from_json(cls: type[T], data: bytes | str) -> T:
        return cls.from_dict(orjson.loads(data))


def _plain(v: Any, compact: bool) -> Any:
    if isinstance(v, _JsonMixin):
        return v.to_dict(compact=compact)
    if isinstance(v, StrEnum):
        return v.value
    if isinstance(v, tuple):
        return [_plain(x, compact) for x in v]
    if isinstance(v, list):
        return [_plain(x, compact) for x in v]
    if isinstance(v, TokenIds):
        return v.tolist()
    if isinstance(v, dict):
        return {k: _plain(x, compact) for k, x in v.items()}
    return v


# ---------------------------------------------------------------------------------------------------------------
# CompletionRecord


@dataclass(slots=True)
class CompletionRecord(_JsonMixin):
    """One proxied model call, as committed by the proxy (docs/contracts.md).

    A failed call is a record with `error` set and no training data (empty token arrays).
    `generation_log_probs[i]` is the sampled logprob of `generation_token_ids[i]`.
    """

    _ID_FIELDS: ClassVar[tuple[str, ...]] = ("prompt_token_ids", "generation_token_ids")
    _FLOAT_FIELDS: ClassVar[tuple[str, ...]] = ("generation_log_probs",)

    id: str
    session_id: str
    seq: int
    dialect: str
    arrived_at: float = 0.0
    first_byte_at: float | None = None
    finished_at: float | None = None
    original_request: dict[str, Any] = field(default_factory=dict)
    request: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    prompt_token_ids: list[int] | TokenIds = field(default_factory=list)
    generation_token_ids: list[int] = field(default_factory=list)
    generation_log_probs: list[float] = field(default_factory=list)
    requested_model: str | None = None
    served_model: str | None = None
    policy_version: int | str | None = None
    origin: str = Origin.LIVE.value
    call_kind: str = CallKind.MAIN.value
    upstream: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def validate(self) -> CompletionRecord:
        """Raise `ValidationError` listing every contract violation at once; return self when valid."""
        errors: list[str] = []
        if not self.id:
            errors.append("id is empty")
        if not self.session_id:
            errors.append("session_id is empty")
        if type(self.seq) is not int or self.seq < 0:
            errors.append(f"seq must be a non-negative int, got {self.seq!r}")
        if self.dialect not in Dialect._value2member_map_:
            errors.append(f"dialect {self.dialect!r} not one of {[d.value for d in Dialect]}")
        if self.origin not in Origin._value2member_map_:
            errors.append(f"origin {self.origin!r} not one of {[o.value for o in Origin]}")
        if self.call_kind not in CallKind._value2member_map_:
            errors.append(f"call_kind {self.call_kind!r} not one of {[c.value for c in CallKind]}")
        _check_ids("prompt_token_ids", self.prompt_token_ids, errors)
        _check_ids("generation_token_ids", self.generation_token_ids, errors)
        _check_floats("generation_log_probs", self.generation_log_probs, errors)
        if isinstance(self.generation_token_ids, list) and isinstance(self.generation_log_probs, list):
            if len(self.generation_token_ids) != len(self.generation_log_probs):
                errors.append(
                    f"generation_log_probs has {len(self.generation_log_probs)} entries for "
                    f"{len(self.generation_token_ids)} generation_token_ids"
                )
            if any(isinstance(v, (int, float)) and v > 1e-6 for v in self.generation_log_probs):
                errors.append("generation_log_probs must be <= 0")
        usage = self.upstream.get("usage") if isinstance(self.upstream, dict) else None
        if self.error is None and isinstance(usage, dict):
            pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(pt, int) and self.prompt_token_ids and pt != len(self.prompt_token_ids):
                errors.append(f"usage.prompt_tokens={pt} but {len(self.prompt_token_ids)} prompt_token_ids")
            if isinstance(ct, int) and self.generation_token_ids and ct != len(self.generation_token_ids):
                errors.append(
                    f"usage.completion_tokens={ct} but {len(self.generation_token_ids)} generation_token_ids"
                )
        if self.error is not None and (self.generation_token_ids or self.generation_log_probs):
            errors.append("a failed record (error set) carries no generation tokens")
        for name in ("arrived_at", "first_byte_at", "finished_at"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v)):
                errors.append(f"{name} must be a finite number, got {v!r}")
        if errors:
            raise ValidationError("CompletionRecord", errors)
        return self


# ---------------------------------------------------------------------------------------------------------------
# Trace and Trajectory


@dataclass(slots=True)
class Trace(_JsonMixin):
    """One trainer-facing token chain (Polar's layout).

    `prompt_ids` is the chain's first prompt (never trained). `response_ids` is everything after it
    (sampled and interstitial tokens); `loss_mask` and `response_logprobs` align with it, logprob 0.0
    where the mask is 0. `call_spans[k] = (record_id, start, end)` indexes `response_ids[start:end]`.
    """

    _ID_FIELDS: ClassVar[tuple[str, ...]] = ("prompt_ids", "response_ids", "loss_mask")
    _FLOAT_FIELDS: ClassVar[tuple[str, ...]] = ("response_logprobs",)

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    call_spans: list[tuple[str, int, int]] = field(default_factory=list)
    chain_kind: str = ChainKind.MAIN.value
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _from_kwargs(cls, kwargs: dict[str, Any]) -> Trace:
        kwargs["call_spans"] = [(str(r), int(s), int(e)) for r, s, e in kwargs.get("call_spans", [])]
        return cls(**kwargs)

    @property
    def trainable_tokens(self) -> int:
        return int(sum(self.loss_mask))

    def validate(self) -> Trace:
        errors: list[str] = []
        _check_ids("prompt_ids", self.prompt_ids, errors)
        _check_ids("response_ids", self.response_ids, errors)
        _check_floats("response_logprobs", self.response_logprobs, errors)
        n = len(self.response_ids) if isinstance(self.response_ids, list) else -1
        if isinstance(self.loss_mask, list):
            if len(self.loss_mask) != n:
                errors.append(f"loss_mask has {len(self.loss_mask)} entries for {n} response_ids")
            if any(m not in (0, 1) for m in self.loss_mask):
                errors.append("loss_mask entries must be 0 or 1")
        else:
            errors.append("loss_mask must be a list")
        if isinstance(self.response_logprobs, list):
            if len(self.response_logprobs) != n:
                errors.append(f"response_logprobs has {len(self.response_logprobs)} entries for {n} response_ids")
            elif isinstance(self.loss_mask, list) and len(self.loss_mask) == n:
                bad = next((i for i in range(n) if self.loss_mask[i] == 0 and self.response_logprobs[i] != 0.0), None)
                if bad is not None:
                    errors.append(f"response_logprobs[{bad}] must be 0.0 where loss_mask is 0")
        prev_end = 0
        for k, span in enumerate(self.call_spans):
            if len(span) != 3:
                errors.append(f"call_spans[{k}] must be (record_id, start, end)")
                continue
            _, s, e = span
            if not (0 <= s <= e <= n):
                errors.append(f"call_spans[{k}]=({s}, {e}) outside response_ids of length {n}")
            elif s < prev_end:
                errors.append(f"call_spans[{k}] overlaps the previous span")
            else:
                prev_end = e
        if self.chain_kind not in ChainKind._value2member_map_:
            errors.append(f"chain_kind {self.chain_kind!r} not one of {[c.value for c in ChainKind]}")
        if self.reward is not None and (not isinstance(self.reward, (int, float)) or not math.isfinite(self.reward)):
            errors.append(f"reward must be finite, got {self.reward!r}")
        if errors:
            raise ValidationError("Trace", errors)
        return self


def _zero_splits() -> dict[str, int]:
    return {r.value: 0 for r in SplitReason}


@dataclass(slots=True)
class TrajectoryStats(_JsonMixin):
    """Counts every builder reports (docs/contracts.md): chains, records, merges, splits by reason, tokens."""

    chains: int = 0
    records: int = 0
    merged: int = 0
    splits: dict[str, int] = field(default_factory=_zero_splits)
    trainable_tokens: int = 0
    delivered_fraction: float = 1.0
    drift_tokens: int = 0
    # sampled tokens a policy kept out of training, by policy (`forced_masked`, `side_masked`, `side_dropped`)
    policy_tokens: dict[str, int] = field(default_factory=dict)

    def validate(self) -> TrajectoryStats:
        errors: list[str] = []
        unknown = set(self.splits) - set(SplitReason._value2member_map_)
        if unknown:
            errors.append(f"unknown split reasons {sorted(unknown)}")
        for name in ("chains", "records", "merged", "trainable_tokens", "drift_tokens"):
            v = getattr(self, name)
            if type(v) is not int or v < 0:
                errors.append(f"{name} must be a non-negative int, got {v!r}")
        for k, v in self.policy_tokens.items():
            if type(v) is not int or v < 0:
                errors.append(f"policy_tokens[{k!r}] must be a non-negative int, got {v!r}")
        if not (0.0 <= self.delivered_fraction <= 1.0):
            errors.append(f"delivered_fraction must be in [0, 1], got {self.delivered_fraction!r}")
        if errors:
            raise ValidationError("TrajectoryStats", errors)
        return self


@dataclass(slots=True)
class Trajectory(_JsonMixin):
    """A session's traces, with the builder's stats and per-stage timing (seconds)."""

    status: str = TrajectoryStatus.COMPLETED.value
    traces: list[Trace] = field(default_factory=list)
    stats: TrajectoryStats = field(default_factory=TrajectoryStats)
    timing: dict[str, float] = field(default_factory=dict)

    @classmethod
    def _from_kwargs(cls, kwargs: dict[str, Any]) -> Trajectory:
        kwargs["traces"] = [t if isinstance(t, Trace) else Trace.from_dict(t) for t in kwargs.get("traces", [])]
        st = kwargs.get("stats", {})
        kwargs["stats"] = st if isinstance(st, TrajectoryStats) else TrajectoryStats.from_dict(st)
        return cls(**kwargs)

    def validate(self) -> Trajectory:
        errors: list[str] = []
        if self.status not in TrajectoryStatus._value2member_map_:
            errors.append(f"status {self.status!r} not one of {[s.value for s in TrajectoryStatus]}")
        for i, t in enumerate(self.traces):
            try:
                t.validate()
            except ValidationError as exc:
                errors.extend(f"traces[{i}]: {e}" for e in exc.errors)
        try:
            self.stats.validate()
        except ValidationError as exc:
            errors.extend(f"stats: {e}" for e in exc.errors)
        for k, v in self.timing.items():
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                errors.append(f"timing[{k!r}] must be a finite non-negative number")
        if errors:
            raise ValidationError("Trajectory", errors)
        return self


# ---------------------------------------------------------------------------------------------------------------
# Evaluation and session results


@dataclass(slots=True)
class EvalResult(_JsonMixin):
    """An evaluator's verdict. Infrastructure failures set `mask_sample` and `failure_kind`, reward 0.

    `trace_rewards` (optional) scores single traces apart from the session, e.g. a subagent chain judged on its
    own: keyed by the trace's first record id (`call_spans[0][0]`, stable across rebuilds of the same records);
    a trace named there carries that reward, every other trace `reward`.
    """

    reward: float
    resolved: bool | None = None
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    trace_rewards: dict[str, float] = field(default_factory=dict)

    def validate(self) -> EvalResult:
        errors: list[str] = []
        if (
            isinstance(self.reward, bool)
            or not isinstance(self.reward, (int, float))
            or not math.isfinite(self.reward)
        ):
            errors.append(f"reward must be a finite number, got {self.reward!r}")
        for k, v in self.metrics.items():
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                errors.append(f"metrics[{k!r}] must be finite, got {v!r}")
        for k, v in self.trace_rewards.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                errors.append(f"trace_rewards[{k!r}] must be a finite number, got {v!r}")
        if self.mask_sample and not self.failure_kind:
            errors.append("mask_sample requires a failure_kind")
        if errors:
            raise ValidationError("EvalResult", errors)
        return self


@dataclass(slots=True)
class SessionResult(_JsonMixin):
    """What the rollout service hands a trainer for one session (one sample of one task)."""

    session_id: str
    task_id: str
    sample_index: int = 0
    status: str = TrajectoryStatus.COMPLETED.value
    harness: str | None = None
    trajectory: Trajectory = field(default_factory=Trajectory)
    eval: EvalResult | None = None
    record_ids: list[str] = field(default_factory=list)
    credit: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)

    @classmethod
    def _from_kwargs(cls, kwargs: dict[str, Any]) -> SessionResult:
        tr = kwargs.get("trajectory", {})
        kwargs["trajectory"] = tr if isinstance(tr, Trajectory) else Trajectory.from_dict(tr)
        ev = kwargs.get("eval")
        kwargs["eval"] = ev if ev is None or isinstance(ev, EvalResult) else EvalResult.from_dict(ev)
        return cls(**kwargs)

    @property
    def reward(self) -> float:
        return 0.0 if self.eval is None else float(self.eval.reward)

    def validate(self) -> SessionResult:
        errors: list[str] = []
        if not self.session_id:
            errors.append("session_id is empty")
        if not self.task_id:
            errors.append("task_id is empty")
        if self.status not in TrajectoryStatus._value2member_map_:
            errors.append(f"status {self.status!r} not one of {[s.value for s in TrajectoryStatus]}")
        for name, obj in (("trajectory", self.trajectory), ("eval", self.eval)):
            if obj is None:
                continue
            try:
                obj.validate()
            except ValidationError as exc:
                errors.extend(f"{name}: {e}" for e in exc.errors)
        if errors:
            raise ValidationError("SessionResult", errors)
        return self
