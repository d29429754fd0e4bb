# SPDX-License-Identifier: Apache-2.0
"""`nemo_polar.rollout.stack`: one assembly of proxy → gateway(s) → rollout server, one `close()`.

Covers: a stack with two gateways (each with its hosted proxy) runs a simulation task to completion and `close()`
leaves no listening port and no store thread behind; a failed start closes what it started; bad configs are
refused; the stack is assembled nowhere else in the shipped tree (a grep of constructor calls); every CLI that runs
a part of the stack exposes every option of that part (prefix-preserving generation included) and hands it to the
stack; the NeMo Gym `polar_swe` config has a field for each option and they reach the stack; `launch --ray` keeps
every option on each node.
"""

from __future__ import annotations

import ast
import asyncio
import socket
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from nemo_polar.cli import build_parser
from nemo_polar.rollout.client import PolarClient
from nemo_polar.rollout.stack import OPTION_GROUPS, StackConfig, config_from_args, flag_of, start_stack
from nemo_polar.rundir import read_results

from .helpers import example_task

ROOT = Path(__file__).resolve().parents[2]
GYM_SERVER = ROOT / "environments" / "resources_servers" / "polar_swe"
DEAD_UPSTREAM = "http://127.0.0.1:9"  # never contacted: no session calls a model in these tests


def _port_open(url: str) -> bool:
    host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, int(port))) == 0


def _store_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("polar-store")]


def test_two_gateways_run_a_task_and_close_leaves_nothing(tmp_path: Path) -> None:
    before = _store_threads()
    cfg = StackConfig(work_dir=str(tmp_path / "run"), upstreams=[DEAD_UPSTREAM], gateways=2, heartbeat_s=0.2)

    async def go() -> tuple[list[str], list[Any]]:
        stack = await start_stack(cfg)
        urls = [stack.server_url, *stack.gateway_urls, *(p.base_url for p in stack.proxies)]
        try:
            assert len(stack.gateways) == 2 and len(stack.proxies) == 2
            assert [g.config.node_id for g in stack.gateways] == ["node-0", "node-1"]
            assert all(_port_open(u) for u in urls if u)
            async with PolarClient(stack.server_url or "", poll_wait_s=2.0) as client:
                task = example_task("median", plans=("fix_plan", "noop_plan"))
                await client.submit(task)
                results = [r async for r in client.results(task.task_id)]
        finally:
            await stack.close()
        return [u for u in urls if u], results

    urls, results = asyncio.run(go())
    assert sorted(r.reward for r in results) == [0.0, 1.0]
    # each gateway's run directory and proxy store under WORK_DIR/<node_id>/, the journal at the top
    assert (tmp_path / "run" / "rollout.sqlite").exists()
    assert all((tmp_path / "run" / n / "records.sqlite").exists() for n in ("node-0", "node-1"))
    ran_on = {
        n for n in ("node-0", "node-1") for r in results if (tmp_path / "run" / n / "sessions" / r.session_id).is_dir()
    }
    assert ran_on  # the sessions' directories are in the nodes' run directories
    assert not any(_port_open(u) for u in urls), "a port still listens after close()"
    assert not Counter(_store_threads()) - Counter(before), "a record-store thread survived close()"


def test_standalone_proxy_and_server_only_stacks(tmp_path: Path) -> None:
    async def go() -> None:
        async with await start_stack(
            StackConfig(
                work_dir=str(tmp_path / "p"),
                upstreams=[DEAD_UPSTREAM, "http://127.0.0.1:11"],
                serve_rollout=False,
                gateways=0,
                prefix_preserving="nemo_rl",
                sampling={"temperature": 0.5},
                routing="round_robin",
            )
        ) as stack:
            assert stack.server_url is None and not stack.gateways and stack.proxy is not None
            assert stack.proxy.proxy.config.prefix_preserving == "nemo_rl"
            assert stack.proxy.proxy.upstreams.routing == "round_robin"  # what Upstreams.order reads per request
            assert stack.proxy.proxy.config.sampling == {"temperature": 0.5}
            assert _port_open(stack.proxy.base_url)
            assert (tmp_path / "p" / "records.sqlite").exists()
        async with await start_stack(StackConfig(work_dir=str(tmp_path / "s"), gateways=0)) as stack:
            assert stack.server_url and not stack.proxies and _port_open(stack.server_url)
            url = stack.server_url
        assert not _port_open(url)

    asyncio.run(go())


