# SPDX-License-Identifier: Apache-2.0
"""A/B of `polar proxy` flags on the long-stream mix, side by side in one run (docs/performance.md).

Several proxies, each started with its own flags (`--arm NAME=FLAGS`, the first arm the baseline), and the plain
pass-through, all in front of one sized FAKE upstream (`polar_lab.fake_upstream --sized`); the mix of `peers.py`
(1k/8k-token prompts, 64/512-token answers, streaming and not) is sent to each in turn, the order rotated every
round, so a change of the machine's load falls on every arm. Per arm: the medians of CPU per request (and its
system part), throughput, each round's ratio to the pass-through, and against the baseline the median ratio and in
how many rounds the arm used less CPU. Every proxy runs the same code, so nothing but the flags differs (an A/B of
two checkouts needs two copies of the code and a neutral working directory: docs/performance.md, "A flaw in the
earlier A/B runs").

    .venv/bin/python benchmarks/proxy_flags.py --arm off="--store-direct-io off" --arm auto="" [--c 64]
        [--rounds 12] [--n 4000] [--tokens-per-chunk 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import statistics
import subprocess
import sys
from typing import Any

import _path  # noqa: F401  (the repository root, for polar_lab)
import proxy_overhead as po
from peers import MIX_FAKE, mix_bodies

from nemo_polar.backend.server import free_port

PASS = "passthrough"


def parse_arm(text: str) -> tuple[str, tuple[str, ...]]:
    """`NAME=FLAGS` (FLAGS split as a shell would; empty: the defaults) as (name, flags)."""
    name, sep, flags = text.partition("=")
    if not sep or not name or name == PASS:
        raise argparse.ArgumentTypeError(f"expected NAME=FLAGS with a name other than {PASS!r}, not {text!r}")
    return name, tuple(shlex.split(flags))


def summary(rounds: list[dict[str, tuple[float, float, float]]], baseline: str) -> list[dict[str, Any]]:
    """Per arm, from each round's (CPU ms a request, system ms, req/s): medians, the median of each round's ratio to
    the pass-through, and against `baseline` the median ratio and the rounds with less CPU."""
    out = []
    for name in rounds[0]:
        cpu = [r[name][0] for r in rounds]
        row: dict[str, Any] = {
            "arm": name,
            "cpu_ms": statistics.median(cpu),
            "sys_ms": statistics.median(r[name][1] for r in rounds),
            "rps": statistics.median(r[name][2] for r in rounds),
            "cpu_vs_pass": statistics.median(r[name][0] / r[PASS][0] for r in rounds),
            "rps_vs_pass": statistics.median(r[name][2] / r[PASS][2] for r in rounds),
        }
        if name not in (PASS, baseline):
            row["cpu_vs_base"] = statistics.median(r[name][0] / r[baseline][0] for r in rounds)
            row["lower_rounds"] = sum(r[name][0] < r[baseline][0] for r in rounds)
        out.append(row)
    return out


def _line(row: dict[str, Any], n_rounds: int, baseline: str) -> str:
    text = (
        f"{row['arm']:>14}: CPU {row['cpu_ms']:.3f} ms a request (system {row['sys_ms']:.3f}), {row['rps']:,.0f} req/s;"
        f" per round vs the pass-through: CPU {row['cpu_vs_pass']:.2f}x, throughput {row['rps_vs_pass']:.2f}x"
    )
    if "cpu_vs_base" in row:
        text += f"; vs {baseline}: CPU {row['cpu_vs_base']:.3f}x, lower in {row['lower_rounds']} of {n_rounds} rounds"
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", type=parse_arm, action="append", required=True, metavar="NAME=FLAGS")
    ap.add_argument("--c", type=int, default=64, help="concurrency (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--n", type=int, default=3000, help="requests per arm and round")
    ap.add_argument("--tokens-per-chunk", type=int, default=1, help="the FAKE upstream's stream interval")
    ap.add_argument("--json", default=None, help="also write the rounds and the summary here")
    args = ap.parse_args()
    names = [name for name, _ in args.arm]
    if len(set(names)) != len(names):
        ap.error(f"arm names must differ: {names}")
    bodies = [json.dumps(b).encode() for b in mix_bodies("fake-model", MIX_FAKE)]
    port = free_port()
    cmd = [sys.executable, "-m", "polar_lab.fake_upstream", "--port", str(port), "--sized"]
    fake = subprocess.Popen(
        [*cmd, "--stream-interval", str(args.tokens_per_chunk)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    upstream = f"http://127.0.0.1:{port}"
    rounds: list[dict[str, tuple[float, float, float]]] = []
    try:
        po._wait(upstream + "/health")
        with contextlib.ExitStack() as stacks:
            targets: dict[str, tuple[str, dict[str, str], int | None]] = {}
            for name, flags in args.arm:
                stack = stacks.enter_context(po.Stack(upstream, "fake-model", proxy_args=flags))
                found = {path: (url, headers, pid) for path, url, headers, pid in stack.targets()}
                targets[name] = found["polar"]
                targets.setdefault(PASS, found[PASS])
            order = list(targets)
            print(f"mix at c={args.c}, {args.n} requests per arm and round, {args.tokens_per_chunk} token(s) a chunk")
            for k in range(args.rounds):
                this: dict[str, tuple[float, float, float]] = {}
                for name in order[k % len(order) :] + order[: k % len(order)]:
                    url, headers, pid = targets[name]
                    _, wall, cpu, sys_s = asyncio.run(po._drive(url, headers, bodies, args.c, args.n, pid))
                    assert cpu is not None and sys_s is not None
                    this[name] = (1e3 * cpu / args.n, 1e3 * sys_s / args.n, args.n / wall)
                rounds.append({name: this[name] for name in order})
                cells = " | ".join(f"{n} {v[0]:.3f} ({v[1]:.3f}) {v[2]:,.0f}/s" for n, v in rounds[-1].items())
                print(f"round {k}: {cells}", flush=True)
    finally:
        fake.terminate()
        fake.wait(10)
    rows = summary(rounds, names[0])
    for row in rows:
        print(_line(row, len(rounds), names[0]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"arms": dict(args.arm), "rounds": rounds, "summary": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
