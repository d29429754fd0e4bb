# SPDX-License-Identifier: Apache-2.0
"""A store that cannot write (disk full) is the server's fault: a retryable 503 in the caller's provider shape, never
a plain 500, and a stream never ends cleanly with an answer that was not kept (issue 22, the fault campaign's
disk-full row).

The disk is made full by making SQLite's write raise the error it raises on a full disk (`database or disk is full`)
and the payload file's append `ENOSPC`;
`benchmarks/faults.py` fills a real tmpfs for the same path. When the write succeeds again, so do calls.
"""

from __future__ import annotations

import errno
import sqlite3
from typing import Any

import pytest

from nemo_polar.proxy.payloads import PayloadFile
from nemo_polar.proxy.store import RecordStore
from tests.proxy.test_wrong_blame import CASES, _error_shape, _post


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    state = {"full": True}
    real = RecordStore._apply

    def apply(conn: sqlite3.Connection, op: tuple[Any, ...]) -> None:
        if state["full"] and op[0] == "record":
            raise sqlite3.OperationalError("database or disk is full")
        real(conn, op)

    def append(self: PayloadFile, payloads: Any, metas: Any = None) -> list[bytes]:
        if state["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(self, payloads, metas)

    real_append = PayloadFile.append
    monkeypatch.setattr(RecordStore, "_apply", staticmethod(apply))
    monkeypatch.setattr(PayloadFile, "append", append)  # a record's commit is its payload frame (store docstring)
    return state


@pytest.mark.parametrize("dialect", list(CASES))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_full_disk_is_a_retryable_503_in_the_callers_shape(
    fake_upstream: Any, make_proxy: Any, full_disk: dict[str, bool], dialect: str, stream: bool
) -> None:
    fake = fake_upstream(n_gen=8)
    h = make_proxy([fake.base_url], served_model="m")
    s = h.session()
    path, body, spath, sbody, terminal = CASES[dialect]
    url, payload = (h.base_url + spath, sbody) if stream else (h.base_url + path, body)
    status, headers, raw, complete = _post(url, s.api_key, payload)
    assert status == 503, raw
    assert {k.lower() for k in headers} >= {"retry-after"}
    assert _error_shape(dialect, raw) in {"overloaded_error", "server_error", "api_error", "UNAVAILABLE"}
    assert b"could not write" in raw
    assert h.records(s.session_id) == []  # nothing half written
    full_disk["full"] = False  # space returns: the same call succeeds and is kept
    status, _, raw, complete = _post(url, s.api_key, payload)
    assert status == 200 and complete, raw
    if stream:
        assert terminal in raw
    (rec,) = h.records(s.session_id)
    assert rec.error is None and rec.generation_token_ids
