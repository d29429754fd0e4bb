# SPDX-License-Identifier: Apache-2.0
"""A/B of `polar proxy` flags on the long-stream mix, side by side in one run (docs/performance.md).

Several proxies, each started with its own flags (`--arm NAME=FLAGS`, the first arm the baseline), and the plain
pass-through, all in front of one sized FAKE upstream (`polar_lab.fake_upstream --sized`); the mix of `peers.py`
(1k/8k-token prompts, 64/512-token answers, streaming and not) is sent to each in turn, the order rotated every
round, so a change of the machine's load falls on every arm. Per arm: the medians of CPU per request (and its
system part), throughput, each round's ratio to the pass-through, and against the baseline the median ratio and in
how many rounds the arm used less CPU. Every proxy runs the same code, so nothing but the flags differs (an A/B of
two checkouts needs two copies of the code and a neutral working directory: docs/performance.md, "A flaw in the
earlier A/B runs"). `--code NAME=DIR` makes arm NAME's proxy import the package from DIR instead (a checkout of
another commit, its C modules built or copied in): the proxies then start from an empty working directory, and the
run stops if an arm's proxy loaded its C scanner from anywhere else; a checkout older than session deltas (no
`--no-session-deltas` flag in its CLI, nothing to switch off) runs without that flag. `--request reference` sends
docs/performance.md's 4.5 KB request (64 tokens, not streamed) to an instant FAKE upstream instead of the mix: with
`--code` and `--c 1`, the proxy at another commit against this one on the request the issue's "no worse" is about.

    .venv/bin/python benchmarks/proxy_flags.py --arm off="--store-direct-io off" --arm auto="" [--c 64]
        [--rounds 12] [--n 4000] [--tokens-per-chunk 1]
    git worktree add /tmp/old HEAD~1 && cp nemo_polar/*.so /tmp/old/nemo_polar/ && \
        cp nemo_polar/proxy/engines/*.so /tmp/old/nemo_polar/proxy/engines/
    .venv/bin/python benchmarks/proxy_flags.py --arm old= --code old=/tmp/old --arm new=
    .venv/bin/python benchmarks/proxy_flags.py --request reference --c 1 --arm old= --code old=/tmp/old --arm new=
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from typing import Any

import _path  # the repository root (for polar_lab; `_path.REPO`)
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


def parse_code(text: str) -> tuple[str, str]:
    """`NAME=DIR`: arm NAME's proxy imports the package from DIR (a directory holding `nemo_polar/`)."""
    name, sep, where = text.partition("=")
    if not sep or not name or not os.path.isdir(os.path.join(where, "nemo_polar")):
        raise argparse.ArgumentTypeError(f"expected NAME=DIR with DIR holding nemo_polar/, not {text!r}")
    return name, os.path.abspath(where)


def has_deltas_flag(where: str) -> bool:
    """Whether the proxy CLI of the checkout at `where` takes `--no-session-deltas` (older ones store no deltas)."""
    with open(os.path.join(where, "nemo_polar", "proxy", "cli.py")) as f:
        return "--no-session-deltas" in f.read()


def request_bodies(kind: str) -> tuple[list[bytes], list[str]]:
    """The bodies sent to every arm, and the FAKE upstream's arguments they need: the long-stream mix (`peers.py`,
    a sized upstream) or docs/performance.md's 4.5 KB reference request (64 tokens, not streamed)."""
    if kind == "reference":
        return [json.dumps(po.request_body("fake-model", 64)).encode()], []
    return [json.dumps(b).encode() for b in mix_bodies("fake-model", MIX_FAKE)], ["--sized"]


def loaded_from(pid: int) -> set[str]:
    """Where a process loaded the package's C scanner from (its directories; empty: not loaded)."""
    marker = os.path.join("nemo_polar", "proxy", "engines", "_sse_scan")
    with open(f"/proc/{pid}/maps") as f:
        paths = {line.split()[-1] for line in f if marker in line}
    return {p[: p.index(marker)].rstrip("/") for p in paths}


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
    ap.add_argument(
        "--request",
        choices=["mix", "reference"],
        default="mix",
        help="the long-stream mix, or the 4.5 KB reference request (default: %(default)s)",
    )
    ap.add_argument("--json", default=None, help="also write the rounds and the summary here")
    ap.add_argument(
        "--code",
        type=parse_code,
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="arm NAME's proxy imports the package from DIR (another checkout) instead of this repository",
    )
    args = ap.parse_args()
    names = [name for name, _ in args.arm]
    if len(set(names)) != len(names):
        ap.error(f"arm names must differ: {names}")
    codes = dict(args.code)
    if set(codes) - set(names):
        ap.error(f"--code names no arm: {sorted(set(codes) - set(names))}")
    if codes:  # `python -m` puts the working directory first on sys.path: start the proxies from an empty one
        neutral = tempfile.TemporaryDirectory(prefix="polar-ab-")  # removed when the run ends
        os.chdir(neutral.name)
    bodies, fake_args = request_bodies(args.request)
    port = free_port()
    cmd = [sys.executable, "-m", "polar_lab.fake_upstream", "--port", str(port), *fake_args]
    fake = subprocess.Popen(
        [*cmd, "--stream-interval", str(args.tokens_per_chunk)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    upstream = f"http://127.0.0.1:{port}"
    rounds: list[dict[str, tuple[float, float, float]]] = []
    try:
        po._wait(upstream + "/health")
        with contextlib.ExitStack() as stacks:
            targets: dict[str, tuple[str, dict[str, str], int | None]] = {}
            ours = os.environ.get("PYTHONPATH", "")
            for name, flags in args.arm:
                # another checkout's package for that arm's proxy alone: the pass-through stays on this one's
                env = {"PYTHONPATH": os.pathsep.join([codes[name], ours])} if name in codes else {}
                deltas = name not in codes or has_deltas_flag(codes[name])
                stack = stacks.enter_context(
                    po.Stack(upstream, "fake-model", proxy_args=flags, no_deltas_flag=deltas, proxy_env=env)
                )
                found = {path: (url, headers, pid) for path, url, headers, pid in stack.targets()}
                targets[name] = found["polar"]
                targets.setdefault(PASS, found[PASS])
                where = loaded_from(stack.polar.pid)
                print(f"arm {name}: proxy's C scanner from {sorted(where) or 'nowhere (not built)'}")
                if where and where != {codes.get(name, str(_path.REPO))}:
                    raise SystemExit(f"arm {name}'s proxy runs other code than asked for: {sorted(where)}")
                if not deltas:
                    print(f"arm {name}: its proxy has no session deltas (run without --no-session-deltas)")
            order = list(targets)
            what = "mix" if args.request == "mix" else "4.5 KB reference request"
            print(
                f"{what} at c={args.c}, {args.n} requests per arm and round, {args.tokens_per_chunk} token(s) a chunk"
            )
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
