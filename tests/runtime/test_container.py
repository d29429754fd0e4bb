# SPDX-License-Identifier: Apache-2.0
"""The container runtime on the real engines (Docker and Podman): commands, limits, timeouts, the relay to a host
proxy over the unix socket, isolation probes from inside, a missing image, and reaping after a killed gateway.

Every container runs with `--network none`; the only listener the tests contact is on the host's loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from aiohttp import web

from nemo_polar.backend.server import free_port
from nemo_polar.rollout.gateway import Gateway, GatewayConfig
from nemo_polar.rollout.runtime import RuntimeSetupError, create_runtime
from nemo_polar.rollout.spec import RuntimeSpec
from nemo_polar.runtime.container import ContainerRuntime, gateway_owner
from nemo_polar.runtime.engines import Engine

REPO = Path(__file__).resolve().parents[2]


def _spec(engine: Engine, image: str, **kw: object) -> RuntimeSpec:
    return RuntimeSpec.model_validate({"kind": engine.kind, "image": image, "source": "example:median", **kw})


def _containers(engine: Engine, owner: str) -> list[str]:
    res = engine.run_sync("ps", "-a", "-q", "--filter", f"label=polar.owner={owner}")
    assert res.ok, res.stderr
    return res.stdout.split()


def test_commands_limits_timeout_diff_cleanup(container_engine: Engine, base_image: str, tmp_path: Path) -> None:
    owner = f"test-{os.getpid()}-basic"

    async def go() -> None:
        spec = _spec(container_engine, base_image, cpus=1.5, memory_mb=384)
        rt = await create_runtime("s1.agent", spec, tmp_path / "rt", proxy_port=9, owner=owner)
        assert isinstance(rt, ContainerRuntime) and rt.container is not None
        try:
            assert rt.agent_workdir == "/testbed"
            res = await rt.exec("pwd; cat stats.py | head -1; echo changed >> stats.py", timeout_s=60)
            assert res.ok, res
            assert res.stdout.splitlines()[0] == "/testbed"
            info = container_engine.run_sync("inspect", rt.container).stdout
            host_config = json.loads(info)[0]["HostConfig"]
            assert host_config["NetworkMode"] == "none"
            assert host_config["NanoCpus"] == 1_500_000_000
            assert host_config["Memory"] == 384 * 1024 * 1024
            assert host_config["PidsLimit"] == 4096
            # a timeout kills the whole tree, backgrounded children included
            res = await rt.exec("sleep 300 & sleep 300", timeout_s=1.5)
            assert res.timed_out and res.exit_code is None
            ps = await rt.exec("ps -eo args", timeout_s=30)
            assert "sleep 300" not in ps.stdout
            diff = await rt.diff()
            assert "+changed" in diff and "stats.py" in diff
            missing = await rt.exec(["no-such-program"], timeout_s=30)
            assert missing.exit_code is None
        finally:
            await rt.destroy()
        assert _containers(container_engine, owner) == []
        assert not (tmp_path / "rt").exists()

    asyncio.run(go())


def test_relay_reaches_only_the_host_proxy(container_engine: Engine, base_image: str, tmp_path: Path) -> None:
    """Inside, 127.0.0.1:<proxy port> is the host's proxy (through the relay); another host loopback listener
    and an outside address are unreachable; a write outside the workdir never reaches the host."""
    outside = tmp_path / "outside"
    outside.mkdir()
    probe = textwrap.dedent(
        f"""
        import json, socket, sys, urllib.request
        out = {{}}
        out["proxy"] = urllib.request.urlopen("http://127.0.0.1:{{}}/hello".format(sys.argv[1]), timeout=10).read().decode()
        for name, addr in (("other_loopback", ("127.0.0.1", int(sys.argv[2]))), ("outside", ("192.0.2.1", 80))):
            s = socket.socket(); s.settimeout(3)
            try:
                s.connect(addr); out[name] = "connected"
            except OSError as exc:
                out[name] = type(exc).__name__
        for name, path in (("host_dir", "{outside}/escape.txt"), ("harnesses", sys.argv[3] + "/escape.txt")):
            try:
                open(path, "w").write("x"); out[name] = "written"
            except OSError as exc:
                out[name] = type(exc).__name__
        print(json.dumps(out))
        """
    )

    async def go() -> dict[str, str]:
        hits: list[str] = []

        async def hello(request: web.Request) -> web.Response:
            hits.append(request.path)
            return web.Response(text="from-host-proxy")

        app = web.Application()
        app.router.add_get("/hello", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        port, other = free_port(), free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        other_server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", other)
        from nemo_polar.runtime.sandbox import host_cache_root

        harnesses = host_cache_root() / "harnesses"
        harnesses.mkdir(parents=True, exist_ok=True)
        rt = await create_runtime(
            "s2.agent", _spec(container_engine, base_image), tmp_path / "rt", proxy_port=port, owner="test-relay"
        )
        assert isinstance(rt, ContainerRuntime)
        try:
            await rt.write_file("probe.py", probe)
            res = await rt.exec(["python3", "probe.py", str(port), str(other), str(harnesses)], timeout_s=60)
            assert res.ok, res
            assert rt.forwarded == 1 and hits == ["/hello"]
            dests = {e.get("dest") for e in rt.connections() if e.get("event") == "connect"}
            assert dests == {f"127.0.0.1:{port}"}
        finally:
            await rt.destroy()
            other_server.close()
            await runner.cleanup()
        assert not (harnesses / "escape.txt").exists()
        return dict(json.loads(res.stdout.strip().splitlines()[-1]))

    out = asyncio.run(go())
    assert out["proxy"] == "from-host-proxy"
    assert out["other_loopback"] == "ConnectionRefusedError"
    assert out["outside"] == "OSError"  # ENETUNREACH: the namespace has no route at all
    assert out["host_dir"] in ("FileNotFoundError", "PermissionError")
    assert out["harnesses"] == "OSError"  # EROFS: mounted read-only
    assert not (outside / "escape.txt").exists()


def test_missing_image_is_a_clear_error(container_engine: Engine, tmp_path: Path) -> None:
    spec = RuntimeSpec(kind=container_engine.kind, image="polar-no-such-image:0")

    async def go() -> None:
        await create_runtime("s3.agent", spec, tmp_path / "rt", proxy_port=9, owner="test-missing")

    with pytest.raises(RuntimeSetupError, match=r"image polar-no-such-image:0 not present.*polar image build"):
        asyncio.run(go())
    assert not (tmp_path / "rt").exists()


_HOLDER = """
import asyncio, sys
from pathlib import Path
from nemo_polar.rollout.runtime import create_runtime
from nemo_polar.rollout.spec import RuntimeSpec

async def main():
    work = Path(sys.argv[1])
    spec = RuntimeSpec(kind=sys.argv[2], image=sys.argv[3], source="example:median")
    await create_runtime("held.agent", spec, work / "runtimes" / "held" / "agent", proxy_port=9, hidden=(work,))
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_killed_gateway_leaves_no_container_after_restart(
    container_engine: Engine, base_image: str, tmp_path: Path
) -> None:
    """A process holding a session container the way a gateway does is SIGKILLed; the next gateway started on the
    same work dir removes the container before it admits anything."""
    work = tmp_path / "gw"
    work.mkdir()
    owner = gateway_owner(work)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(work), container_engine.kind, base_image],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert len(_containers(container_engine, owner)) == 1
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert len(_containers(container_engine, owner)) == 1  # nothing cleaned up after a SIGKILL

    async def restart() -> None:
        gw = Gateway(GatewayConfig(node_id="n0", work_dir=str(work)))
        await gw.start()
        await gw.stop()

    asyncio.run(restart())
    assert _containers(container_engine, owner) == []