def test_the_proxys_limits_reach_the_harness_as_its_idle_limit(tmp_path: Path) -> None:
    """`read_timeout_s` and `pause_wait_s` raised on the stack reach its proxy, and a session's CLI is told to wait
    longer than both together (here the `shell` harness's `POLAR_IDLE_TIMEOUT_S`; the CLIs' own settings come from
    the same `HarnessContext.idle_timeout_s`: tests/harness/test_adapters.py)."""
    cfg = StackConfig(
        work_dir=str(tmp_path / "run"), upstreams=[DEAD_UPSTREAM], read_timeout_s=2400, pause_wait_s=1200
    )

    async def go() -> list[Any]:
        async with await start_stack(cfg) as stack:
            proxy = stack.proxies[0]
            assert (proxy.proxy.config.read_timeout_s, proxy.proxy.admission.pause_wait_s) == (2400, 1200)
            assert proxy.idle_limit_s == 2400 + 1200 + 600
            task = {
                "task_id": "idle-limit",
                "instruction": "report",
                "runtime": {"isolation": "none"},
                "agent": {"harness": "shell", "options": {"command_line": "echo idle=$POLAR_IDLE_TIMEOUT_S"}},
                "builder": "per_request",
                "evaluator": "session_completed",
                "timeout_s": 120,
            }
            async with PolarClient(stack.server_url or "", poll_wait_s=2.0) as client:
                await client.submit(task)
                return [r async for r in client.results("idle-limit")]

    (result,) = asyncio.run(go())
    log = (tmp_path / "run" / "sessions" / result.session_id / "agent.log").read_text()
    assert "idle=4200" in log.split(), log


