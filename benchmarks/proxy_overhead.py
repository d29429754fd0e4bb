# SPDX-License-Identifier: Apache-2.0
"""Proxy overhead, measured side by side in one run (docs/performance.md).

Three paths to the same upstream: `direct` (client → upstream), `polar` (client → our proxy with token capture and a
durable commit per call → upstream) and `passthrough` (client → a minimal aiohttp pass-through → upstream, the floor
for a Python proxy). Each at concurrency 1, 16, 64, on

- an instant FAKE vLLM-dialect responder (`polar_lab.fake_upstream`: a vLLM-shaped 11.7 KB answer with 1,000
  prompt ids and 64 sampled ids/logprobs), and
- real vLLM-CPU (`tiny-qwen3` from `polar backend`, when prepared; skipped with the reason printed otherwise).

Reported per path: p50/p99 latency, added p50/p99 vs direct, throughput and its ratio to direct, CPU seconds per
request of the proxy process (its CPU-time clock, to the nanosecond; the long-stream bars also print its system part,
from /proc, in 10 ms ticks). The client sends the same ~4.5 KB chat request with tools.

Long streams (issue 23): the request mix of `peers.py` (1k/8k-token prompts, 64/512-token answers, streaming and
not) on the sized FAKE upstream, pass-through and proxy at c=1 and c=64 and each kind alone at c=1, once with one
upstream chunk per token (vLLM's default) and once with 8 (`--stream-interval 8`, the embedded backend's setting),
the whole-mix rows in `--rounds` rounds (3; 1 with `--quick`) reported as medians with each round's ratio; a mix of
harness-sized prompts (16k-30k tokens, `MIX_LONG`) at c=64, one token a chunk, in as many rounds (not a bar: the size
of an agent session's later turns, where every call's token data and record grow with the prompt); and on
real vLLM what that interval costs a client (time to first and last token of a 128-token stream). The mix adds a
fourth path, `passthrough+tokens`: the pass-through asking the upstream for the token data our proxy asks for
(the proxy's own `VLLMEngine.token_fields`), so the engine sends it the same bytes as the proxy (the floor for any
proxy that captures tokens: no parsing of the answer, no record); and a fifth, `passthrough+parse`: the same, also
reading each non-streamed answer with `orjson` (the least a proxy does to get at the token data: streams are still
passed on unread, and nothing is kept).

    .venv/bin/python benchmarks/proxy_overhead.py [--quick] [--no-vllm] [--no-mix | --mix-only] [--rounds N]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (the repository root, for polar_lab)
import aiohttp
from _workdir import release, work_dir

from nemo_polar.backend.server import free_port
from nemo_polar.proxy.engines.base import Upstreams
from nemo_polar.proxy.engines.vllm import CAPTURE_FIELDS, VLLMEngine

CONTROL = "bench-control-token"
TICKS = os.sysconf("SC_CLK_TCK")


def _wait(url: str, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(url)


_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _cpu_s(pid: int) -> float:
    """CPU seconds of `pid` so far, all its threads, to the nanosecond: its CPU-time clock (`clock_getcpuclockid`).
    `/proc/<pid>/stat` counts whole clock ticks (10 ms): over a round at c=1 the pass-through uses ≈ 17 of them, so
    one tick more or less moved a ratio by 6 %."""
    clock = ctypes.c_int()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        return sum(_cpu_split(pid))  # no CPU clock for it here: the ticks
    return time.clock_gettime(clock.value)


def _cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of `pid` so far (utime, stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def request_body(model: str, max_tokens: int) -> dict[str, Any]:
    """A ~4.5 KB chat request with tools, like a harness turn."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name}: " + "Runs the operation on the workspace and returns its output. " * 3,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "Absolute path of the file to operate on."},
                        "content": {"type": "string", "description": "Text to write, or a pattern to search for."},
                        "timeout": {"type": "integer", "description": "Seconds before the operation is abandoned."},
                    },
                    "required": ["path"],
                },
            },
        }
        for name in ("read_file", "write_file", "run_shell_command", "search_files", "list_directory")
    ]
    system = "You are a coding agent working in a repository. " * 30
    return {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "tools": tools,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Fix the failing test in tests/test_parser.py and run it."},
        ],
    }


async def _drive(
    url: str, headers: dict[str, str], body: bytes | list[bytes], concurrency: int, n: int, pid: int | None = None
) -> tuple[list[float], float, float | None, float | None]:
    """Latencies, wall seconds, CPU seconds of `pid` and the system (kernel) part of them for `n` requests at
    `concurrency`, after a warm-up round; a list of bodies is cycled through (request i sends body i mod len)."""
    lat: list[float] = []
    bodies = body if isinstance(body, list) else [body]
    conn = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:

        async def one(i: int) -> None:
            t = time.perf_counter()
            async with http.post(url, data=bodies[i % len(bodies)], headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: HTTP {r.status}")
            lat.append(time.perf_counter() - t)

        async def rounds(k: int) -> None:
            queue = iter(range(k))

            async def worker() -> None:
                for i in queue:
                    await one(i)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        await rounds(max(concurrency, min(n, 50)))  # warm the connections and the code path; not measured
        lat.clear()
        cpu0 = (_cpu_s(pid), _cpu_split(pid)[1]) if pid else None
        t0 = time.perf_counter()
        await rounds(n)
        wall = time.perf_counter() - t0
        cpu1 = (_cpu_s(pid), _cpu_split(pid)[1]) if pid else None
    if cpu0 is None or cpu1 is None:
        return lat, wall, None, None
    return lat, wall, cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]  # the system share in ticks (`/proc` splits no finer)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# The floors a proxy that captures tokens cannot go below, measured beside the plain pass-through in the long-stream
