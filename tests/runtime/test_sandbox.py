# SPDX-License-Identifier: Apache-2.0
"""The bubblewrap sandbox: only the proxy is reachable (proved by the connect trace), private HOME and workdir,
cleared environment, timeouts and cancellation kill everything inside.

The "proxy" here is a small real aiohttp server on loopback standing in for the model proxy (the sandbox does not
care what speaks HTTP behind the relay); a second loopback server plays "somewhere else" that must stay unreached.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from aiohttp import web

from nemo_polar.runtime.sandbox import Sandbox, SandboxSpec, bwrap_available

from ..procs import processes_with

pytestmark = pytest.mark.skipif(
    bwrap_available() is None, reason="bubblewrap is not installed (make test installs Debian `bubblewrap`)"
)

PY = sys.executable


class LoopbackServer:
    """A real HTTP server on 127.0.0.1 that counts the requests it gets."""

    def __init__(self, name: str):
        self.name = name
        self.hits = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _ok(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(text=f"hello from {self.name}")

    async def __aenter__(self) -> LoopbackServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._ok)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    return work, home


PROBE = """
import errno, json, os, socket, sys, urllib.request
out = {}
out["proxy"] = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v1/ping", timeout=10).read().decode()
def attempt(host, port):
    s = socket.socket(); s.settimeout(3)
    try:
        return errno.errorcode.get(s.connect_ex((host, port)), "connected")
    finally:
        s.close()
out["other_loopback"] = attempt("127.0.0.1", int(sys.argv[2]))
out["public"] = attempt("1.1.1.1", 443)
out["dns"] = attempt("8.8.8.8", 53)
out["home"] = os.environ.get("HOME")
out["leak"] = os.environ.get("POLAR_TEST_HOST_SECRET")
open(os.path.join(os.environ["HOME"], "written-in-home"), "w").write("h")
open("written-in-workdir", "w").write("w")
print(json.dumps(out))
"""


def test_only_the_proxy_is_reachable_and_the_trace_proves_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setenv("POLAR_TEST_HOST_SECRET", "must-not-leak")
    work, home = _dirs(tmp_path)

    async def go() -> tuple[dict[str, str], object, int, int]:
        async with LoopbackServer("proxy") as proxy, LoopbackServer("elsewhere") as other:
            spec = SandboxSpec(workdir=work, home=home, proxy_port=proxy.port)
            async with Sandbox(spec) as sb:
                res = await sb.run(
                    [PY, "-c", PROBE, str(proxy.port), str(other.port)], env={"HOME": str(home)}, timeout_s=60
                )
            assert res.ok, res.stderr
            return json.loads(res.stdout), res, proxy.hits, other.hits

    out, res, proxy_hits, other_hits = asyncio.run(go())
    assert out["proxy"] == "hello from proxy"
    assert out["other_loopback"] == "ECONNREFUSED"  # the host's loopback is not the sandbox's
    assert out["public"] == "ENETUNREACH" and out["dns"] == "ENETUNREACH"  # no route out at all
    assert out["home"] == str(home) and out["leak"] is None
    assert (home / "written-in-home").read_text() == "h"
    assert (work / "written-in-workdir").read_text() == "w"
    assert proxy_hits == 1 and other_hits == 0
    connects = [e for e in res.connections if e["event"] == "connect"]  # type: ignore[attr-defined]
    assert len(connects) == 1 == res.forwarded  # type: ignore[attr-defined]
    assert res.destinations == {f"127.0.0.1:{connects[0]['dest'].split(':')[1]}"}  # type: ignore[attr-defined]


def test_host_home_is_hidden_but_the_python_runs(tmp_path: Path) -> None:
    work, home = _dirs(tmp_path)
    host_home = Path.home()
    probe = f"import os; print(sorted(os.listdir({str(host_home)!r})))"

    async def go() -> str:
        async with Sandbox(SandboxSpec(workdir=work, home=home, proxy_port=9)) as sb:
            res = await sb.run([PY, "-c", probe], env={"HOME": str(home)}, timeout_s=60)
        assert res.ok, res.stderr
        return res.stdout

    listed = asyncio.run(go())
    # only the mount points of what must stay visible (the cache, the Python installation) remain
    real = set(os.listdir(host_home))
    assert set(eval(listed)) <= real
    assert len(eval(listed)) < len(real) or not real


def test_timeout_kills_everything_inside(tmp_path: Path) -> None:
    work, home = _dirs(tmp_path)
    marker = f"polar-timeout-marker-{os.getpid()}"
    script = f"(exec -a {marker} sleep 300) & (exec -a {marker} sleep 300) & wait"

    async def go() -> object:
        async with Sandbox(SandboxSpec(workdir=work, home=home, proxy_port=9)) as sb:
            return await sb.run(["bash", "-c", script], env={}, timeout_s=2)

    res = asyncio.run(go())
    assert res.timed_out and res.exit_code is None  # type: ignore[attr-defined]
    assert list(processes_with(marker, unless="pytest")) == []


def test_cancellation_kills_everything_and_reraises(tmp_path: Path) -> None:
    work, home = _dirs(tmp_path)
    marker = f"polar-cancel-marker-{os.getpid()}"
    script = f"(exec -a {marker} sleep 300) & wait"

    async def go() -> None:
        async with Sandbox(SandboxSpec(workdir=work, home=home, proxy_port=9)) as sb:
            task = asyncio.create_task(sb.run(["bash", "-c", script], env={}, timeout_s=300))
            for _ in range(100):
                await asyncio.sleep(0.1)
                if list(processes_with(marker, unless="pytest")):
                    break
            assert list(processes_with(marker, unless="pytest")), "the sandboxed process never started"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    assert list(processes_with(marker, unless="pytest")) == []
