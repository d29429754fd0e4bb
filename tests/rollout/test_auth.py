# SPDX-License-Identifier: Apache-2.0
"""The rollout service's shared secret: every route of the server and the gateway answers 401 without it and 2xx
with it; gateways authenticate to the server (and the server to them), `PolarClient` to the server; a public bind
without a secret is refused at start. Real server, gateway and client on loopback; agents are SIMULATED (a timed
process applying the plan itself, no model), the evaluation is real."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from nemo_polar.rollout import PolarClient
from nemo_polar.rollout.auth import AuthConfigError, check_bind, is_loopback, resolve_secret
from nemo_polar.rollout.client import PolarClientError
from nemo_polar.rollout.stack import StackConfig, start_stack

from .helpers import example_task, start_gateway, start_server

SECRET = "s3cret-for-tests"


async def _call(http: aiohttp.ClientSession, method: str, url: str, body: Any, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    data = orjson.dumps(body) if body is not None else None
    async with http.request(method, url, data=data, headers=headers) as resp:
        if resp.content_type != "text/event-stream":
            await resp.read()
        return resp.status


def test_every_server_route_needs_the_secret(tmp_path: Path) -> None:
    async def main() -> dict[str, tuple[int, int, int]]:
        runner, url, _ = await start_server(tmp_path, secret=SECRET)
        gw = await start_gateway(tmp_path, url, secret=SECRET)
        task = example_task("median")
        out: dict[str, tuple[int, int, int]] = {}
        try:
            async with PolarClient(url, poll_wait_s=2, secret=SECRET) as client:
                await client.submit(task)
                results = await asyncio.wait_for(client.collect(task.task_id), timeout=120)
            assert len(results) == 1 and results[0].reward == 1.0  # dispatched to and reported by the gateway
            done = results[0].to_dict()
            tid = task.task_id
            routes: list[tuple[str, str, Any]] = [
                ("POST", "/tasks", task.model_dump(mode="json")),
                ("GET", f"/tasks/{tid}", None),
                ("GET", f"/tasks/{tid}/results?after=-1", None),
                ("GET", "/events", None),
                ("POST", "/nodes/register", {"node_id": "node-x", "url": "http://127.0.0.1:9", "capacity": 1}),
                ("POST", "/nodes/node-x/heartbeat", {"active": []}),
                ("POST", f"/nodes/{gw.config.node_id}/results", done),
                ("GET", "/nodes", None),
                ("GET", "/health", None),
                ("DELETE", f"/tasks/{tid}", None),
            ]
            timeout = aiohttp.ClientTimeout(total=30, sock_read=5)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                for method, path, body in routes:
                    out[f"{method} {path}"] = (
                        await _call(http, method, url + path, body, None),
                        await _call(http, method, url + path, body, "wrong"),
                        await _call(http, method, url + path, body, SECRET),
                    )
        finally:
            await gw.close()
            await runner.cleanup()
        return out

    for route, (without, wrong, with_) in asyncio.run(main()).items():
        assert (without, wrong, with_) == (401, 401, 200), route


def test_every_gateway_route_needs_the_secret(tmp_path: Path) -> None:
    async def main() -> dict[str, tuple[int, int, int]]:
        gw = await start_gateway(tmp_path, None, secret=SECRET)
        url = gw.config.public_url
        assert url is not None
        task = example_task("median", run_s=30)
        admit = {"session_id": "sess-1", "sample_index": 0, "attempt": 0, "task": task.model_dump(mode="json")}
        out: dict[str, tuple[int, int, int]] = {}
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                for method, path, body in [
                    ("POST", "/sessions", admit),
                    ("GET", "/sessions/sess-1", None),
                    ("GET", "/health", None),
                    ("GET", "/metrics", None),
                    ("DELETE", "/sessions/sess-1", None),
                ]:
                    out[f"{method} {path}"] = (
                        await _call(http, method, url + path, body, None),
                        await _call(http, method, url + path, body, "wrong"),
                        await _call(http, method, url + path, body, SECRET),
                    )
        finally:
            await gw.close()
        return out

    statuses = asyncio.run(main())
    assert statuses.pop("POST /sessions") == (401, 401, 202)  # 202: admitted
    for route, codes in statuses.items():
        assert codes == (401, 401, 200), route


def test_a_gateway_without_the_secret_cannot_register_and_a_client_without_it_is_refused(tmp_path: Path) -> None:
    async def main() -> tuple[list[Any], int]:
        runner, url, server = await start_server(tmp_path, secret=SECRET)
        intruder = await start_gateway(tmp_path, url, secret=None, node_id="intruder")
        try:
            await asyncio.sleep(1.0)  # several heartbeats (0.2 s) of trying to register
            nodes = list(server.nodes)
            async with PolarClient(url, secret="") as client:  # "" = no secret (not the environment's)
                try:
                    await client.status("anything")
                    status = 200
                except PolarClientError as exc:
                    status = exc.status
        finally:
            await intruder.close()
            await runner.cleanup()
        return nodes, status

    nodes, status = asyncio.run(main())
    assert nodes == [] and status == 401


def test_loopback_without_a_secret_still_works(tmp_path: Path) -> None:
    async def main() -> int:
        runner, url, _ = await start_server(tmp_path, secret=None)
        try:
            async with aiohttp.ClientSession() as http:
                return await _call(http, "GET", url + "/health", None, None)
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) == 200


def test_public_bind_without_a_secret_is_refused() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("node7.cluster")
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", SECRET)
    with pytest.raises(AuthConfigError, match="without a shared secret"):
        check_bind("0.0.0.0", None)


def test_secret_from_file_or_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLAR_ROLLOUT_SECRET_FILE", raising=False)
    monkeypatch.delenv("POLAR_ROLLOUT_SECRET", raising=False)
    assert resolve_secret() is None
    monkeypatch.setenv("POLAR_ROLLOUT_SECRET", "from-env")
    assert resolve_secret() == "from-env"
    (tmp_path / "secret").write_text("from-file\n")
    assert resolve_secret(tmp_path / "secret") == "from-file"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(AuthConfigError, match="empty"):
        resolve_secret(tmp_path / "empty")


def test_a_stack_with_a_secret_runs_a_task_end_to_end(tmp_path: Path) -> None:
    """`StackConfig.secret` (what `--secret-file` and `polar launch --ray` hand to every part) reaches the server
    and the gateway: the gateway registers and reports with it, the client needs it."""

    async def main() -> tuple[list[Any], int]:
        cfg = StackConfig(work_dir=str(tmp_path / "run"), secret=SECRET, heartbeat_s=0.2)
        async with await start_stack(cfg) as stack:
            assert stack.server_url is not None
            task = example_task("median")
            async with PolarClient(stack.server_url, secret="") as anonymous:
                with pytest.raises(PolarClientError) as refused:
                    await anonymous.submit(task)
            async with PolarClient(stack.server_url, poll_wait_s=2, secret=SECRET) as client:
                await client.submit(task)
                results = await asyncio.wait_for(client.collect(task.task_id), timeout=120)
        return results, refused.value.status

    results, refused = asyncio.run(main())
    assert refused == 401 and [r.reward for r in results] == [1.0]


def test_a_stack_refuses_a_public_bind_without_a_secret(tmp_path: Path) -> None:
    cfg = StackConfig(work_dir=str(tmp_path / "run"), host="0.0.0.0", secret=None)
    with pytest.raises(AuthConfigError, match="without a shared secret"):
        asyncio.run(start_stack(cfg))
    assert not (tmp_path / "run").exists()  # refused before anything was created or bound


@pytest.mark.parametrize("command", ["serve", "serve-rollout", "serve-gateway", "launch"])
def test_cli_refuses_a_public_bind_without_a_secret(command: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_ROLLOUT_SECRET")}
    args = [sys.executable, "-m", "nemo_polar.cli", command, "--host", "0.0.0.0", "--port", "0"]
    args += {
        "serve": ["--work-dir", str(tmp_path / "x")],
        "serve-rollout": ["--journal", str(tmp_path / "x" / "rollout.sqlite")],
        "serve-gateway": ["--node-id", "n0", "--server", "http://127.0.0.1:9", "--work-dir", str(tmp_path / "x")],
        "launch": ["--ray", "--work-dir", str(tmp_path / "x")],
    }[command]
    # bounded: were the check missing, the command would serve until killed
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "without a shared secret" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "x").exists()
