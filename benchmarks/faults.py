# SPDX-License-Identifier: Apache-2.0
"""The fault campaign: real proxy processes under injected faults, with figures per fault and dialect.

    .venv/bin/python benchmarks/faults.py [--sessions 3] [--calls 4] [--fuzz 10000] [--only kill,upstream,disk,fuzz]
        [--model tiny-qwen3]

Every row runs sessions of streamed calls, in each dialect the proxy speaks (OpenAI Chat, Anthropic Messages, OpenAI
Responses, Google generateContent), from a client that behaves as the CLIs do: it retries a call on a connection
error, a 5xx or 429, or a stream cut before its terminal part (bounded, with backoff), and gives up on a 4xx. The
proxy is the real `polar proxy` in its own process; the upstream is the FAKE vLLM server (`polar_lab.fake_upstream`,
named as a fake: a failure has to be provoked on demand). Faults:

- `server_kill` / `gateway_kill`: the rollout server (or its gateway) is SIGKILLed with sessions in every pool and
  restarted on the same journal (work dir and node id); its agents are SIMULATED (timed processes, no model);
- `gateway_kill_docker` / `gateway_kill_podman`: as `gateway_kill`, the sessions in containers of that engine
  (`polar-base`, built once and cached); the row also counts the containers the killed gateway left behind
  (the restarted gateway reaps them by their `polar.owner` label before it admits anything);
- `vllm_kill`: a REAL vLLM server (`LocalVLLM`, `--model`) is SIGKILLed (its process group) while sessions of every
  dialect are mid-stream, and restarted on the same port; calls fail over to the client's retries (the proxy answers
  a retryable 5xx and records the failure); recovery is the fault to the next answer received;
- `kill`: the proxy is SIGKILLed while a stream is in flight and restarted on the same port and store;
- `upstream`: a relay in front of the upstream answers 5 % of calls 502, holds 5 % past the proxy's read timeout
  and resets 5 % of connections (seeded);
- `disk`: the store lives on a 4 MiB tmpfs; it is filled while sessions run and freed again (needs root to mount;
  skipped with the reason otherwise);
- `fuzz`: N malformed or hostile requests per dialect (oversized bodies, deep JSON, invalid UTF-8, huge
  `max_tokens`, unknown fields, wrong types, path traversal in session keys, bad keys): 500s, crashes, RSS.

Columns: sessions run; calls whose answer a client received; ok records stored; lost (received, not stored);
duplicates (a call stored ok more than once, i.e. the client retried a call whose first answer was stored but cut
before it arrived); hung (a session that did not end within its deadline); time to recover (fault to the next
answer received). Traffic stays on loopback; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _path  # the repository root on sys.path, for polar_lab
from _tables import table

from nemo_polar.backend.server import free_port

TOKEN = "faults-control-token"
PY = sys.executable


# -- the dialects: (path, key header, body for a prompt, terminal part of a stream) --------------------------------
@dataclass(frozen=True)
class Dialect:
    name: str
    path: str
    header: str
    terminal: tuple[bytes, ...]  # any of these ends an answer (Responses: `incomplete` when max_tokens cut it)

    def body(self, prompt: str) -> dict[str, Any]:
        if self.name == "openai_chat":
            return {"model": "m", "stream": True, "messages": [{"role": "user", "content": prompt}]}
        if self.name == "anthropic":
            return {
                "model": "claude-x",
                "max_tokens": 64,
                "stream": True,
                "messages": [{"role": "user", "content": prompt}],
            }
        if self.name == "responses":
            return {"model": "m", "input": prompt, "stream": True}
        return {"contents": [{"role": "user", "parts": [{"text": prompt}]}]}

    def headers(self, key: str) -> dict[str, str]:
        value = f"Bearer {key}" if self.header == "authorization" else key
        return {self.header: value, "content-type": "application/json"}


DIALECTS = [
    Dialect("openai_chat", "/v1/chat/completions", "authorization", (b"data: [DONE]",)),
    Dialect("anthropic", "/v1/messages", "x-api-key", (b"event: message_stop",)),
    Dialect(
        "responses", "/v1/responses", "authorization", (b"event: response.completed", b"event: response.incomplete")
    ),
    Dialect("google", "/v1beta/models/gemini-x:streamGenerateContent?alt=sse", "x-goog-api-key", (b'"finishReason"',)),
]


# -- processes -------------------------------------------------------------------------------------------------------
def _wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up in {timeout_s:.0f} s")


def start_fake(chunk_delay_s: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    p = subprocess.Popen(
        [PY, "-m", "polar_lab.fake_upstream", "--port", str(port), "--chunk-delay-s", str(chunk_delay_s)],
        cwd=_path.REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    _wait_http(url + "/health")
    return p, url


def start_proxy(port: int, upstream: str, store: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "POLAR_CONTROL_TOKEN": TOKEN}
    p = subprocess.Popen(
        [PY, "-m", "nemo_polar.cli", "proxy", "--upstream", upstream, "--port", str(port), "--store", store, *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_http(f"http://127.0.0.1:{port}/")
    return p


def stop(p: subprocess.Popen[bytes] | None) -> None:
    if p is not None and p.poll() is None:
        p.kill()
        p.wait(10)


def admin(base: str, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def stored_records(base: str, session_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = -1
    for _ in range(1000):  # bounded paging
        page = admin(base, "GET", f"/sessions/{session_id}/records?after_seq={after}&limit=500")["records"]
        if not page:
            break
        out += page
        after = page[-1]["seq"]
    return out


# -- the client: one streamed call, retried as a CLI would -----------------------------------------------------------
@dataclass
class Tally:
    sessions: int = 0
    received: list[str] = field(default_factory=list)  # prompt ids whose answer arrived whole
    gave_up: int = 0
    hung: int = 0
    first_ok_after: dict[float, float] = field(default_factory=dict)  # fault time -> first answer after it
    statuses: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0  # calls sent whose answer has not ended yet
    gave_up_prompts: list[str] = field(default_factory=list)


def call_once(base: str, d: Dialect, key: str, prompt: str, timeout_s: float) -> tuple[str, int | str | None]:
    """'ok' | 'retry' | 'fail', with the HTTP status when there was one ("timeout" when the answer stalled past
    `timeout_s`: a hung call, counted apart)."""
    req = urllib.request.Request(
        base + d.path, data=json.dumps(d.body(prompt)).encode(), method="POST", headers=d.headers(key)
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
            return ("ok" if any(t in raw for t in d.terminal) else "retry"), resp.status
    except urllib.error.HTTPError as err:
        err.read()
        return ("retry" if err.code >= 500 or err.code == 429 else "fail"), err.code
    except TimeoutError:
        return "retry", "timeout"
    except urllib.error.URLError as err:
        return "retry", "timeout" if isinstance(err.reason, TimeoutError) else None
    except (OSError, http.client.HTTPException):  # refused, reset, cut mid-body
        return "retry", None


def run_session(
    base: str,
    d: Dialect,
    key: str,
    sid: str,
    calls: int,
    tally: Tally,
    faults: list[float],
    deadline_s: float,
    *,
    attempts: int = 10,
    backoff_cap_s: float = 2.0,
) -> None:
    """`calls` calls in turn, each retried up to `attempts` times with exponential backoff (0.2 s doubling, capped at
    `backoff_cap_s`), as the CLIs do; a session still going after `deadline_s` counts as hung."""
    end = time.monotonic() + deadline_s
    tally.sessions += 1
    for i in range(calls):
        prompt = f"fault-{sid}-{i}"
        for attempt in range(attempts):
            if time.monotonic() > end:
                tally.hung += 1
                return
            tally.in_flight += 1
            try:
                outcome, status = call_once(base, d, key, prompt, timeout_s=30)
            finally:
                tally.in_flight -= 1
            tally.statuses[str(status)] += 1
            if outcome == "ok":
                tally.received.append(prompt)
                now = time.time()
                for t in faults:
                    tally.first_ok_after.setdefault(t, now)
                break
            if outcome == "fail":
                tally.gave_up += 1
                tally.gave_up_prompts.append(prompt)
                break
            time.sleep(min(0.2 * 2**attempt, backoff_cap_s))
        else:
            tally.gave_up += 1
            tally.gave_up_prompts.append(prompt)


def score(base: str, sessions: dict[str, str], tally: Tally, faults: list[float]) -> dict[str, Any]:
    ok_by_prompt: Counter[str] = Counter()
    failed_by_prompt: Counter[str] = Counter()
    failed = 0
    for sid in sessions:
        for r in stored_records(base, sid):
            text = json.dumps(r.get("original_request"))
            into = ok_by_prompt
            if r.get("error") is not None:
                failed += 1
                into = failed_by_prompt
            for prompt in {p for p in tally.received} | {f"fault-{sid}-{i}" for i in range(256)}:
                if f'"{prompt}"' in text:
                    into[prompt] += 1
    lost = [p for p in tally.received if ok_by_prompt[p] == 0]
    dup = [p for p, n in ok_by_prompt.items() if n > 1]
    recover = [tally.first_ok_after[t] - t for t in faults if t in tally.first_ok_after]
    return {
        "sessions": tally.sessions,
        "received": len(tally.received),
        "stored": sum(ok_by_prompt.values()),
        "failed_records": failed,
        "lost": len(lost),
        "duplicates": len(dup),
        "hung": tally.hung,
        "gave_up": tally.gave_up,
        # a call the client gave up on with no failure record of it: a failure nobody could find afterwards
        "gave_up_unrecorded": sum(1 for p in tally.gave_up_prompts if failed_by_prompt[p] == 0),
        "failed_attempts": sum(tally.statuses.values()) - len(tally.received),
        "stalled_calls": tally.statuses.get("timeout", 0),
        "recover_s": max(recover) if recover else None,
    }


def new_sessions(base: str, n: int, tag: str) -> dict[str, str]:
    out = {}
    for i in range(n):
        s = admin(base, "POST", "/sessions", {"task_id": f"{tag}-{i}"})
        out[s["session_id"]] = s["api_key"]
    return out


# -- fault: proxy SIGKILL mid-stream + restart --------------------------------------------------------------------------
def row_kill(d: Dialect, work: Path, n_sessions: int, calls: int) -> dict[str, Any]:
    fake, up = start_fake(chunk_delay_s=0.03)  # 64 chunks: ~2 s a stream, so a kill lands mid-stream
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    store = str(work / f"kill-{d.name}")
    proxy = start_proxy(port, up, store)
    holder = {"proxy": proxy}
    tally, faults = Tally(), []
    try:
        sessions = new_sessions(base, n_sessions, f"kill-{d.name}")

        def killer() -> None:
            time.sleep(1.0)  # inside the first stream
            holder["proxy"].send_signal(signal.SIGKILL)
            holder["proxy"].wait(10)
            faults.append(time.time())
            holder["proxy"] = start_proxy(port, up, store)

        t = threading.Thread(target=killer)
        t.start()
        for sid, key in sessions.items():
            run_session(base, d, key, sid, calls, tally, faults, deadline_s=180)
        t.join(60)
        return score(base, sessions, tally, faults)
    finally:
        stop(holder["proxy"])
        stop(fake)


# -- fault: upstream 5xx / timeouts / resets -------------------------------------------------------------------------
class FaultyUpstream:
    """A relay in front of the upstream: per POST, seeded, 5 % 502, 5 % held past the proxy's read timeout, 5 %
    connection reset; the rest forwarded (whole body)."""

    def __init__(self, upstream: str, hold_s: float, seed: int = 22):
        self.upstream, self.hold_s, self.rng = upstream, hold_s, random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.base_url = ""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _handle(self, request: Any) -> Any:
        import aiohttp
        from aiohttp import web

        body = await request.read()
        fault = "pass"
        if request.method == "POST":
            x = self.rng.random()
            fault = "error" if x < 0.05 else "timeout" if x < 0.10 else "reset" if x < 0.15 else "pass"
        self.counts[fault] += 1
        if fault == "error":
            return web.json_response({"error": {"message": "injected", "type": "server_error"}}, status=502)
        if fault == "reset":
            request.transport.close()
            return web.Response(status=500)
        if fault == "timeout":
            await asyncio.sleep(self.hold_s)
        async with aiohttp.ClientSession() as http, http.request(
            request.method, self.upstream + request.path_qs, data=body or None,
            headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
        ) as up:  # fmt: skip
            return web.Response(body=await up.read(), status=up.status, content_type=up.content_type)

    def start(self) -> FaultyUpstream:
        from aiohttp import web

        self.thread.start()

        async def up() -> None:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", 0).start()
            self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

        asyncio.run_coroutine_threadsafe(up(), self.loop).result(30)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def row_upstream(d: Dialect, work: Path, n_sessions: int, calls: int) -> dict[str, Any]:
    fake, up = start_fake(chunk_delay_s=0.0)
    relay = FaultyUpstream(up, hold_s=4.0).start()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proxy = start_proxy(port, relay.base_url, str(work / f"up-{d.name}"), "--read-timeout-s", "2")
    tally = Tally()
    try:
        sessions = new_sessions(base, n_sessions, f"up-{d.name}")
        for sid, key in sessions.items():  # 5x the calls: a few of each injected fault per dialect
            run_session(base, d, key, sid, calls * 5, tally, [], deadline_s=600)
        out = score(base, sessions, tally, [])
        out["injected"] = dict(relay.counts)
        return out
    finally:
        stop(proxy)
        relay.stop()
        stop(fake)


# -- fault: vLLM SIGKILL mid-session + restart on the same port (REAL vLLM) --------------------------------------------
def row_vllm(
    work: Path, n_sessions: int, calls: int, model: str
) -> tuple[list[tuple[Dialect, dict[str, Any]]], dict[str, Any]]:
    """Sessions of every dialect at once through one `polar proxy` on a REAL vLLM server (`LocalVLLM`); once answers
    flow and calls are in flight, the server's process group (API server and engine core) is SIGKILLed and a new
    server is started on the same port. Clients retry as the CLIs do (up to 30 attempts, backoff capped at 5 s: about
    two minutes); after they finish, one more call per dialect checks that the
    proxy serves normally. Returns the per-dialect scores and the kill's own figures."""
    from nemo_polar.backend import LocalVLLM
    from nemo_polar.backend.server import group_alive

    llm = LocalVLLM(model).start()  # BackendError (not prepared, no vllm venv) ends the row with its reason
    vport = llm.port
    assert vport is not None
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    sampling = json.dumps({"max_tokens": 24, "temperature": 1.0})
    proxy: subprocess.Popen[bytes] | None = None
    holder: dict[str, Any] = {"llm": llm}
    tallies = {d.name: Tally() for d in DIALECTS}
    faults: list[float] = []
    kill: dict[str, Any] = {}
    try:
        proxy = start_proxy(
            port, llm.base_url, str(work / "vllm-kill"), "--served-model", llm.model, "--sampling", sampling
        )
        sessions = {d.name: new_sessions(base, n_sessions, f"vllm-{d.name}") for d in DIALECTS}

        def killer() -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:  # answers flowing (the server warm) and calls in flight
                if sum(len(t.received) for t in tallies.values()) >= len(DIALECTS) and any(
                    t.in_flight for t in tallies.values()
                ):
                    break
                time.sleep(0.05)
            kill["in_flight"] = sum(t.in_flight for t in tallies.values())
            kill["received_before"] = sum(len(t.received) for t in tallies.values())
            old = holder["llm"]
            os.killpg(old.pid, signal.SIGKILL)
            faults.append(time.time())
            for _ in range(100):  # the whole group gone (bounded)
                if not group_alive(old.pid):
                    break
                time.sleep(0.1)
            leader = old._proc
            old.stop("SIGKILLed by the fault campaign")  # reaps the leader
            kill["old_server_exit"] = leader.poll() if leader is not None else None
            t0 = time.monotonic()
            try:
                holder["llm"] = LocalVLLM(model, port=vport).start()
            except Exception as exc:  # the row then shows every call failing; the note says why
                kill["restart_error"] = f"{type(exc).__name__}: {exc}"[:300]
            kill["restart_s"] = time.monotonic() - t0

        def client(d: Dialect) -> None:
            for sid, key in sessions[d.name].items():
                run_session(base, d, key, sid, calls, tallies[d.name], faults, deadline_s=420, attempts=30,
                            backoff_cap_s=5.0)  # fmt: skip

        threads = [threading.Thread(target=client, args=(d,), daemon=True) for d in DIALECTS]
        for t in threads:
            t.start()
        # the kill and restart on this thread: LocalVLLM's PR_SET_PDEATHSIG ties the server's life to the thread that
        # started it, so a server started on a helper thread gets SIGTERM when that thread ends
        killer()
        for t in threads:
            t.join(480)
        kill["client_threads_alive"] = sum(t.is_alive() for t in threads)
        after: dict[str, str] = {}
        for d in DIALECTS:  # the proxy serves normally after the restart: a fresh session, one call
            (sid, key), = new_sessions(base, 1, f"vllm-after-{d.name}").items()  # fmt: skip
            outcome, status = call_once(base, d, key, f"fault-{sid}-0", timeout_s=60)
            after[d.name] = f"{outcome}:{status}"
        kill["after_restart"] = after
        kill["proxy_alive"] = proxy.poll() is None  # the proxy was never restarted
        return [(d, score(base, sessions[d.name], tallies[d.name], faults)) for d in DIALECTS], kill
    finally:
        stop(proxy)
        holder["llm"].stop()


