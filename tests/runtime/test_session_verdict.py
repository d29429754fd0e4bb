# SPDX-License-Identifier: Apache-2.0
"""`polar session run` fails when the harness never got a model answer, and its summary says why.

The harness is the `shell` adapter running a small real client (`CLIENT` below) that swallows HTTP errors and exits
0 — as Gemini CLI did when every call of a session failed. The upstream is the proxy's FAKE upstream (named as a
fake: it is told to fail every call the way vLLM answered non-finite logprobs, which cannot be provoked on demand).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_polar.runtime import cli
from nemo_polar.runtime.sandbox import AGENT_WORKDIR, bwrap_available
from polar_lab.fake_upstream import FakeUpstream

pytestmark = [pytest.mark.e2e]

# a client that makes `n` chat calls through the proxy, prints what it got, and exits 0 whatever happened
CLIENT = r"""
import json, os, sys, urllib.error, urllib.request
for _ in range(int(sys.argv[1])):
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["POLAR_MODEL"],
                         "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            print(resp.status, resp.read()[:200])
    except urllib.error.HTTPError as err:
        print("error", err.code, err.read()[:200])
"""

UPSTREAM_MESSAGE = "Out of range float values are not JSON compliant"


@pytest.fixture
def fake() -> Iterator[FakeUpstream]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    upstream = FakeUpstream()
    asyncio.run_coroutine_threadsafe(upstream.start(), loop).result(30)
    try:
        yield upstream
    finally:
        asyncio.run_coroutine_threadsafe(upstream.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _run(fake: FakeUpstream, tmp_path: Path, calls: int, *flags: str, prefix: str = "") -> tuple[int, dict, str]:
    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed (make test installs Debian `bubblewrap`)")
    work, out = tmp_path / "work", tmp_path / "run"
    work.mkdir()
    (work / "client.py").write_text(CLIENT)  # the sandbox shows the CLI only its workdir, at AGENT_WORKDIR
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(
        ["session", "run", "--harness", "shell", "--workdir", str(work), "--instruction", "say hi",
         "--upstream", fake.base_url, "--out", str(out), "--timeout-s", "120",
         "--command-line", f"{prefix}{sys.executable} {AGENT_WORKDIR}/client.py {calls}", *flags]
    )  # fmt: skip
    rc = args.func(args)
    return rc, json.loads((out / "summary.json").read_text()), out.as_posix()


def test_every_call_failed_exits_non_zero_and_says_why(
    fake: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.behaviour.fail_status = 400
    fake.behaviour.fail_message = UPSTREAM_MESSAGE
    rc, summary, _ = _run(fake, tmp_path, calls=2)
    err = capsys.readouterr().err
    assert summary["exit_code"] == 0  # the harness itself claimed success
    assert rc == 1
    assert summary["answered"] == 0 and summary["failed_calls"] == 2
    assert UPSTREAM_MESSAGE in json.dumps(summary["first_error"])
    assert "no model answer" in summary["failure"] and UPSTREAM_MESSAGE in summary["failure"]
    assert "no model answer" in err


def test_a_session_with_answers_exits_zero(fake: FakeUpstream, tmp_path: Path) -> None:
    rc, summary, _ = _run(fake, tmp_path, calls=1)
    assert rc == 0
    assert summary["answered"] == 1 and summary["failed_calls"] == 0
    assert summary["first_error"] is None and summary["failure"] is None


def test_the_proxys_limits_reach_the_harness_as_its_idle_limit(fake: FakeUpstream, tmp_path: Path) -> None:
    """`--read-timeout-s` and `--pause-wait-s` reach the session's proxy, and its CLI is told to wait longer than both
    together (`POLAR_IDLE_TIMEOUT_S`, as the CLIs' own settings: tests/harness/test_adapters.py)."""
    rc, _, out = _run(
        fake,
        tmp_path,
        1,
        "--read-timeout-s",
        "2400",
        "--pause-wait-s",
        "1200",
        prefix="echo idle=$POLAR_IDLE_TIMEOUT_S; ",
    )
    assert rc == 0
    logs = [p.read_text() for p in Path(out).rglob("harness.stdout")]
    assert len(logs) == 1 and "idle=4200" in logs[0].split(), logs
