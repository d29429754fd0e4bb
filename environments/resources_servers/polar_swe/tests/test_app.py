# SPDX-License-Identifier: Apache-2.0
"""polar_swe's own tests, run by Gym: `gym env test --resources-server polar_swe` (in the Gym venv).

The verifier fixture (`verifier_cases.jsonl`: a real fix → 1.0, an empty patch and a wrong patch that also edits
the test → 0.0, two malformed requests) goes through Gym's fixture runner `exercise_verifier_fixture`; each case
runs `swe_tests` for real on a fresh bubblewrap sandbox of the example repo.
"""

import asyncio
import faulthandler
import sys
from pathlib import Path
from unittest.mock import MagicMock

import pytest
from nemo_gym.server_utils import ServerClient
from nemo_gym.verifier_fixture import exercise_verifier_fixture

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app import (
    VERIFIER_FIXTURE,
    PolarSweResourcesServer,
    PolarSweResourcesServerConfig,
    enable_crash_stacks,
)


def test_verifier_fixture() -> None:
    results = asyncio.run(
        exercise_verifier_fixture(
            VERIFIER_FIXTURE, reward_range=(0.0, 1.0), higher_is_better=True, determinism="unknown"
        )
    )
    assert sorted(r.kind for r in results) == ["full_reward", "malformed", "malformed", "zero_reward", "zero_reward"]


def test_server_builds_its_app(tmp_path: Path) -> None:
    config = PolarSweResourcesServerConfig(
        host="127.0.0.1", port=0, entrypoint="", name="polar_swe", work_dir=str(tmp_path)
    )
    server = PolarSweResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))
    paths = {getattr(r, "path", None) for r in server.setup_webserver().routes}
    assert {"/seed_session", "/verify", "/close_session", "/polar/status", "/polar/sessions/{session_id}"} <= paths
    assert {"/polar/admin/pause", "/polar/admin/resume", "/polar/admin/policy_version", "/polar/admin/status"} <= paths
    assert server.runtimes_dir() == tmp_path / "verify"
    assert not server.stack.started  # no upstream configured: the stack waits for the agent's first seed


def test_the_serving_process_prints_stacks_on_a_fatal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    faulthandler.disable()  # pytest turns it on for itself
    monkeypatch.setattr(sys, "stderr", sys.__stderr__)
    assert enable_crash_stacks() and faulthandler.is_enabled()
    faulthandler.disable()
    monkeypatch.setattr(sys, "stderr", object())  # no file descriptor: refused, nothing raised
    assert not enable_crash_stacks() and not faulthandler.is_enabled()
    monkeypatch.setattr(sys, "stderr", sys.__stderr__)
    faulthandler.enable()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