# -- fault: the store's disk full --------------------------------------------------------------------------------------
def row_disk(d: Dialect, work: Path, n_sessions: int, calls: int) -> dict[str, Any] | str:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "not run: mounting a small tmpfs needs root"
    mnt = work / f"disk-{d.name}"
    mnt.mkdir()
    rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if rc.returncode != 0:
        return f"not run: mount failed ({rc.stderr.strip()[:80]})"
    fake = proxy = None
    try:
        fake, up = start_fake(chunk_delay_s=0.0)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proxy = start_proxy(port, up, str(mnt / "store"))
        sessions = new_sessions(base, n_sessions, f"disk-{d.name}")
        tally, faults = Tally(), []
        items = list(sessions.items())
        half = max(1, len(items) // 2)
        for sid, key in items[:half]:
            run_session(base, d, key, sid, calls, tally, faults, deadline_s=120)
        filler = mnt / "filler"
        with open(filler, "wb") as f:  # fill the filesystem to the last block
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        statuses_full: Counter[str] = Counter()
        sid, key = items[half] if half < len(items) else items[-1]
        for i in range(4):  # calls while full: expected a retryable 5xx, nothing half written
            outcome, status = call_once(base, d, key, f"fault-full-{i}", timeout_s=30)
            statuses_full[f"{outcome}:{status}"] += 1
        filler.unlink()
        faults.append(time.time())
        for sid, key in items[half:]:
            run_session(base, d, key, sid, calls, tally, faults, deadline_s=120)
        out = score(base, sessions, tally, faults)
        out["while_full"] = dict(statuses_full)
        out["proxy_alive"] = proxy.poll() is None
        return out
    finally:
        stop(proxy)
        stop(fake)
        subprocess.run(["umount", str(mnt)], capture_output=True)


# -- fault: rollout server / gateway SIGKILL (simulated agents: timed processes, no model) -----------------------------
def _spawn_cli(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PY, "-m", "nemo_polar.cli", *args],
        cwd=_path.REPO,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the gateway's agents die with it
    )


