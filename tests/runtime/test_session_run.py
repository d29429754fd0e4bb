# SPDX-License-Identifier: Apache-2.0
"""`polar session run` end to end with the real Pi CLI, the sandbox and the embedded proxy, in front of the proxy's
FAKE upstream (named as a fake: it stands in for vLLM here because this test checks the command's plumbing and
run-directory layout, not what a model produced; the harness e2e tests cover real vLLM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from pathlib import Path

import pytest
from nemo_polar.harness_adapters import get_adapter
from nemo_polar.harness_adapters.install import status

from nemo_polar.proxy.store import read_records
from nemo_polar.runtime import cli
from nemo_polar.runtime.sandbox import AGENT_WORKDIR, bwrap_available

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_session_run_writes_the_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed (make test installs Debian `bubblewrap`)")
    if not status(get_adapter("pi")).installed:
        pytest.fail("pi is not installed: run `polar harness install pi` (make test does)")
    from polar_lab.fake_upstream import FakeUpstream

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fake = FakeUpstream()
    asyncio.run_coroutine_threadsafe(fake.start(), loop).result(30)
    try:
        work, out = tmp_path / "work", tmp_path / "run"
        work.mkdir()
        plan = {
            "version": 1,
            "steps": [{"write": {"path": "a.txt", "content": "polar\n"}}, {"text": "Wrote a.txt."}],
            "side": "live",
        }
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        parser = argparse.ArgumentParser()
        cli.register(parser.add_subparsers())
        args = parser.parse_args(
            ["session", "run", "--harness", "pi", "--workdir", str(work), "--instruction", "write a.txt",
             "--upstream", fake.base_url, "--plan", str(tmp_path / "plan.json"), "--out", str(out),
             "--timeout-s", "240"]
        )  # fmt: skip
        assert args.func(args) == 0
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (work / "a.txt").read_text() == "polar\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["records"] == 2 == printed["records"]
    assert summary["call_kinds"] == {"main": 2}
    assert summary["connect_destinations"] and all(d.startswith("127.0.0.1:") for d in summary["connect_destinations"])
    assert (out / "records.sqlite").exists() and (out / "trajectories.jsonl").read_text().strip()
    # the CLI saw its workdir at the sandbox's fixed path: the recorded prompts name it, never the host directory
    stored = b"".join(r.to_json() for r in read_records(out, include_pending=True))
    assert AGENT_WORKDIR.encode() in stored and str(work).encode() not in stored
    sdir = out / "sessions" / summary["session_id"]
    assert (sdir / "harness.stdout").read_text() and (sdir / "connect.jsonl").read_text()
