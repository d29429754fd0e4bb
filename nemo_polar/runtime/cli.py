# SPDX-License-Identifier: Apache-2.0
"""`polar session run`: one harness session through an embedded proxy, written to a run directory.

It exits 0 only when the harness exited 0 and got at least one model answer; otherwise 1, saying why on stderr.

    polar session run --harness pi --workdir DIR --instruction "…" --upstream http://127.0.0.1:8000 \\
        [--plan plan.json] [--out DIR] [--model NAME] [--builder prefix_merging] [--timeout-s 1800]

The lead registers this module (`nemo_polar.runtime.cli`) in `nemo_polar/cli.py`'s `_SUBSYSTEMS`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from nemo_polar.harness_adapters import BUILTIN
from nemo_polar.keywords import same_named
from nemo_polar.rollout.stack import OPTION_GROUPS, add_stack_flags, config_from_args
from nemo_polar.rundir import RunDir

# the proxy's stack options `run_session` takes as `proxy_options` (every one but the two it is handed by name)
PROXY_PASSTHROUGH = tuple(opt for opt in OPTION_GROUPS["proxy"] if opt not in ("upstreams", "served_model"))


def _cmd_run(args: argparse.Namespace) -> int:
    from nemo_polar.runtime.session import run_session

    plan = json.loads(Path(args.plan).read_text()) if args.plan else None
    out = Path(args.out) if args.out else Path("runs") / f"session-{args.harness}"
    if out.exists() and any(out.iterdir()):
        print(f"--out {out} exists and is not empty", file=sys.stderr)
        return 2
    proxy_options = config_from_args(args, upstreams=[args.upstream], serve_rollout=False, gateways=0)
    out.mkdir(parents=True, exist_ok=True)
    run = asyncio.run(
        run_session(  # the other flags are named as run_session's parameters
            **same_named(
                args,
                run_session,
                workdir=Path(args.workdir),
                out=out,
                plan=plan,
                served_model=proxy_options.served_model,
                proxy_options=same_named(proxy_options, PROXY_PASSTHROUGH),
            )
        )
    )
    print(json.dumps({"out": str(run.out), "exit_code": run.exit_code, "records": run.records,
                      "answered": run.answered, "failed_calls": run.failed_calls, "first_error": run.first_error,
                      "call_kinds": run.call_kinds, "chains": run.chains}))  # fmt: skip
    if run.failure is not None:
        print(f"polar session run: {run.failure} (see {RunDir(run.out).summary})", file=sys.stderr)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("session", help="run one harness session through an embedded proxy")
    sub = parser.add_subparsers(dest="session_command", metavar="ACTION", required=True)
    p = sub.add_parser("run", help="run a harness CLI on one instruction; write records and the trajectory")
    p.add_argument("--harness", required=True, help=f"one of {', '.join(BUILTIN)}, or a dotted path")
    p.add_argument("--workdir", required=True, help="the directory the CLI works in (bind-mounted read-write)")
    p.add_argument("--instruction", required=True)
    p.add_argument("--upstream", required=True, help="the inference server (vLLM), e.g. http://127.0.0.1:8000")
    p.add_argument("--plan", help="a plan JSON file (docs/contracts.md); harness-neutral steps are resolved per CLI")
    p.add_argument("--out", help="run directory (default runs/session-<harness>)")
    p.add_argument("--model", default="polar", help="the model name the CLI asks for (mapped to the served one)")
    p.add_argument("--builder", default="prefix_merging")
    p.add_argument("--provider-api", help="pi/opencode: which provider API the CLI speaks")
    p.add_argument("--command-line", help="--harness shell: the command to run ({instruction} is substituted)")
    p.add_argument("--timeout-s", type=float, default=1800.0)
    p.add_argument("--served-model", dest="served_model", default=None, help="the upstream's served model name")
    # the proxy's other stack options (prefix-preserving generation, sampling): the flags every stack CLI has
    add_stack_flags(p, ("proxy",), skip=("upstreams", "served_model"))
    p.set_defaults(func=_cmd_run)