def _killpg(p: subprocess.Popen[bytes] | None) -> None:
    if p is not None and p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)


def _sim_task(task_id: str, n: int, run_s: float, runtime: dict[str, Any] | None = None) -> Any:
    from nemo_polar.rollout import TaskSpec

    return TaskSpec.model_validate(
        {
            "task_id": task_id,
            "instruction": "simulated",
            "num_samples": n,
            "runtime": runtime or {"isolation": "none"},
            "agent": {"harness": "simulation", "options": {"run_s": run_s}},
            "builder": "per_request",
            "evaluator": "session_completed",
            "timeout_s": 300 if runtime else 120,
        }
    )


class _Containers:
    """The container side of the gateway row: the engine started as the runtime starts it, `polar-base` (built
    once, cached by content hash), and the containers a gateway owns (label `polar.owner`)."""

    def __init__(self, kind: str, gw_work: Path):
        from nemo_polar.runtime import engines
        from nemo_polar.runtime.container import gateway_owner
        from nemo_polar.runtime.images import ensure_base

        self.started_docker = kind == "docker" and engines._pid_of(engines._docker_paths()["pid"]) is None
        self.engine = engines.get_engine(kind)
        self.image = ensure_base(self.engine).tag
        self.owner = gateway_owner(gw_work)
        self.runtime = {"kind": kind, "image": self.image, "source": "example:median"}

    def owned(self) -> list[str]:
        res = self.engine.run_sync("ps", "-a", "-q", "--no-trunc", "--filter", f"label=polar.owner={self.owner}")
        if not res.ok:
            raise RuntimeError(f"{self.engine.kind} ps failed: {res.stderr.strip()[-300:]}")
        return res.stdout.split()

    def close(self) -> None:
        from nemo_polar.runtime.container import reap
        from nemo_polar.runtime.engines import stop_docker

        reap(self.owner, (self.engine.kind,))
        if self.started_docker:
            stop_docker()


