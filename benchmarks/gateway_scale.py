# SPDX-License-Identifier: Apache-2.0
"""Gateway scale: records per second sustained with 1,000 open sessions, and memory per open session.

What runs: a gateway node process as `polar rollout serve-gateway` builds it (a `Gateway` with its proxy hosted in
the same process by `HostedProxy`, records in `<work_dir>/records.sqlite`), in front of the instant FAKE
vLLM-dialect upstream (`polar_lab.fake_upstream`: 1,000 prompt ids and 64 sampled ids + logprobs per answer).
Sessions are opened through the proxy's admin API (the same `Proxy.create_session` the gateway calls when it admits a
session). The client sends `proxy_overhead.py`'s 4.5 KB chat request with tools, non-streaming, at concurrency 64,
each call under the next session's key (round robin), so every session records.

Reported: with 1 and with 1,000 open sessions, records committed per second (counted in the store afterwards), p50
latency and CPU ms per record of the gateway process; its RSS before the sessions, after opening them (RSS per open
session) and after the calls.

    .venv/bin/python benchmarks/gateway_scale.py [--sessions 1000] [--calls 6000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (the repository root, for polar_lab)
import aiohttp
import proxy_overhead as po
from _tables import note, table
from _workdir import release

from nemo_polar.proxy.store import read_records

REPO = Path(__file__).resolve().parents[1]


def _serve(upstream: str, work: str, port_file: str) -> None:
    """The gateway node process: a one-gateway stack with its hosted proxy and no rollout server, as
    `polar rollout serve-gateway --upstream` starts it (`nemo_polar.rollout.stack.start_stack`)."""
    sys.path.insert(0, str(REPO))
    from nemo_polar.rollout.stack import StackConfig, start_stack

    os.environ["POLAR_CONTROL_TOKEN"] = po.CONTROL  # the proxy's admin token (the stack has no option for it)

    async def main() -> None:
        cfg = StackConfig(
            work_dir=work,
            upstreams=[upstream],
            served_model="fake-model",
            serve_rollout=False,
            gateways=1,
            node_ids=["bench"],
        )
        async with await start_stack(cfg) as stack:
            assert stack.proxy is not None
            await asyncio.to_thread(Path(port_file).write_text, stack.proxy.base_url)
            await asyncio.Event().wait()

    asyncio.run(main())


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _open_sessions(base: str, n: int) -> list[str]:
    headers = {"Authorization": f"Bearer {po.CONTROL}", "Content-Type": "application/json"}
    keys: list[str] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as http:

        async def one(i: int) -> str:
            body = {"task_id": f"task-{i}", "metadata": {"group_id": i // 8}, "sampling": {"max_tokens": 512}}
            async with http.post(base + "/sessions", json=body, headers=headers) as r:
                return str((await r.json())["api_key"])

        for start in range(0, n, 64):
            keys += await asyncio.gather(*(one(i) for i in range(start, min(n, start + 64))))
    return keys


async def _drive(url: str, keys: list[str], body: bytes, concurrency: int, n: int) -> tuple[list[float], float]:
    lat: list[float] = []
    counter = iter(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def worker() -> None:
            for i in counter:
                headers = {"Content-Type": "application/json", "Authorization": f"Bearer {keys[i % len(keys)]}"}
                t = time.perf_counter()
                async with http.post(url, data=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status}")
                lat.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return lat, wall


def _records(work: str) -> int:
    """Records committed without error so far (`read_records`: a live proxy's newest rows may still be owed)."""
    return sum(1 for r in read_records(work) if r.error is None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=6000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        _serve(*args.serve)
        return 0
    up_port = po.free_port()
    fake = subprocess.Popen(
        [sys.executable, "-m", "polar_lab.fake_upstream", "--port", str(up_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rows: list[list[Any]] = []
    try:
        po._wait(f"http://127.0.0.1:{up_port}/health")
        body = json.dumps(po.request_body("fake-model", 64)).encode()
        for n_sessions in (1, args.sessions):
            rows.append(_one(f"http://127.0.0.1:{up_port}", body, n_sessions, args.calls, args.concurrency))
    finally:
        fake.terminate()
        fake.wait(10)
    table(
        f"Gateway node (Gateway + hosted proxy, one process) on an instant FAKE upstream, c={args.concurrency}, "
        "4.5 KB chat request with tools, non-streaming",
        [
            "open sessions",
            "records",
            "records/s",
            "p50 ms",
            "CPU ms / record",
            "RSS idle MB",
            "RSS with sessions MB",
            "KB per open session",
            "RSS after calls MB",
        ],
        rows,
    )
    if len(rows) == 2 and rows[0][2]:
        note(
            f"With {args.sessions:,} open sessions the node sustains {rows[1][2]:,.0f} records/s "
            f"({rows[1][2] / rows[0][2]:.2f}× the single-session rate); an open session costs "
            f"{rows[1][7]:.1f} KB of RSS before its calls."
        )
    return 0


def _one(upstream: str, body: bytes, n_sessions: int, calls: int, concurrency: int) -> list[Any]:
    work = tempfile.mkdtemp(prefix="polar-gw-bench-")
    port_file = os.path.join(work, "proxy-url")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", upstream, work, port_file],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 60
        while not os.path.exists(port_file) or not Path(port_file).read_text():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("the gateway process did not start")
            time.sleep(0.1)
        base = Path(port_file).read_text()
        po._wait(base + "/")
        warm = asyncio.run(_open_sessions(base, 1))
        asyncio.run(_drive(base + "/v1/chat/completions", warm, body, 4, 64))  # warm the code paths
        time.sleep(0.5)
        rss0 = _rss_mb(proc.pid)
        keys = asyncio.run(_open_sessions(base, n_sessions))
        time.sleep(0.5)
        rss1 = _rss_mb(proc.pid)
        before = _records(work)
        cpu0 = po._cpu_s(proc.pid)
        lat, wall = asyncio.run(_drive(base + "/v1/chat/completions", keys, body, concurrency, calls))
        cpu = po._cpu_s(proc.pid) - cpu0
        rss2 = _rss_mb(proc.pid)
        committed = _records(work) - before
        row = [
            n_sessions,
            committed,
            committed / wall,
            1e3 * statistics.median(lat),
            1e3 * cpu / max(committed, 1),
            rss0,
            rss1,
            1024 * (rss1 - rss0) / n_sessions,
            rss2,
        ]
        print(f"  {n_sessions} session(s): {committed} records in {wall:.1f} s = {committed / wall:.0f}/s", flush=True)
        return row
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        release(work, sys.exc_info()[1])  # the exception propagating, if any


if __name__ == "__main__":
    sys.exit(main())
