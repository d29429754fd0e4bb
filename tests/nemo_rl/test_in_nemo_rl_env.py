# SPDX-License-Identifier: Apache-2.0
"""The bridge from the project venv to the NeMo RL environment (see this folder's conftest.py).

Builds or reuses the NeMo RL venv (`scripts/nemo_rl_venv.sh`: the vendored NeMo RL and NeMo Gym 0.5.1, checksums
verified), then
- runs this folder's other test modules there, as one pytest session against the real `nemo_rl`
  (`env_session.py`: started in the background as soon as collection ends, so it runs alongside the tests before
  this one; the test waits for its result);
- runs NeMo RL's own unit tests (advantage estimators, GRPO helpers, losses, the Gym environment helpers, rollouts)
  with the CALL-CREDIT plug-in installed (`polar_lab/nemo_rl_unit_tests.py`).
Each test fails when its session fails, and prints the session's counts.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from .env_session import REPO, SESSION, clean_env, modules


@pytest.fixture(scope="module")
def nemo_rl_python() -> Path:
    SESSION.prepare()
    if SESSION.setup_error is not None:
        pytest.skip(SESSION.setup_error)
    assert SESSION.python is not None
    return SESSION.python


def _summary(output: str) -> str:
    lines = [line for line in output.splitlines() if re.search(r"\b\d+ (passed|failed)\b", line)]
    return lines[-1] if lines else "(no summary line)"


def _tracebacks(output: str, limit: int = 12000) -> str:
    """Each failure's traceback from the session's FAILURES section, without its captured output (which can be
    long enough to push the traceback out of any tail)."""
    kept: list[str] = []
    keep = False
    for line in output.splitlines():
        if re.match(r"_{3,} .* _{3,}$", line):  # a failure's header
            keep = True
        elif re.match(r"-{3,} Captured .* -{3,}$", line) or re.match(r"={3,} .* ={3,}$", line):
            keep = False
        if keep:
            kept.append(line)
    text = "\n".join(kept)
    return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2 :]


def test_nemo_rl_tests_pass_in_the_nemo_rl_env(nemo_rl_python: Path) -> None:
    assert modules(), "no NeMo RL test modules found"
    rc, output = SESSION.result()
    print(output[-6000:])
    assert rc is not None, f"NeMo RL env session killed after its time limit ({_summary(output)}):\n{output[-6000:]}"
    assert rc == 0, (
        f"NeMo RL env session failed ({_summary(output)}):\n{_tracebacks(output)}\n[tail]\n{output[-4000:]}"
    )
    assert re.search(r"\b[1-9]\d* passed\b", _summary(output)), output[-3000:]


def test_nemo_rl_own_unit_tests_pass_with_the_plugin_installed(nemo_rl_python: Path, tmp_path: Path) -> None:
    out = tmp_path / "counts.json"
    proc = subprocess.run(
        [str(nemo_rl_python), str(REPO / "polar_lab" / "nemo_rl_unit_tests.py"), "--json", str(out)],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = proc.stdout + proc.stderr
    print(output[-4000:])
    assert out.is_file(), f"the runner wrote no counts (rc={proc.returncode}):\n{output[-4000:]}"
    report = json.loads(out.read_text())
    counts = report["counts"]
    assert proc.returncode == 0 and counts["failed"] == 0 and counts["errors"] == 0, report["failed"]
    assert counts["passed"] > 0, counts