def row_service(which: str, work: Path, n: int, engine: str | None = None) -> dict[str, Any]:
    """Kill the rollout server (`which="server"`) or the gateway (`"gateway"`) with sessions in every pool, restart
    it on the same journal / work dir and node id, and collect the task. `engine` (`docker` | `podman`, gateway
    only): the sessions run in containers of that engine; the row also counts the containers the killed gateway
    left (those alive at the kill must be gone once the new gateway started, none of its own left at the end)."""
    from nemo_polar.rollout import PolarClient

    wd = work / f"svc-{which}{'-' + engine if engine else ''}"
    wd.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server_args = ["serve-rollout", "--port", str(port), "--journal", str(wd / "rollout.sqlite")]
    server_args += ["--node-timeout-s", "3" if which == "gateway" else "30", "--max-attempts", "3"]
    gw_args = ["serve-gateway", "--node-id", "node-0", "--server", url, "--work-dir", str(wd / "gw")]
    gw_args += ["--run-slots", "2", "--init-workers", "2", "--ready-buffer", "2", "--postrun-workers", "2"]
    procs: dict[str, subprocess.Popen[bytes] | None] = {"server": None, "gateway": None}
    ctr = _Containers(engine, wd / "gw") if engine else None
    extra: dict[str, Any] = {}

    async def main() -> dict[str, Any]:
        procs["server"] = _spawn_cli(server_args, wd / "server.log")
        await asyncio.to_thread(_wait_http, url + "/health")
        procs["gateway"] = _spawn_cli(gw_args, wd / "gateway.log")
        task = _sim_task(f"kill-{which}{'-' + engine if engine else ''}", n, 1.5, ctr.runtime if ctr else None)
        got: list[Any] = []
        fault_t = 0.0
        first_after: float | None = None
        async with PolarClient(url, poll_wait_s=1, timeout_s=10) as client:
            await client.submit(task)
            async for r in client.results(task.task_id):  # one result in: the others are in INIT / READY / RUNNING
                got.append(r)
                break
            _killpg(procs[which])
            fault_t = time.time()
            at_kill = await asyncio.to_thread(ctr.owned) if ctr else []
            await asyncio.sleep(0.5)
            procs[which] = _spawn_cli(server_args if which == "server" else gw_args, wd / f"{which}.log")
            try:
                async with asyncio.timeout(420 if ctr else 240):
                    async for r in client.results(task.task_id, after=len(got)):
                        got.append(r)
                        first_after = first_after or time.time()
                hung = 0
            except TimeoutError:
                hung = n - len({r.sample_index for r in got})
        if ctr:
            left: list[str] = []
            for _ in range(60):  # the last sessions' containers are removed as their POSTRUN ends (bounded wait)
                left = await asyncio.to_thread(ctr.owned)
                if not left:
                    break
                await asyncio.sleep(0.5)
            extra["containers_at_kill"] = len(at_kill)
            extra["killed_gateways_containers_left"] = len(set(at_kill) & set(left))
            extra["containers_left_at_end"] = len(left)
        per_sample = Counter(r.sample_index for r in got)
        return {
            **extra,
            "sessions": n,
            "received": len(got),
            "stored": len(per_sample),
            "lost": n - len(per_sample) - hung,
            "duplicates": sum(c - 1 for c in per_sample.values() if c > 1),
            "hung": hung,
            "recover_s": (first_after - fault_t) if first_after else None,
            "failed_results": Counter(
                (r.eval.failure_kind if r.eval else None) or r.status for r in got if r.status != "COMPLETED"
            ),
        }

    try:
        return asyncio.run(main())
    finally:
        _killpg(procs["gateway"])
        _killpg(procs["server"])
        if ctr:
            ctr.close()