def test_a_failed_start_closes_what_it_started(tmp_path: Path) -> None:
    """The second gateway's port is taken: the server and the first node are torn down before the error."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        cfg = StackConfig(work_dir=str(tmp_path), upstreams=[DEAD_UPSTREAM], gateway_port=taken)

        async def go() -> None:
            await start_stack(cfg)

        before = {t.name for t in threading.enumerate()}
        with pytest.raises(OSError):
            asyncio.run(go())
        assert {t.name for t in threading.enumerate()} - before == set()


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"prefix_preserving": "splice"}, "model_dir"),
        ({"prefix_preserving": "splize"}, "prefix_preserving"),
        ({"serve_rollout": True, "server_url": "http://x"}, "server_url"),
        ({"gateways": 2, "node_ids": ["a", "a"]}, "node_ids"),
        ({"gateways": 0, "serve_rollout": False}, "nothing to run"),
        ({"run_slots": 0}, "run_slots"),
        ({"upstream": ["http://x"]}, "upstream"),  # a typo of `upstreams`: extra keys are refused
    ],
)
def test_bad_configs_are_refused(bad: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        StackConfig(**bad)


# -- one assembly ----------------------------------------------------------------------------------------------------

# the parts of the stack; constructing one is assembling a stack
PARTS = {"Proxy", "HostedProxy", "Gateway", "RolloutServer"}
# where a part may be constructed: the stack, the module that defines it, and HostedProxy wrapping the proxy.
# The proxy package itself may build a `Proxy`: `polar proxy` is the proxy's own standalone command, not a stack.
ALLOWED = {
    "nemo_polar/rollout/stack.py": PARTS,
    "nemo_polar/rollout/proxylink.py": {"Proxy"},
    "nemo_polar/rollout/server.py": {"RolloutServer"},
    "nemo_polar/rollout/gateway.py": {"Gateway"},
}
ALLOWED_PACKAGES = {"nemo_polar/proxy/": {"Proxy"}}
SHIPPED = ("nemo_polar", "credit", "harness_adapters", "environments")


def _constructions(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in PARTS:
                found.add(name)
    return found


def _assembly_sites() -> list[str]:
    bad = []
    for top in SHIPPED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            allowed = ALLOWED.get(rel, set()).union(*(v for k, v in ALLOWED_PACKAGES.items() if rel.startswith(k)))
            extra = _constructions(path) - allowed
            if extra:
                bad.append(f"{rel} constructs {sorted(extra)}: assemble the stack with nemo_polar.rollout.stack")
    return bad


def test_the_stack_is_assembled_only_in_stack_py() -> None:
    assert _assembly_sites() == []


def test_the_assembly_check_catches_a_hand_built_stack(tmp_path: Path) -> None:
    p = tmp_path / "x.py"
    p.write_text("from nemo_polar.rollout.gateway import Gateway\ngw = Gateway(cfg, proxy=HostedProxy(pc))\n")
    assert _constructions(p) == {"Gateway", "HostedProxy"}


# -- every option reachable from every entry point -------------------------------------------------------------------

# command -> (parts it runs, flag overrides where the command names an option otherwise, options it cannot take: why)
CLIS: dict[tuple[str, ...], tuple[tuple[str, ...], dict[str, str], dict[str, str]]] = {
    ("serve",): (("proxy", "server", "gateway"), {}, {}),
    ("launch",): (("proxy", "server", "gateway"), {}, {}),
    ("serve-rollout",): (("server",), {}, {}),
    ("serve-gateway",): (("proxy", "gateway"), {}, {"gateways": "one node, named by --node-id"}),
    ("collect",): (
        ("proxy", "server", "gateway"),
        {"work_dir": "--out"},
        {
            "upstreams": "one upstream (--upstream) or the embedded backend",
            "routing": "one upstream: there is nothing to route between",
            "gateways": "one gateway: RUN_DIR is the gateway's run directory (sessions/, records.sqlite)",
        },
    ),
    ("session", "run"): (
        ("proxy",),
        {"served_model": "--served-model", "upstreams": "--upstream"},
        {},
    ),
}


def _subparser(path: tuple[str, ...]) -> Any:
    parser = build_parser()
    for name in path:
        action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("command", list(CLIS), ids=" ".join)
def test_each_cli_exposes_every_option_of_the_parts_it_runs(command: tuple[str, ...]) -> None:
    parts, renamed, cannot = CLIS[command]
    flags = {s for a in _subparser(command)._actions for s in a.option_strings}
    missing = [
        f"{opt} ({renamed.get(opt, flag_of(opt))})"
        for part in parts
        for opt in OPTION_GROUPS[part]
        if opt not in cannot and renamed.get(opt, flag_of(opt)) not in flags
    ]
    assert missing == [], f"polar {' '.join(command)} lacks {missing}"


SPLICE = [
    "--prefix-preserving",
    "splice",
    "--model-dir",
    "/m",
    "--eot-token-ids",
    "1,2",
    "--sampling",
    '{"top_p": 0.9}',
    "--routing",
    "round_robin",
    "--read-timeout-s",
    "900",
    "--pause-wait-s",
    "1200",
]


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--upstream", "http://u", "--run-slots", "3", "--gateways", "2", *SPLICE],
        ["launch", "--ray", "--upstream", "http://u", "--run-slots", "3", "--gateways", "2", *SPLICE],
        [
            "serve-gateway",
            "--node-id",
            "n",
            "--server",
            "http://s",
            "--upstream",
            "http://u",
            "--run-slots",
            "3",
            *SPLICE,
        ],
    ],
    ids=lambda a: a[0],
)
def test_rollout_clis_hand_every_option_to_the_stack(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    assert cfg.upstreams == ["http://u"] and cfg.run_slots == 3
    assert cfg.prefix_preserving == "splice" and cfg.model_dir == "/m" and cfg.eot_token_ids == [1, 2]
    assert cfg.sampling == {"top_p": 0.9}
    assert cfg.routing == "round_robin" and cfg.proxy_config("d").routing == "round_robin"
    assert cfg.proxy_config("d").read_timeout_s == 900 and cfg.proxy_config("d").pause_wait_s == 1200
    assert cfg.gateway_config(cfg.node_ids[0], None).builder_options["eot_token_ids"] == [1, 2]


def test_cli_flags_that_form_no_stack_exit_with_the_reason() -> None:
    args = build_parser().parse_args(["serve", "--upstream", "http://u", "--prefix-preserving", "splice"])
    with pytest.raises(SystemExit, match="model_dir"):
        config_from_args(args)
    args = build_parser().parse_args(["serve", "--sampling", "[1]"])
    with pytest.raises(SystemExit, match="JSON object"):
        config_from_args(args)


def test_launch_ray_keeps_every_option_on_each_node(tmp_path: Path) -> None:
    from nemo_polar.rollout.ray_launch import split

    cfg = StackConfig(
        work_dir=str(tmp_path),
        upstreams=["http://u"],
        gateways=2,
        prefix_preserving="splice",
        model_dir="/m",
        run_slots=3,
        max_attempts=5,
    )
    server, nodes = split(cfg)
    assert server.gateways == 0 and not server.upstreams and server.max_attempts == 5
    assert [n.node_ids for n in nodes] == [["node-0"], ["node-1"]]
    for n in nodes:
        assert not n.serve_rollout and n.prefix_preserving == "splice" and n.model_dir == "/m" and n.run_slots == 3
        assert Path(n.work_dir) == tmp_path / n.node_ids[0]


def test_collect_chooses_prefix_preserving_explicitly(tmp_path: Path) -> None:
    """The one place the copies disagreed: `polar collect` used to turn splice on by itself whenever it knew a model
    folder. The stack never infers it; collect's CLI default asks for it (embedded backend, or --model-dir with
    --eot-token-ids) and `--prefix-preserving` overrides it."""
    from nemo_polar.collect.cli import _upstream
    from nemo_polar.collect.collect import CollectOptions, Upstream, stack_config

    def up(*extra: str) -> Any:
        return _upstream(build_parser().parse_args(["collect", "t.jsonl", "--out", "o", *extra]))

    base = ["--upstream", "http://u", "--model-dir", "/m", "--eot-token-ids", "7"]
    assert up(*base).prefix_preserving == "splice"
    assert up(*base, "--prefix-preserving", "off").prefix_preserving is None
    assert up(*base, "--prefix-preserving", "nemo_rl").prefix_preserving == "nemo_rl"
    assert up("--upstream", "http://u").prefix_preserving is None
    opts = CollectOptions(out=tmp_path)
    assert stack_config(opts, Upstream("http://u", "m", "/m", (7,))).prefix_preserving is None  # not inferred
    cfg = stack_config(opts, Upstream("http://u", "m", "/m", (7,), "splice"))
    assert cfg.prefix_preserving == "splice" and cfg.eot_token_ids == [7] and cfg.node_ids == ["collect-0"]


# -- the NeMo Gym config ---------------------------------------------------------------------------------------------


def _gym_stack_module() -> Any:
    sys.path.insert(0, str(GYM_SERVER))
    try:
        import polar_stack

        return polar_stack
    finally:
        sys.path.remove(str(GYM_SERVER))


def test_the_gym_config_has_a_field_for_every_option_and_they_reach_the_stack(tmp_path: Path) -> None:
    ps = _gym_stack_module()
    doc = yaml.safe_load((GYM_SERVER / "configs" / "polar_swe.yaml").read_text())
    fields = doc["polar_swe"]["resources_servers"]["polar_swe"]
    options = [opt for group in OPTION_GROUPS.values() for opt in group]
    missing = [opt for opt in options if ps.GYM_FIELD.get(opt, opt) not in fields]
    assert missing == []
    # the Gym config model (app.py) declares the same fields; it needs nemo_gym to import, so read its source
    source = (GYM_SERVER / "app.py").read_text()
    model = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.ClassDef) and n.name == "PolarSweResourcesServerConfig"
    )
    declared = {n.target.id for n in model.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert [opt for opt in options if ps.GYM_FIELD.get(opt, opt) not in declared] == []

    fields.update(
        upstream_urls=["http://u/v1"], prefix_preserving="splice", model_dir="/m", eot_token_ids=[3], run_slots=4
    )
    fields.update(gateways=2, max_attempts=3, sampling={"temperature": 1.0}, routing="round_robin")
    cfg = ps.stack_config(str(tmp_path), fields)
    assert cfg.upstreams == ["http://u/v1"] and cfg.prefix_preserving == "splice" and cfg.model_dir == "/m"
    assert cfg.run_slots == 4 and cfg.gateways == 2 and cfg.max_attempts == 3 and cfg.node_timeout_s == 300
    assert cfg.node_ids == ["polar_swe-0", "polar_swe-1"] and cfg.sampling == {"temperature": 1.0}
    assert cfg.routing == "round_robin" and ps.stack_config(str(tmp_path), {}).routing == "sticky"


def test_the_gym_stack_starts_lazily_with_the_seed_upstream_and_stops(tmp_path: Path) -> None:
    ps = _gym_stack_module()

    async def go() -> None:
        stack = ps.PolarStack(ps.stack_config(str(tmp_path), {"prefix_preserving": "nemo_rl"}))
        await stack.ensure(DEAD_UPSTREAM + "/v1", "m")
        try:
            st = stack.status()
            assert st["started"] and st["upstreams"] == [DEAD_UPSTREAM] and st["served_model"] == "m"
            assert stack.stack.proxy.proxy.config.prefix_preserving == "nemo_rl"
            with pytest.raises(ps.UpstreamMismatch):
                await stack.ensure("http://127.0.0.1:10")
        finally:
            await stack.stop()
        assert not _port_open(st["gateway_url"]) and not _port_open(st["rollout_url"])

    asyncio.run(go())


def test_polar_demo_hands_collect_every_flag_and_collect_runs_on_the_stack(tmp_path: Path) -> None:
    """`polar demo` builds `polar collect`'s arguments from collect's own parser (a new collect flag cannot be
    missing there); a collect of simulation tasks then runs end to end on the stack (no model needed)."""
    from nemo_polar.collect.cli import run_collect
    from nemo_polar.demo import _collect_args
    from nemo_polar.rollout.spec import dump_jsonl

    tasks = tmp_path / "tasks.jsonl"
    dump_jsonl([example_task("median", plans=("fix_plan", "noop_plan"))], tasks)
    out = tmp_path / "run"
    args = _collect_args(tasks=str(tasks), out=out, no_live=True, no_credit=True, sampling='{"temperature": 0.5}')
    assert run_collect(args) == 0
    lines = read_results(out)
    assert sorted(r.reward for r in lines) == [0.0, 1.0]
    assert (out / "rollout.sqlite").exists() and (out / "summary.json").exists()
    with pytest.raises(AttributeError, match="no option"):
        _collect_args(tasks=str(tasks), out=out, no_such_flag=1)