# mix: (path, the pass-through's --floor mode, what it does, suffix of the proxy's per-round ratios to it)
_FLOORS = (
    ("passthrough+tokens", "tokens", "the pass-through asking for the same token data", "_vs_tokens"),
    ("passthrough+parse", "parse", "that one also reading non-streamed answers with orjson", "_vs_parse"),
)


def engine_fields(stream: bool) -> dict[str, Any]:
    """What the proxy's vLLM engine adds to a request (`VLLMEngine.token_fields`, no stream interval, as the
    benchmarks' proxies run): the token data, and usage in a stream. The same-work paths ask vLLM for exactly this."""
    return VLLMEngine(Upstreams(["http://127.0.0.1:1"])).token_fields(stream)


def _passthrough_main(port: int, upstream: str, floor: str | None = None) -> None:
    """The minimal aiohttp pass-through (the floor): forward the body, return the upstream bytes; an event stream
    (the upstream's `Content-Type`) a read at a time as it arrives, as a proxy in front of a harness must (until
    2026-12-02 it read a stream whole and answered it as one JSON body; the CPU per request was the same within
    the noise: docs/performance.md).

    With `floor="tokens"` (`passthrough+tokens`): the body is parsed and given the token fields our proxy's vLLM
    engine adds (taken from `VLLMEngine.token_fields`, not copied, so the two ask the engine for the same token
    data), and a streamed answer is forwarded a read at a time as it arrives, as a proxy that streams must; the
    answer's bytes are still not looked at. With `floor="parse"` (`passthrough+parse`): the same, and a non-streamed
    answer is also parsed with `orjson` before its bytes are passed on (the parse is the cost measured; its result
    is dropped).
    """
    import orjson
    from aiohttp import web

    parse = floor == "parse"
    fields = {stream: engine_fields(stream) for stream in (False, True)} if floor else {}

    async def ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024))
        yield
        await app["http"].close()

    async def relay(request: web.Request, r: aiohttp.ClientResponse, headers: dict[str, str]) -> web.StreamResponse:
        """A streamed answer passed on a read at a time, as it arrives (never looked at)."""
        out = web.StreamResponse(status=r.status, headers=headers)
        await out.prepare(request)
        async for data in r.content.iter_any():
            await out.write(data)
        await out.write_eof()
        return out

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with request.app["http"].post(
            upstream + request.path, data=body, headers={"Content-Type": "application/json"}
        ) as r:
            kind = r.headers.get("Content-Type", "application/json")
            if not kind.startswith("text/event-stream"):
                data = await r.read()
                return web.Response(status=r.status, body=data, headers={"Content-Type": kind})
            return await relay(request, r, {"Content-Type": kind})

    async def with_tokens(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        stream = bool(body.get("stream"))
        body.update(fields[stream])
        async with request.app["http"].post(
            upstream + request.path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
        ) as r:
            headers = {"Content-Type": r.headers.get("Content-Type", "application/json")}
            if not stream:
                data = await r.read()
                if parse:
                    orjson.loads(data)
                return web.Response(status=r.status, body=data, headers=headers)
            return await relay(request, r, headers)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.cleanup_ctx.append(ctx)
    app.router.add_post("/{tail:.*}", with_tokens if floor else handler)

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/", ready)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


class Stack:
    """The upstream (given) plus our proxy and the pass-through as subprocesses in front of it (and with `floors`
    one pass-through per `_FLOORS` entry). The proxy's record store is a temporary directory, removed at the exit
    (kept when the block or the start fails: `_workdir`)."""

    def __init__(
        self,
        upstream: str,
        model: str,
        proxy_args: tuple[str, ...] = (),
        floors: bool = False,
        no_deltas_flag: bool = True,
        proxy_env: dict[str, str] | None = None,
    ):
        self.upstream = upstream
        self.model = model
        self.proxy_args = proxy_args
        self.no_deltas_flag = no_deltas_flag  # False: a proxy older than session deltas (`proxy_flags.py --code`)
        self.proxy_env = proxy_env or {}  # the proxy's alone (another checkout's PYTHONPATH), not the pass-through's
        self.floors: list[tuple[str, int, subprocess.Popen[bytes]]] = []  # (path, port, process) when started
        self._with_floors = floors
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tmp = ""

    def __enter__(self) -> Stack:
        self.tmp = tempfile.mkdtemp(prefix="polar-bench-")
        try:
            self._start()
        except BaseException as exc:  # no `with` body will run: stop what started, keep the store
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def _start(self) -> None:
        env = {**os.environ, "POLAR_CONTROL_TOKEN": CONTROL, **self.proxy_env}
        self.polar_port, self.pt_port = free_port(), free_port()
        self.polar = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nemo_polar.proxy.cli",
                "--upstream",
                self.upstream,
                "--port",
                str(self.polar_port),
                "--store",
                self.tmp,
                "--served-model",
                self.model,
                # the bars are about independent calls, which this benchmark sends in one session; there identical
                # prompts (and the sized fake's prompt ids, one sequence cut to each prompt's length) would be stored
                # as session deltas of each other (proxy/deltas.py; measured by session_store.py)
                *(("--no-session-deltas",) if self.no_deltas_flag else ()),
                *self.proxy_args,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.pt = subprocess.Popen(
            [sys.executable, __file__, "--passthrough", str(self.pt_port), self.upstream],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs += [self.polar, self.pt]
        for path, mode, _, _ in _FLOORS if self._with_floors else ():
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, __file__, "--passthrough", str(port), self.upstream, "--floor", mode],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.procs.append(proc)
            self.floors.append((path, port, proc))
        for _, port, _ in self.floors:
            _wait(f"http://127.0.0.1:{port}/")
        _wait(f"http://127.0.0.1:{self.polar_port}/")
        _wait(f"http://127.0.0.1:{self.pt_port}/")
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.polar_port}/sessions",
            data=b"{}",
            method="POST",
            headers={"Authorization": f"Bearer {CONTROL}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req) as r:
            self.key = json.loads(r.read())["api_key"]

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        release(self.tmp, exc)

    def targets(self) -> list[tuple[str, str, dict[str, str], int | None]]:
        h = {"Content-Type": "application/json"}
        floors = [(path, f"http://127.0.0.1:{port}/v1/chat/completions", h, p.pid) for path, port, p in self.floors]
        return [
            ("direct", self.upstream + "/v1/chat/completions", h, None),
            ("passthrough", f"http://127.0.0.1:{self.pt_port}/v1/chat/completions", h, self.pt.pid),
            *floors,
            (
                "polar",
                f"http://127.0.0.1:{self.polar_port}/v1/chat/completions",
                {**h, "Authorization": f"Bearer {self.key}"},
                self.polar.pid,
            ),
        ]


def run_suite(
    label: str,
    stack: Stack,
    body: bytes | list[bytes],
    plan: dict[int, int],
    direct_variants: dict[str, bytes] | None = None,
) -> list[dict[str, Any]]:
    """Each target of `stack` at each concurrency of `plan`; `direct_variants` adds paths straight to the upstream
    with another body (run right after `direct`, compared with it)."""
    rows = []
    for c, n in plan.items():
        base: dict[str, Any] = {}
        targets = []
        for name, url, headers, pid in stack.targets():
            targets.append((name, url, headers, pid, body))
            if name == "direct":
                targets += [(v, url, headers, None, b) for v, b in (direct_variants or {}).items()]
        for name, url, headers, pid, sent in targets:
            lat, wall, cpu_s, sys_s = asyncio.run(_drive(url, headers, sent, c, n, pid))
            cpu = None if cpu_s is None else cpu_s / n
            row = {
                "upstream": label,
                "path": name,
                "concurrency": c,
                "n": n,
                "p50_ms": 1e3 * statistics.median(lat),
                "p99_ms": 1e3 * _pct(lat, 0.99),
                "rps": n / wall,
                "cpu_ms_per_req": None if cpu is None else 1e3 * cpu,
                "sys_ms_per_req": None if sys_s is None else 1e3 * sys_s / n,
            }
            if name == "direct":
                base = row
            row["added_p50_ms"] = row["p50_ms"] - base["p50_ms"]
            row["added_p99_ms"] = row["p99_ms"] - base["p99_ms"]
            row["throughput_ratio"] = row["rps"] / base["rps"]
            rows.append(row)
            print(_fmt(row), flush=True)
    return rows


HEADER = (
    f"{'upstream':<17} {'path':<18} {'c':>3} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8} "
    f"{'req/s':>8} {'ratio':>6} {'CPU ms/req':>10}"
)


def _fmt(r: dict[str, Any]) -> str:
    cpu = "-" if r["cpu_ms_per_req"] is None else f"{r['cpu_ms_per_req']:.2f}"
    return (
        f"{r['upstream']:<17} {r['path']:<18} {r['concurrency']:>3} {r['n']:>5} {r['p50_ms']:>8.2f} "
        f"{r['p99_ms']:>8.2f} {r['added_p50_ms']:>8.2f} {r['added_p99_ms']:>8.2f} {r['rps']:>8.1f} "
        f"{r['throughput_ratio']:>6.2f} {cpu:>10}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests")
    ap.add_argument("--no-vllm", action="store_true", help="skip the real vLLM-CPU part")
    ap.add_argument("--no-mix", action="store_true", help="skip the long-stream mix part")
    ap.add_argument("--mix-only", action="store_true", help="only the long-stream mix part")
    ap.add_argument(
        "--rounds", type=int, default=None, help="rounds of the long-stream mix's whole-mix rows (default 3, quick 1)"
    )
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--passthrough", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    ap.add_argument("--floor", choices=[mode for _, mode, _, _ in _FLOORS], help=argparse.SUPPRESS)  # --passthrough
    args = ap.parse_args()
    if args.passthrough:
        _passthrough_main(int(args.passthrough[0]), args.passthrough[1], args.floor)
        return 0
    rows: list[dict[str, Any]] = []
    scale = 0.25 if args.quick else 1.0
    rounds = args.rounds or (1 if args.quick else 3)
    if args.mix_only:
        rows = _mix_part(scale, rounds)
        _emit(rows)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    up_port = free_port()
    fake = subprocess.Popen(
        [sys.executable, "-m", "polar_lab.fake_upstream", "--port", str(up_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(f"http://127.0.0.1:{up_port}/health")
        body = json.dumps(request_body("fake-model", 64)).encode()
        with urllib.request.urlopen(
            urllib.request.Request(
                f"http://127.0.0.1:{up_port}/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
        ) as r:
            answer = r.read()
        print(
            f"request {len(body)} B; instant FAKE vLLM-dialect answer {len(answer)} B "
            f"(1,000 prompt ids, 64 sampled ids + logprobs)"
        )
        print(HEADER)
        with Stack(f"http://127.0.0.1:{up_port}", "fake-model") as st:
            # c=1 gets the most requests: its CPU per request is the docs/performance.md verdict
            rows += run_suite("fake", st, body, {1: int(2000 * scale), 16: int(1200 * scale), 64: int(2400 * scale)})
    finally:
        fake.terminate()
        fake.wait(10)
    if not args.no_mix:
        rows += _mix_part(scale, rounds)
    if not args.no_vllm:
        rows += _vllm_part(scale)
    _emit(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def _same_work_note(vs: list[dict[str, Any]]) -> str | None:
    """The proxy's p50 against `direct + logprobs` (the same vLLM work) per stream interval."""
    out = []
    for interval in dict.fromkeys(r["interval"] for r in vs):
        by = {r["path"]: r for r in vs if r["interval"] == interval}
        if "direct + logprobs" in by and "polar" in by:
            same, polar = by["direct + logprobs"], by["polar"]
            out.append(
                f"{interval} token(s) a chunk: polar {polar['p50_ms'] - same['p50_ms']:+.1f} ms p50 over "
                f"`direct + logprobs` ({polar['p50_ms']:.1f} vs {same['p50_ms']:.1f} ms; n={polar['n']})"
            )
    if not out:
        return None
    return (
        "The proxy against vLLM doing the same work (token ids and logprobs asked for directly): "
        + "; ".join(out)
        + "."
    )


def _latency_cells(r: dict[str, Any]) -> list[Any]:
    """A latency table row's cells: path, c, n, p50 / p99, added p50 / p99 (none for direct), req/s, ratio, CPU."""
    direct = r["path"] == "direct"
    return [
        r["path"],
        r["concurrency"],
        r["n"],
        r["p50_ms"],
        r["p99_ms"],
        None if direct else r["added_p50_ms"],
        None if direct else r["added_p99_ms"],
        r["rps"],
        r["throughput_ratio"],
        r["cpu_ms_per_req"],
    ]


def _emit(rows: list[dict[str, Any]]) -> None:
    """The tables for RESULTS.md and the docs/performance.md verdict (c=1, instant upstream)."""
    from _tables import note, table

    cols = ["path", "c", "n", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", "req/s", "× direct", "CPU ms / req"]
    for label, title in (
        (
            "fake",
            "Proxy overhead on an instant FAKE vLLM-dialect upstream (docs/performance.md's 4.5 KB request, 11.7 KB answer)",
        ),
        ("vllm-cpu", "Proxy overhead on real vLLM-CPU (tiny-qwen3, max_tokens 16)"),
    ):
        sel = [r for r in rows if r["upstream"] == label]
        if not sel:
            continue
        table(
            title,
            cols,
            [_latency_cells(r) for r in sel],
        )
    iv = [r for r in rows if r["upstream"] == "vllm-interval"]
    if iv:
        table(
            f"What vLLM's stream interval costs a client (real vLLM-CPU, tiny-qwen3, {STREAM_TOKENS}-token streamed answers)",
            ["tokens / chunk", "n", "time to first token p50 ms", "time to last token p50 ms", "chunks", "gap p50 ms"],
            [[r["interval"], r["n"], r["ttft_p50_ms"], r["total_p50_ms"], r["chunks"], r["gap_p50_ms"]] for r in iv],
        )
    vs = [r for r in rows if r["upstream"] == "vllm-stream"]
    if vs:
        table(
            f"Streams on real vLLM-CPU (tiny-qwen3, {STREAM_TOKENS}-token answers arriving as generated), "
            "1 and 8 tokens a chunk",
            ["tokens / chunk", *cols],
            [[r["interval"], *_latency_cells(r)] for r in vs],
            note=_same_work_note(vs),
        )
    _emit_verdict(rows)
    mix = [r for r in rows if r["upstream"].startswith("mix")]
    if mix:
        table(
            "Long streams: the peers mix (1k/8k-token prompts, 64/512-token answers, streaming and not) on the sized "
            "FAKE upstream, 1 and 8 tokens per upstream chunk; then each request kind alone at c=1",
            ["tokens / chunk", "requests", *cols],
            [[r["interval"], r["requests"], *_latency_cells(r)] for r in mix],
        )
        note(mix_verdict(mix))


def mix_verdict(mix: list[dict[str, Any]]) -> str:
    """Issue 23's long-stream bars, from rows measured in the same run."""
    by = {(r["interval"], r["requests"], r["path"], r["concurrency"]): r for r in mix}
    lines = []
    for interval in MIX_INTERVALS:
        for c in (1, 64):
            pol, pt = by.get((interval, "whole mix", "polar", c)), by.get((interval, "whole mix", "passthrough", c))
            if not (pol and pt and pt["cpu_ms_per_req"]):
                continue
            x = pol["cpu_ms_per_req"] / pt["cpu_ms_per_req"]
            line = (
                f"- {interval} token(s)/chunk, c={c}: proxy CPU per request {pol['cpu_ms_per_req']:.2f} ms vs the "
                f"pass-through's {pt['cpu_ms_per_req']:.2f} ms = **{x:.2f}×**{_spread(pol.get('cpu_ratios'))} "
                f"(≤ 2×: {'met' if x <= 2 else 'NOT met'}){_system_part(pol, pt)}"
            )
            if c == 64:
                y = pol["rps"] / pt["rps"]
                line += (
                    f"; throughput {pol['rps']:.0f} vs {pt['rps']:.0f} req/s = **{y:.2f}×**"
                    f"{_spread(pol.get('rps_ratios'))} (≥ 0.5×: {'met' if y >= 0.5 else 'NOT met'})"
                )
            lines.append(line)
            for floor, _, what, suffix in _FLOORS:
                row = by.get((interval, "whole mix", floor, c))
                if row and row["cpu_ms_per_req"]:
                    lines.append("  - " + _floor_line(pol, pt, row, c, what, suffix))
    pol, pt = by.get((1, LONG_PROMPTS, "polar", 64)), by.get((1, LONG_PROMPTS, "passthrough", 64))
    if pol and pt and pt["cpu_ms_per_req"]:
        lines.append(
            f"- harness-sized prompts ({LONG_PROMPTS}, {MIX_LONG}), 1 token/chunk, c=64 (not a bar: the size of an "
            f"agent session's later turns): proxy CPU per request {pol['cpu_ms_per_req']:.2f} ms vs the pass-through's "
            f"{pt['cpu_ms_per_req']:.2f} ms = **{pol['cpu_ms_per_req'] / pt['cpu_ms_per_req']:.2f}×**"
            f"{_spread(pol.get('cpu_ratios'))}; throughput **{pol['rps'] / pt['rps']:.2f}×**"
            f"{_spread(pol.get('rps_ratios'))}"
        )
        for floor, _, what, suffix in _FLOORS:
            row = by.get((1, LONG_PROMPTS, floor, 64))
            if row and row["cpu_ms_per_req"]:
                lines.append("  - " + _floor_line(pol, pt, row, 64, what, suffix))
    from nemo_polar.proxy.engines.vllm_stream import SCANNER  # the proxy subprocess runs this Python: the same scanner

    lines.append(
        f"- stream lines read by the {'C scanner (engines/_sse_scan.c)' if SCANNER == 'c' else 'regex (no C scanner built)'}"
        f"; load average {os.getloadavg()[0]:.1f}"
    )
    return "Long-stream bars (issue 23, same run):\n\n" + "\n".join(lines)


def _system_part(pol: dict[str, Any], pt: dict[str, Any]) -> str:
    """The kernel's part of both CPU figures (docs/performance.md, "The page cache on this VM"), when measured."""
    if pol.get("sys_ms_per_req") is None or pt.get("sys_ms_per_req") is None:
        return ""
    return f" [system CPU of it: {pol['sys_ms_per_req']:.2f} vs {pt['sys_ms_per_req']:.2f} ms]"


def _floor_line(pol: dict[str, Any], pt: dict[str, Any], floor: dict[str, Any], c: int, what: str, suffix: str) -> str:
    """A floor (`_FLOORS`: the pass-through asking for the proxy's token data, or also reading it) against the plain
    pass-through, and the proxy against it: the share of the proxy's extra CPU that the floor already pays."""
    cpu, pt_cpu, pol_cpu = floor["cpu_ms_per_req"], pt["cpu_ms_per_req"], pol["cpu_ms_per_req"]
    line = (
        f"{what}: {cpu:.2f} ms = {cpu / pt_cpu:.2f}× the plain one{_spread(floor.get('cpu_ratios'))}; "
        f"proxy vs it: **{pol_cpu / cpu:.2f}×**{_spread(pol.get('cpu_ratios' + suffix))}"
    )
    if pol_cpu > pt_cpu:
        line += (
            f"; that is {cpu - pt_cpu:+.2f} ms of the proxy's {pol_cpu - pt_cpu:+.2f} ms over the plain one "
            f"({100 * (cpu - pt_cpu) / (pol_cpu - pt_cpu):.0f} %)"
        )
    if c == 64:
        line += (
            f"; throughput {floor['rps']:.0f} req/s = {floor['rps'] / pt['rps']:.2f}× the plain one"
            f"{_spread(floor.get('rps_ratios'))}; proxy vs it: **{pol['rps'] / floor['rps']:.2f}×**"
            f"{_spread(pol.get('rps_ratios' + suffix))}"
        )
    return line


def _spread(ratios: list[float] | None) -> str:
    """Each round's ratio, when there were several rounds (the verdict itself is on the medians)."""
    if not ratios or len(ratios) < 2:
        return ""
    return f" (rounds: {', '.join(f'{r:.2f}' for r in ratios)})"


def _emit_verdict(rows: list[dict[str, Any]]) -> None:
    """docs/performance.md's verdict on its 4.5 KB request at c=1 (and a profile when it is missed)."""
    from _tables import note

    c1 = {r["path"]: r for r in rows if r["upstream"] == "fake" and r["concurrency"] == 1}
    if "polar" in c1:
        pol, pt = c1["polar"], c1.get("passthrough")
        cpu_ok, lat_ok = pol["cpu_ms_per_req"] <= 1.0, pol["added_p50_ms"] <= 3.0
        floor = (
            f" (the aiohttp pass-through: {pt['cpu_ms_per_req']:.2f} ms, +{pt['added_p50_ms']:.2f} ms)" if pt else ""
        )
        note(
            f"docs/performance.md targets at c=1 with capture on: CPU per request {pol['cpu_ms_per_req']:.2f} ms (≤ 1 ms: "
            f"{'met' if cpu_ok else 'NOT met'}), added p50 {pol['added_p50_ms']:.2f} ms (≤ 3 ms: "
            f"{'met' if lat_ok else 'NOT met'}){floor}. Load average during the run: {os.getloadavg()[0]:.1f}."
        )
        if not cpu_ok:
            prof = own_work_profile()
            own = sum(prof.values())
            parts = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in prof.items())
            note(
                f"Profile of the miss (CPU time of the proxy's own steps on this request, timed in-process now): "
                f"{parts}; together {own * 1e3:.2f} ms. The rest of the {pol['cpu_ms_per_req']:.2f} ms is the aiohttp "
                "server, the upstream HTTP exchange and the event loop, which the pass-through pays too (with aiohttp's client)."
            )


def own_work_profile(n: int = 400) -> dict[str, float]:
    """CPU seconds per request of each step the proxy adds to a pass-through (docs/performance.md's request and answer)."""
    import uuid

    from nemo_polar.proxy.dialects import openai_chat
    from nemo_polar.proxy.engines.base import Generation
    from nemo_polar.proxy.engines.vllm import VLLMEngine
    from nemo_polar.proxy.normalized import RouteMatch
    from nemo_polar.proxy.record_json import record_bytes
    from nemo_polar.proxy.store import RecordStore
    from nemo_polar.types import CompletionRecord
    from polar_lab.fake_upstream import FakeUpstream

    raw = json.dumps(request_body("fake-model", 64)).encode()
    answer = json.dumps(FakeUpstream()._chat_body({"model": "fake-model", "tools": [1]})).encode()
    route = RouteMatch(name="chat", params={}, query={}, headers={})
    import orjson

    def per(fn: Any) -> float:
        fn()
        t0 = time.process_time()
        for _ in range(n):
            fn()
        return (time.process_time() - t0) / n

    body = orjson.loads(raw)
    req = openai_chat.parse_request(body, route)
    data = orjson.loads(answer)
    res = VLLMEngine.parse_chat(data, "fake-model", Generation())
    rec = CompletionRecord(id=uuid.uuid4().hex, session_id="s", seq=0, dialect="openai_chat", arrived_at=0.0)
    rec.original_request, rec.request, rec.response = body, req.normalized_dict(), res.response_dict()
    rec.prompt_token_ids, rec.generation_token_ids = res.prompt_token_ids, res.generation_token_ids
    rec.generation_log_probs = res.generation_log_probs
    out = {
        "parse + normalise the request": per(lambda: openai_chat.parse_request(orjson.loads(raw), route)),
        "upstream body": per(lambda: orjson.dumps({"model": "m", "messages": req.messages, "tools": req.tools})),
        "parse + check the vLLM answer": per(
            lambda: VLLMEngine.parse_chat(orjson.loads(answer), "fake-model", Generation())
        ),
        "render the reply": per(lambda: orjson.dumps(openai_chat.render_response(res, req))),
        "encode the record": per(lambda: record_bytes(rec)),
    }

    async def commits(store: RecordStore) -> float:
        store.open()
        t0 = time.process_time()
        for i in range(n):
            rec.id, rec.seq = f"r{i}", i
            await store.commit(rec)
        store.close()
        return (time.process_time() - t0) / n

    with work_dir("polar-prof-") as tmp:
        out["SQLite WAL insert"] = asyncio.run(commits(RecordStore(tmp))) - out["encode the record"]
    return out


MIX_INTERVALS = (1, 8)  # tokens per upstream chunk: vLLM's default, and the embedded backend's --stream-interval
# harness-sized prompts (a session's prompts grow to ~30k tokens), whole mix at c=64, one token a chunk: (prompt tokens,
# answer tokens, stream) as in `peers.MIX_FAKE`
MIX_LONG = [(30000, 512, False), (30000, 64, True), (16000, 512, True), (24000, 64, False)]
LONG_PROMPTS = "16k-30k prompts"


def _mix_part(scale: float, rounds: int = 1) -> list[dict[str, Any]]:
    """The long-stream mix of `peers.py` (1k/8k-token prompts, 64/512-token answers, streaming and not) on the sized
    FAKE upstream, through the pass-through and the proxy at c=1 and c=64, then each request kind alone at c=1
    (where the proxy's CPU goes); once with one upstream chunk per token (vLLM's default) and once with 8 tokens a
    chunk (`--stream-interval 8`, what the embedded backend runs with). Each also through `passthrough+tokens`, the
    pass-through asking for the proxy's token data (how much of the gap is the bytes the engine sends back), and
    `passthrough+parse`, that one also reading non-streamed answers (how much is getting at the token data). The
    whole-mix rows are measured `rounds` times (each round: direct, the pass-throughs and proxy back to back) and
    reported as medians (`median_rows`): the machine is shared, and one round's ratio moves by ±20 %."""
    from peers import MIX_FAKE, mix_bodies

    rows: list[dict[str, Any]] = []
    bodies = [json.dumps(b).encode() for b in mix_bodies("fake-model", MIX_FAKE)]
    long_bodies = [json.dumps(b).encode() for b in mix_bodies("fake-model", MIX_LONG)]
    for interval in MIX_INTERVALS:
        up_port = free_port()
        argv = ["--port", str(up_port), "--sized", "--stream-interval", str(interval)]
        fake = subprocess.Popen(
            [sys.executable, "-m", "polar_lab.fake_upstream", *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait(f"http://127.0.0.1:{up_port}/health")
            print(
                f"long-stream mix, {interval} token(s) per upstream chunk (prompt tokens, answer tokens, stream): {MIX_FAKE}"
            )
            print(HEADER)
            with Stack(f"http://127.0.0.1:{up_port}", "fake-model", floors=True) as st:
                plan = {1: int(800 * scale), 64: int(2560 * scale)}
                got = median_rows([run_suite(f"mix/{interval}", st, bodies, plan) for _ in range(rounds)])
                for r in got:
                    r["requests"] = "whole mix"
                for (prompt, answer, stream), body in zip(MIX_FAKE, bodies, strict=True):
                    kind = f"{prompt // 1000}k/{answer}{' stream' if stream else ''}"
                    for r in run_suite(f"mix/{interval}", st, body, {1: int(200 * scale)}):
                        r["requests"] = kind
                        got.append(r)
                if interval == 1:  # harness-sized prompts: token data and record grow with the prompt
                    long_plan = {64: int(640 * scale)}
                    for r in median_rows([run_suite("mix/1", st, long_bodies, long_plan) for _ in range(rounds)]):
                        r["requests"] = LONG_PROMPTS
                        got.append(r)
            for r in got:
                r["interval"] = interval
            rows += got
        finally:
            fake.terminate()
            fake.wait(10)
    return rows


_FIGURES = (
    "p50_ms",
    "p99_ms",
    "rps",
    "cpu_ms_per_req",
    "sys_ms_per_req",
    "added_p50_ms",
    "added_p99_ms",
    "throughput_ratio",
)


# (path, the path it is compared with, suffix of the keys its per-round ratios go under)
_ROUND_RATIOS = (
    ("polar", "passthrough", ""),
    *((path, "passthrough", "") for path, _, _, _ in _FLOORS),
    *(("polar", path, suffix) for path, _, _, suffix in _FLOORS),
)


def median_rows(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per path and concurrency from several rounds of `run_suite` (same plan): every figure the median over
    the rounds; the rows of the proxy and of the floors (`_FLOORS`) also keep each round's CPU and throughput ratio
    to the pass-through of the same round (`cpu_ratios`, `rps_ratios`), and the proxy's its ratios to each floor
    (`cpu_ratios_vs_tokens`, `..._vs_parse`, and the same for `rps`), so the verdict can show their spread."""
    out = []
    for same in zip(*rounds, strict=True):
        row = {**same[0], "rounds": len(same)}
        for key in _FIGURES:
            vals = [r[key] for r in same if r.get(key) is not None]
            row[key] = statistics.median(vals) if vals else None
        out.append(row)
    medians = {(r["path"], r["concurrency"]): r for r in out}
    for c in {r["concurrency"] for r in out}:
        per_round = [{r["path"]: r for r in rnd if r["concurrency"] == c} for rnd in rounds]
        for path, floor, suffix in _ROUND_RATIOS:
            if (path, c) not in medians or (floor, c) not in medians:
                continue
            pairs = [(x[path], x[floor]) for x in per_round if path in x and floor in x]
            medians[path, c]["cpu_ratios" + suffix] = [
                a["cpu_ms_per_req"] / b["cpu_ms_per_req"] for a, b in pairs if b["cpu_ms_per_req"]
            ]
            medians[path, c]["rps_ratios" + suffix] = [a["rps"] / b["rps"] for a, b in pairs]
    return out


def _vllm_part(scale: float) -> list[dict[str, Any]]:
    try:
        from nemo_polar.backend import LocalVLLM, is_prepared  # type: ignore[attr-defined]
    except ImportError as exc:
        print(f"real vLLM-CPU part skipped: backend not available ({exc})")
        return []
    if not is_prepared("tiny-qwen3"):
        print("real vLLM-CPU part skipped: backend not prepared: run `polar backend prepare`")
        return []
    # the server at one token per chunk, so each request's `stream_interval` decides (vLLM takes the larger)
    with LocalVLLM(model="tiny-qwen3", extra_args=["--stream-interval", "1"]) as vllm:
        body = json.dumps(request_body(vllm.model, 16)).encode()
        print(f"real vLLM-CPU ({vllm.model}), max_tokens 16")
        print(HEADER)
        with Stack(vllm.base_url, vllm.model) as st:
            rows = run_suite(
                "vllm-cpu",
                st,
                body,
                {1: int(16 * scale) or 8, 16: int(64 * scale) or 32, 64: int(128 * scale) or 64},
            )
        rows += _stream_interval_rows(vllm.base_url, vllm.model, max(4, int(8 * scale)))
        rows += _vllm_stream_cpu(vllm.base_url, vllm.model, max(4, int(12 * scale)))
    return rows


def _vllm_stream_cpu(base_url: str, model: str, n: int) -> list[dict[str, Any]]:
    """CPU per streamed answer on real vLLM, where tokens arrive as they are generated (one read per chunk, not the
    whole answer at once as from the instant FAKE): pass-through and proxy, at 1 and 8 tokens a chunk (the proxy
    with `--stream-interval 8`; direct and the pass-through ask vLLM themselves). `direct + logprobs` asks vLLM
    directly for what the proxy asks it for (`return_token_ids`, `logprobs`, `top_logprobs: 0`), so the proxy's
    added latency is read against the same vLLM work."""
    rows: list[dict[str, Any]] = []
    for interval in (1, 8):
        body = {**request_body(model, STREAM_TOKENS), "stream": True, "stream_options": {"include_usage": True}}
        body.pop("tools")
        if interval > 1:
            body["stream_interval"] = interval
        args = ("--stream-interval", str(interval)) if interval > 1 else ()
        print(f"real vLLM-CPU, {STREAM_TOKENS}-token streams, {interval} token(s) a chunk")
        print(HEADER)
        with Stack(base_url, model, proxy_args=args) as st:
            same_work = {"direct + logprobs": json.dumps({**body, **engine_fields(True)}).encode()}
            for r in run_suite("vllm-stream", st, json.dumps(body).encode(), {1: n}, same_work):
                r["interval"] = interval
                rows.append(r)
    return rows


STREAM_TOKENS = 128


def _stream_interval_rows(base_url: str, model: str, n: int, tokens: int = STREAM_TOKENS) -> list[dict[str, Any]]:
    """What `--stream-interval` costs a client on real vLLM: time to the first token and to the last, and chunks per
    answer, streaming `tokens` tokens (`ignore_eos`) at 1 and at 8 tokens per chunk, the two alternating."""
    out: dict[int, dict[str, list[float]]] = {i: {"ttft": [], "total": [], "chunks": [], "gap": []} for i in (1, 8)}

    async def one(http: aiohttp.ClientSession, interval: int, keep: bool = True) -> None:
        body = {**request_body(model, tokens), "stream": True, "ignore_eos": True, "stream_interval": interval}
        body.update(CAPTURE_FIELDS)
        t0 = time.perf_counter()
        first, chunks, stamps, buf = None, 0, [], b""
        async with http.post(base_url + "/v1/chat/completions", json=body) as r:
            async for data in r.content.iter_any():
                buf += data
                n_tok = buf.count(b'"token_ids":[')
                if n_tok > chunks:
                    stamps.append(time.perf_counter())
                    first = first if first is not None else stamps[-1]
                    chunks = n_tok
        end = time.perf_counter()
        if not keep:
            return
        s = out[interval]
        s["ttft"].append(1e3 * ((first or end) - t0))
        s["total"].append(1e3 * (end - t0))
        s["chunks"].append(chunks)
        s["gap"].append(1e3 * (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1) if stamps else 0.0)

    async def run() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            await one(http, 1, keep=False)  # warm the prefix cache: no interval pays the cold prefill
            for _ in range(n):
                for interval in (1, 8):
                    await one(http, interval)

    asyncio.run(run())
    rows = []
    for interval, s in out.items():
        rows.append(
            {
                "upstream": "vllm-interval",
                "interval": interval,
                "n": len(s["ttft"]),
                "ttft_p50_ms": statistics.median(s["ttft"]),
                "total_p50_ms": statistics.median(s["total"]),
                "chunks": statistics.median(s["chunks"]),
                "gap_p50_ms": statistics.median(s["gap"]),
            }
        )
        print(
            f"stream interval {interval}: TTFT p50 {rows[-1]['ttft_p50_ms']:.1f} ms, last token p50 "
            f"{rows[-1]['total_p50_ms']:.1f} ms, {rows[-1]['chunks']:.0f} chunks (n={rows[-1]['n']})",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
