# SPDX-License-Identifier: Apache-2.0
"""Huge pages for the serving processes (`proxy/tuning.py`, "Huge pages"): CPython's arenas cut from `MADV_HUGEPAGE`
chunks (`_hugemem.c`), the process executed again once with glibc's hugetlb tunable, and the serving commands doing
both before they import the server. Each case runs in an interpreter of its own: the settings are process-wide."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import pytest

from nemo_polar import cli
from nemo_polar.backend.server import free_port
from nemo_polar.proxy import tuning
from tests.procs import wait_until_serving

try:
    from nemo_polar import _hugemem  # noqa: F401  (built or not)

    BUILT = True
except ImportError:
    BUILT = False

pytestmark = [
    pytest.mark.skipif(
        not tuning.huge_pages_wanted(), reason="needs Linux with transparent huge pages in madvise or always mode"
    ),
    pytest.mark.skipif(not BUILT, reason="the optional C module nemo_polar._hugemem is not built (setup.py)"),
]


def mappings(pid: int) -> list[tuple[int, int, str, list[str]]]:
    """(start, end, path or "", VmFlags) of each mapping of process `pid`; `hg` in its flags: marked
    `MADV_HUGEPAGE`. Also run inside the test's subprocesses (its source is prepended to their scripts)."""
    out, cur = [], (0, 0, "")
    for line in open(f"/proc/{pid}/smaps"):
        head = line.split()
        if head[0] == "VmFlags:":
            out.append((*cur, head[1:]))
        elif "-" in head[0] and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            cur = (lo, hi, head[5] if len(head) > 5 else "")
    return out


def _script(body: str) -> str:
    return "import os\n" + inspect.getsource(mappings) + body


ARENAS = r"""
import gc, json
from nemo_polar import _hugemem
assert _hugemem.install() is True
objs = [{"i": i} for i in range(300_000)]  # ~70 MB of small dicts: pymalloc arenas
grown = _hugemem.stats()
start, flags = next((lo, f) for lo, hi, _, f in mappings(os.getpid()) if lo <= id(objs[-1]) < hi)
del objs
gc.collect()
freed = _hugemem.stats()
again = [{"i": i} for i in range(100_000)]
print(json.dumps({"grown": grown, "freed": freed, "again": _hugemem.stats(), "flags": flags, "start": start}))
"""


def test_arenas_are_cut_from_huge_page_chunks_and_freed_ones_are_reused() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _script(ARENAS)], capture_output=True, text=True, timeout=120, check=True
    )
    got = json.loads(out.stdout)
    grown, freed, again = got["grown"], got["freed"], got["again"]
    print(f"after growing: {grown}; after freeing: {freed}; after growing again: {again}")
    assert grown["installed"] is True and grown["chunks"] >= 2 and grown["carved"] >= 40
    assert "hg" in got["flags"] and got["start"] % (2 << 20) == 0  # a 2 MiB-aligned chunk marked MADV_HUGEPAGE
    assert freed["free"] > 0  # emptied arenas kept, not unmapped
    assert again["reused"] > 0 and again["carved"] == freed["carved"]  # handed out again before any new one


STARTS = r"""
import json, os, sys
print("start", os.getpid(), flush=True)
from nemo_polar.proxy.tuning import start_serving_process
start_serving_process()
from nemo_polar import _hugemem
buffers = [bytearray(200_000) for _ in range(50)]  # glibc's heap grows (marked MADV_HUGEPAGE under the tunable)
print(json.dumps({
    "pid": os.getpid(), "heap_hg": any("hg" in f for _, _, path, f in mappings(os.getpid()) if path == "[heap]"),
    "tunables": os.environ.get("GLIBC_TUNABLES"),
    "marker": [k for k in os.environ if k.startswith("_POLAR")], "arenas": _hugemem.stats()["installed"],
}))
"""


def _starts(env: dict[str, str]) -> tuple[list[str], dict[str, object]]:
    full = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", tuning.HUGE_PAGES_ENV)}
    out = subprocess.run(
        [sys.executable, "-c", _script(STARTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**full, **env},
    )
    lines = out.stdout.splitlines()
    return [x for x in lines if x.startswith("start ")], json.loads(lines[-1])


@pytest.mark.skipif(not tuning._glibc_takes_hugetlb(), reason="glibc's hugetlb tunable needs glibc 2.35 or later")
def test_a_serving_process_starts_again_once_with_the_tunable_and_its_children_do_not_inherit_it() -> None:
    starts, got = _starts({})
    print(starts, got)
    assert len(starts) == 2 and starts[0] == starts[1] == f"start {got['pid']}"  # executed again, same process
    # glibc took the tunable; the environment children inherit is as it was
    assert got["heap_hg"] is True and got["tunables"] is None and got["marker"] == []
    assert got["arenas"] is True
    starts, got = _starts({"GLIBC_TUNABLES": "glibc.malloc.perturb=0"})  # the caller's own tunables kept
    assert len(starts) == 2 and got["heap_hg"] is True and got["tunables"] == "glibc.malloc.perturb=0"
    starts, got = _starts({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})  # already there: no second start
    assert len(starts) == 1 and got["arenas"] is True and got["heap_hg"] is True
    starts, got = _starts({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})  # the caller's own choice kept
    assert len(starts) == 1 and got["heap_hg"] is False and got["tunables"] == "glibc.malloc.hugetlb=0"


def test_huge_pages_off_changes_nothing() -> None:
    starts, got = _starts({tuning.HUGE_PAGES_ENV: "off"})
    assert len(starts) == 1 and got["heap_hg"] is False and got["arenas"] is False


def test_the_polar_command_finds_its_serving_subcommands_without_parsing() -> None:
    assert cli._command(["-v", "proxy", "--port", "1"]) == "proxy"
    assert cli._command(["trajectory", "build"]) == "trajectory"
    assert cli._command(["--version"]) is None
    assert {"proxy", "serve", "serve-gateway", "serve-rollout", "collect", "demo"} <= cli.SERVING_COMMANDS
    sub = cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert cli.SERVING_COMMANDS <= set(sub)  # every name is a real subcommand


def test_polar_proxy_runs_on_huge_pages() -> None:
    """`python -m nemo_polar.proxy.cli`, as the benchmarks start it: glibc's heap and CPython's arenas in the
    serving process are marked `MADV_HUGEPAGE`."""
    port = free_port()
    with tempfile.TemporaryDirectory() as store:
        env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", tuning.HUGE_PAGES_ENV)}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nemo_polar.proxy.cli",
                "--upstream",
                "http://127.0.0.1:9",
                "--port",
                str(port),
                "--store",
                store,
            ],
            env={**env, "POLAR_CONTROL_TOKEN": "t"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_until_serving(f"http://127.0.0.1:{port}/", proc)
            status = urllib.request.Request(
                f"http://127.0.0.1:{port}/admin/status", headers={"Authorization": "Bearer t"}
            )
            with urllib.request.urlopen(status, timeout=10) as r:
                reported = json.loads(r.read())["huge_pages"]
            maps = mappings(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    assert reported == {"arenas": True, "heap": True}  # what `GET /admin/status` says
    assert any("hg" in flags for _, _, path, flags in maps if path == "[heap]")  # glibc's heap: the tunable taken
    # an anonymous 2 MiB-aligned mapping marked MADV_HUGEPAGE besides the heap: the arenas' chunks
    assert any(not path and lo % (2 << 20) == 0 and "hg" in flags for lo, _, path, flags in maps), (
        "no MADV_HUGEPAGE chunk for CPython's arenas"
    )
