# SPDX-License-Identifier: Apache-2.0
"""How a harness call becomes a `CompletionRecord`: opened when the call is accepted, then closed exactly once.

`open_record` fills what is known when the call arrives (who, when, the original and normalised request, the plan
origin); `completed` writes what was actually sent (`EngineCall`) and what came back (`Generation`); `failed` writes
the error and clears the token arrays (a failed call carries no training data); `rejected` is the record of a call
refused before generation. The record format is `nemo_polar.types.CompletionRecord` (docs/contracts.md). This
module does no I/O: the caller commits the record to the store.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import orjson

from nemo_polar.proxy.engines.base import EngineCall, Generation, UpstreamError
from nemo_polar.proxy.normalized import ProviderError
from nemo_polar.proxy.sessions import Session
from nemo_polar.types import CompletionRecord

__all__ = ["completed", "error_dict", "failed", "open_record", "record_id", "rejected"]

# the random part of record ids: a generator of this module's own (a caller seeding `random` cannot make two
# processes draw the same ids), seeded from the OS and again in a forked child
_ids = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.seed)


def record_id() -> str:
    """A new record's id: 32 hex digits laid out as a UUID version 7 (RFC 9562): the time in milliseconds, then 74
    random bits. Ids made close in time sort close together, so the store's primary-key index takes a batch's new
    ids on one or two leaf pages, not one page each, as random (version 4) ids did: a commit of 20 records into a
    store of 8,000 wrote 30.9 pages to SQLite's WAL with those and 10.9 with these (docs/performance.md, "Record
    ids")."""
    bits = _ids.getrandbits(74)
    value = (time.time_ns() // 1_000_000) << 80 | 0x7 << 76 | (bits >> 62) << 64 | 0b10 << 62 | (bits & (1 << 62) - 1)
    return f"{value:032x}"


def open_record(
    session: Session, dialect: str, arrived: float, original: dict[str, Any], requested_model: str | None
) -> CompletionRecord:
    return CompletionRecord(
        id=record_id(),
        session_id=session.session_id,
        seq=session.take_seq(),
        dialect=dialect,
        arrived_at=arrived,
        original_request=original,
        requested_model=requested_model,
    )


def _sent(rec: CompletionRecord, call: EngineCall) -> None:
    """The record keeps what was actually used (a plan step may change sampling and the tool choice)."""
    if rec.request:
        rec.request["sampling"] = call.sampling
        if "tool_choice" in rec.request:
            rec.request["tool_choice"] = call.request.tool_choice


def completed(rec: CompletionRecord, call: EngineCall, gen: Generation) -> CompletionRecord:
    res = gen.result
    assert res is not None
    _sent(rec, call)
    rec.response = res.response_dict()
    rec.finish_reason = res.finish_reason
    rec.prompt_token_ids = res.prompt_token_ids
    rec.generation_token_ids = res.generation_token_ids
    rec.generation_log_probs = res.generation_log_probs
    rec.served_model = res.served_model or rec.served_model
    rec.first_byte_at = gen.first_byte_at
    rec.finished_at = time.time()
    rec.upstream = gen.upstream_dict()
    return rec


def error_dict(err: ProviderError) -> dict[str, Any]:
    if isinstance(err, UpstreamError):
        return err.to_record()
    return {"type": "provider_error", "status": err.status, "kind": err.kind, "message": err.message}


def failed(rec: CompletionRecord, error: dict[str, Any], call: EngineCall | None = None) -> CompletionRecord:
    if call is not None:
        _sent(rec, call)
    rec.error = error
    rec.finished_at = time.time()
    rec.prompt_token_ids, rec.generation_token_ids, rec.generation_log_probs = [], [], []
    return rec


def rejected(session: Session, dialect: str, raw: bytes, arrived: float, err: ProviderError) -> CompletionRecord:
    try:
        original = orjson.loads(raw)
        if not isinstance(original, dict):
            original = {"_raw": raw[:65536].decode("utf-8", "replace")}
    except orjson.JSONDecodeError:
        original = {"_raw": raw[:65536].decode("utf-8", "replace")}
    rec = open_record(session, dialect, arrived, original, None)
    rec.finished_at = time.time()
    rec.error = {"type": "rejected", "status": err.status, "kind": err.kind, "message": err.message}
    return rec
