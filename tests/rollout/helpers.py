# SPDX-License-Identifier: Apache-2.0
"""Test plumbing for the rollout service: in-loop server / gateway on loopback ports, a callback receiver, tasks.

The callback receiver is a real HTTP server on 127.0.0.1 standing in for a trainer (a fake trainer, named so):
it applies each delivery once per Idempotency-Key and can drop the connection instead of acknowledging the
first delivery of each key.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from nemo_polar import examples
from nemo_polar.rollout.gateway import Gateway, GatewayConfig
from nemo_polar.rollout.server import RolloutServer, ServerConfig
from nemo_polar.rollout.spec import TaskSpec


async def serve(app: web.Application, port: int = 0) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def start_server(tmp: Path, **kw: Any) -> tuple[web.AppRunner, str, RolloutServer]:
    server = RolloutServer(ServerConfig(journal_path=str(tmp / "rollout.sqlite"), **kw))
    runner, url = await serve(server.make_app())
    return runner, url, server


async def start_gateway(tmp: Path, server_url: str | None, **kw: Any) -> Gateway:
    kw.setdefault("heartbeat_s", 0.2)
    gw = Gateway(GatewayConfig(work_dir=str(tmp / "gw"), server_url=server_url, **kw))
    await gw.serve()
    return gw


def example_task(
    name: str, *, task_id: str | None = None, plans: tuple[str, ...] = ("fix_plan",), run_s: Any = 0.2, **over: Any
) -> TaskSpec:
    """An example task for the simulation agent, verified by swe_tests on a fresh runtime."""
    ex = examples.load(name)
    data: dict[str, Any] = {
        "task_id": task_id or f"ex-{name}",
        "instruction": ex.problem_statement,
        "num_samples": len(plans),
        "runtime": {"isolation": "none", "source": f"example:{name}"},
        "agent": {"harness": "simulation", "options": {"run_s": run_s}},
        "builder": "per_request",
        "evaluator": {
            "name": "swe_tests",
            "options": {"FAIL_TO_PASS": list(ex.fail_to_pass), "PASS_TO_PASS": list(ex.pass_to_pass)},
        },
        "plans": [getattr(ex, p) for p in plans],
        "timeout_s": 120,
        "metadata": {"group_id": name, "instance_id": ex.instance_id, "policy_version": 1},
        "session": {"refresh_runtime": True},
    }
    data.update(over)
    return TaskSpec.model_validate(data)


class CallbackReceiver:
    """A fake trainer endpoint: applies each Idempotency-Key once; optionally drops the first ack of each key."""

    def __init__(self, drop_first_ack: bool = True):
        self.drop_first_ack = drop_first_ack
        self.deliveries: Counter[str] = Counter()
        self.applied: dict[str, dict[str, Any]] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        key = request.headers["Idempotency-Key"]
        body = orjson.loads(await request.read())
        self.deliveries[key] += 1
        if key not in self.applied:
            self.applied[key] = body
        if self.drop_first_ack and self.deliveries[key] == 1:
            assert request.transport is not None
            request.transport.close()  # applied, but the acknowledgement never arrives
            return web.Response(status=500)
        return web.json_response({"ok": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/cb", self.handle)
        return app