# -- the fuzzer -------------------------------------------------------------------------------------------------------
def _deep(n: int) -> bytes:
    return b'{"messages":' + b"[" * n + b"]" * n + b"}"


def random_case(kind: str, d: Dialect, rng: random.Random) -> tuple[str, str, bytes, dict[str, str]]:
    good = d.body("fuzz")
    if kind == "unknown_fields":
        return kind, d.path, json.dumps({**good, f"x{rng.randrange(1000)}": {"y": [1, None]}}).encode(), {}
    if kind == "wrong_types":
        return kind, d.path, json.dumps({k: rng.choice([1, None, [], "s", {"a": 1}]) for k in good}).encode(), {}
    return kind, d.path, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))), {}  # not_json


def fuzz_cases(d: Dialect, rng: random.Random) -> list[tuple[str, str, bytes, dict[str, str]]]:
    """(kind, path, body, headers) — one of each kind (the random kinds are drawn anew per request)."""
    good = d.body("fuzz")
    huge = {**good, "max_tokens": 10**12, "max_output_tokens": 10**12, "generationConfig": {"maxOutputTokens": 10**12}}
    return [
        ("oversized", d.path, b'{"x":"' + b"a" * (70 * 1024 * 1024) + b'"}', {}),
        ("deep_json", d.path, _deep(100_000), {}),
        ("invalid_utf8", d.path, b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe\xc3\x28"}]}', {}),
        ("huge_max_tokens", d.path, json.dumps(huge).encode(), {}),
        random_case("unknown_fields", d, rng),
        random_case("wrong_types", d, rng),
        random_case("not_json", d, rng),
        ("traversal_key", "/s/..%2F..%2Fetc%2Fpasswd" + d.path, json.dumps(good).encode(), {"skip_key": "1"}),
        ("bad_key", d.path, json.dumps(good).encode(), {"bad_key": "1"}),
    ]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fuzz_row(d: Dialect, work: Path, n: int) -> dict[str, Any]:
    fake, up = start_fake(chunk_delay_s=0.0)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proxy = start_proxy(port, up, str(work / f"fuzz-{d.name}"))
    rng = random.Random(22)
    statuses: Counter[int] = Counter()
    by_kind: Counter[str] = Counter()
    errors = 0
    try:
        key = next(iter(new_sessions(base, 1, f"fuzz-{d.name}").values()))
        rss0 = rss_kib(proxy.pid)
        fixed = {c[0]: c for c in fuzz_cases(d, rng)}
        kinds = [k for k in fixed if k not in ("oversized", "deep_json")]
        for i in range(n):
            kind = "oversized" if i % 500 == 0 else "deep_json" if i % 50 == 25 else kinds[i % len(kinds)]
            if kind in ("unknown_fields", "wrong_types", "not_json"):  # random each time
                _, path, body, extra = random_case(kind, d, rng)
            else:
                _, path, body, extra = fixed[kind]
            headers = d.headers("wrong-key" if extra.get("bad_key") else key)
            if extra.get("skip_key"):
                headers.pop(d.header, None)
            req = urllib.request.Request(base + path, data=body, method="POST", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    resp.read()
                    statuses[resp.status] += 1
            except urllib.error.HTTPError as err:
                err.read()
                statuses[err.code] += 1
                if err.code >= 500:
                    by_kind[kind] += 1
            except (OSError, http.client.HTTPException):
                errors += 1
            if proxy.poll() is not None:
                break
        rss1 = rss_kib(proxy.pid) if proxy.poll() is None else 0
        return {
            "requests": sum(statuses.values()) + errors,
            "status_500": statuses.get(500, 0),
            "status_5xx": sum(v for k, v in statuses.items() if k >= 500),
            "fivexx_kinds": dict(by_kind),
            "conn_errors": errors,
            "crashed": proxy.poll() is not None,
            "rss_mib": (round(rss0 / 1024, 1), round(rss1 / 1024, 1)),
            "statuses": dict(sorted(statuses.items())),
        }
    finally:
        stop(proxy)
        stop(fake)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--calls", type=int, default=4, help="calls per session")
    ap.add_argument("--fuzz", type=int, default=10_000, help="fuzzer requests per dialect")
    ap.add_argument("--samples", type=int, default=8, help="samples of the server / gateway kill tasks")
    ap.add_argument(
        "--only",
        default="server_kill,gateway_kill,gateway_kill_docker,gateway_kill_podman,vllm_kill,kill,upstream,disk,fuzz",
    )
    ap.add_argument("--model", default="tiny-qwen3", help="the prepared model of the vllm_kill row")
    ap.add_argument("--dialects", default=",".join(d.name for d in DIALECTS))
    args = ap.parse_args()
    only = set(args.only.split(","))
    dialects = [d for d in DIALECTS if d.name in args.dialects.split(",")]
    work = Path(tempfile.mkdtemp(prefix="polar-faults-"))
    rows: list[list[Any]] = []
    notes: list[str] = []
    t0 = time.monotonic()
    try:
        for which in ("server", "gateway"):
            if f"{which}_kill" in only:
                r = row_service(which, work, args.samples)
                print(f"{which}_kill: {json.dumps(r, default=str)}", flush=True)
                rows.append([f"{which} SIGKILL", "– (simulated agents)", r["sessions"], r["received"], r["stored"],
                             r["lost"], r["duplicates"], r["hung"], r["recover_s"]])  # fmt: skip
                notes.append(f"{which}_kill: results not COMPLETED {json.dumps(dict(r['failed_results']))}")
        for kind in ("docker", "podman"):
            if f"gateway_kill_{kind}" in only:
                try:
                    r = row_service("gateway", work, args.samples, engine=kind)
                except Exception as exc:  # an engine that cannot run here: the row says why
                    rows.append(
                        [f"gateway SIGKILL ({kind})", f"not run: {type(exc).__name__}: {exc}"[:200]] + [""] * 7
                    )
                    continue
                print(f"gateway_kill_{kind}: {json.dumps(r, default=str)}", flush=True)
                where = (f"– (simulated agents in {kind} containers: {r['containers_at_kill']} alive at the kill, "
                         f"{r['killed_gateways_containers_left']} of them left after the restart, "
                         f"{r['containers_left_at_end']} left at the end)")  # fmt: skip
                rows.append([f"gateway SIGKILL ({kind})", where, r["sessions"], r["received"], r["stored"], r["lost"],
                             r["duplicates"], r["hung"], r["recover_s"]])  # fmt: skip
                notes.append(f"gateway_kill_{kind}: results not COMPLETED {json.dumps(dict(r['failed_results']))}")
        if "vllm_kill" in only:
            from nemo_polar.backend.server import BackendError

            try:
                per_dialect, kill = row_vllm(work, args.sessions, args.calls, args.model)
            except BackendError as exc:
                rows.append([f"vLLM SIGKILL ({args.model})", f"not run: {exc}"[:200]] + [""] * 7)
            else:
                print(f"vllm_kill: {json.dumps(kill)}", flush=True)
                for d, r in per_dialect:
                    print(f"vllm_kill {d.name}: {json.dumps(r)}", flush=True)
                    rows.append([f"vLLM SIGKILL ({args.model})", d.name, r["sessions"], r["received"], r["stored"],
                                 r["lost"], r["duplicates"], r["hung"], r["recover_s"]])  # fmt: skip
                    notes.append(f"vllm_kill/{d.name}: " + json.dumps({k: r[k] for k in (
                        "gave_up", "gave_up_unrecorded", "failed_attempts", "failed_records", "stalled_calls")}))  # fmt: skip
                notes.append(f"vllm_kill: {json.dumps(kill)}")
        for fault, fn in (("kill", row_kill), ("upstream", row_upstream), ("disk", row_disk)):
            if fault not in only:
                continue
            for d in dialects:
                r = fn(d, work, args.sessions, args.calls)
                if isinstance(r, str):
                    rows.append([fault, d.name, r, "", "", "", "", "", ""])
                    continue
                rows.append([fault, d.name, r["sessions"], r["received"], r["stored"], r["lost"], r["duplicates"],
                             r["hung"], r["recover_s"]])  # fmt: skip
                extra = {
                    k: r[k] for k in ("gave_up", "failed_records", "injected", "while_full", "proxy_alive") if k in r
                }
                notes.append(f"{fault}/{d.name}: {json.dumps(extra)}")
                print(f"{fault} {d.name}: {json.dumps(r)}", flush=True)
        if rows:
            table(
                "Fault campaign: sessions through the real rollout service and proxy (FAKE upstream; the vLLM rows on real "
                "vLLM) under injected faults",
                ["fault", "dialect", "sessions", "received", "stored ok", "lost", "duplicates", "hung", "recover s"],
                rows,
                note="proxy rows: received = calls whose whole answer (terminal part included) reached the client, "
                "stored ok = records without error for those calls (cut streams and upstream errors are kept as failure "
                "records, not counted here); server / gateway rows: sessions = samples, received = results the "
                "trainer's client got, stored = samples with a result. Details per row: " + "; ".join(notes),
            )
        if "fuzz" in only:
            frows = []
            for d in dialects:
                r = fuzz_row(d, work, args.fuzz)
                print(f"fuzz {d.name}: {json.dumps(r)}", flush=True)
                frows.append([d.name, r["requests"], r["status_500"], r["status_5xx"], r["conn_errors"], r["crashed"],
                              f"{r['rss_mib'][0]} → {r['rss_mib'][1]}", json.dumps(r["statuses"])])  # fmt: skip
            table(
                f"Fuzzer: {args.fuzz:,} malformed or hostile requests per dialect",
                ["dialect", "requests", "500", "5xx", "conn errors", "crashed", "RSS MiB", "statuses"],
                frows,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"faults: {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
