# SPDX-License-Identifier: Apache-2.0
"""The serving processes' event loop (`proxy/tuning.py`): uvloop's where installed, asyncio's on request, a clear
error for a loop that cannot be made; and a real `polar proxy` on each answering calls and streams through the
FAKE upstream (the lean upstream client reads uvloop's transports as well as asyncio's)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

from nemo_polar.backend.server import free_port
from nemo_polar.proxy import tuning
from tests.proxy.conftest import http_json

try:
    import uvloop
except ImportError:  # the package depends on it on Linux; a venv without it runs everything on asyncio's loop
    uvloop = None

needs_uvloop = pytest.mark.skipif(uvloop is None, reason="uvloop is not installed in this venv")
TOKEN = "event-loop-control-token"
ROOT = Path(__file__).resolve().parents[2]


@needs_uvloop
def test_auto_is_uvloop_and_asyncio_on_request(monkeypatch):
    monkeypatch.delenv(tuning.EVENT_LOOP_ENV, raising=False)
    for choice, want in ((None, "uvloop"), ("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")):
        loop = tuning.serving_loop(choice)
        try:
            assert tuning.loop_name(loop) == want, choice
        finally:
            loop.close()
    monkeypatch.setenv(tuning.EVENT_LOOP_ENV, "asyncio")
    loop = tuning.serving_loop()
    assert type(loop).__module__.startswith("asyncio")
    loop.close()
    loop = tuning.serving_loop("uvloop")  # the argument over the environment
    assert tuning.loop_name(loop) == "uvloop"
    loop.close()


def test_unknown_loop_is_refused_and_nothing_runs(monkeypatch):
    ran = []

    async def main() -> None:
        ran.append(1)

    with pytest.raises(ValueError, match="unknown event loop 'tokio'"):
        tuning.serving_loop("tokio")
    monkeypatch.setenv(tuning.EVENT_LOOP_ENV, "tokio")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine left un-awaited would warn
        with pytest.raises(ValueError, match=tuning.EVENT_LOOP_ENV):
            tuning.run_serving(main())
    assert ran == []


def test_run_serving_returns_the_coroutines_value(monkeypatch):
    monkeypatch.delenv(tuning.EVENT_LOOP_ENV, raising=False)

    async def main() -> str:
        await asyncio.sleep(0)
        return tuning.loop_name()

    assert tuning.run_serving(main()) == ("asyncio" if uvloop is None else "uvloop")
    assert tuning.run_serving(main(), "asyncio") == "asyncio"


def _wait(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: the process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(url)


@pytest.fixture(scope="module")
def fake_upstream():
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "polar_lab.fake_upstream", "--port", str(port)],
        cwd=ROOT,  # polar_lab lives at the repository root
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(f"http://127.0.0.1:{port}/health", p)
        yield f"http://127.0.0.1:{port}"
    finally:
        p.terminate()
        p.wait(10)


@pytest.mark.parametrize("flag", [None, "asyncio"])
def test_polar_proxy_serves_on_its_loop(tmp_path, fake_upstream, flag):
    if flag is None and uvloop is None:
        pytest.skip("uvloop is not installed in this venv: the default loop is asyncio's, the other case covers it")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != tuning.EVENT_LOOP_ENV}
    argv = [sys.executable, "-m", "nemo_polar.proxy.cli", "--upstream", fake_upstream, "--port", str(port)]
    argv += ["--store", str(tmp_path / "store"), *(["--event-loop", flag] if flag else [])]
    p = subprocess.Popen(
        argv, env={**env, "POLAR_CONTROL_TOKEN": TOKEN}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait(base + "/", p)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, st = http_json("GET", base + "/admin/status", headers=auth)
        assert status == 200 and st["event_loop"] == (flag or "uvloop")
        status, s = http_json("POST", base + "/sessions", {"task_id": "loop"}, headers=auth)
        assert status == 201
        key = {"Authorization": f"Bearer {s['api_key']}"}
        messages = [{"role": "user", "content": "hi"}]
        status, out = http_json("POST", base + "/v1/chat/completions", {"model": "m", "messages": messages}, key)
        assert status == 200 and out["choices"][0]["message"]["content"]
        req = urllib.request.Request(
            base + "/v1/chat/completions",
            data=json.dumps({"model": "m", "messages": messages, "stream": True}).encode(),
            headers={**key, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.read().rstrip().endswith(b"data: [DONE]")
        status, recs = http_json("GET", f"{base}/sessions/{s['session_id']}/records", headers=auth)
        assert status == 200
        rows = recs["records"]
        assert len(rows) == 2 and all(r["prompt_token_ids"] and r["generation_token_ids"] for r in rows)
    finally:
        p.terminate()
        p.wait(10)


def test_polar_proxy_refuses_an_unknown_loop(tmp_path):
    env = {**os.environ, tuning.EVENT_LOOP_ENV: "tokio"}
    argv = [sys.executable, "-m", "nemo_polar.proxy.cli", "--upstream", "http://127.0.0.1:9", "--port", "9"]
    out = subprocess.run([*argv, "--store", str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown event loop 'tokio'" in out.stderr
