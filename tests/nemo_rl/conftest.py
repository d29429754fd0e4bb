# SPDX-License-Identifier: Apache-2.0
"""Where the NeMo RL tests run: in the NeMo RL environment (`scripts/nemo_rl_venv.sh`), never skipped.

The real NeMo RL (vendored source, Python 3.11 with the pins of `scripts/nemo_rl_pins.txt`) lives in its own cached
venv, not in the project venv. So:
- in the project venv (no `nemo_rl` importable), this folder collects only `test_in_nemo_rl_env.py`, which builds or
  reuses that venv and runs the other modules of this folder there as one pytest session (plus NeMo RL's own unit
  tests with the plug-in installed), failing when they fail; that session starts when collection ends and runs
  alongside the tests before the bridge (`env_session.py`);
- in the NeMo RL venv, every module here runs against the real `nemo_rl`, and the bridge module is left out.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from . import env_session

BRIDGE = env_session.BRIDGE
IN_NEMO_RL_ENV = importlib.util.find_spec("nemo_rl") is not None


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    if collection_path.parent != Path(__file__).parent or not collection_path.name.startswith("test_"):
        return None
    if IN_NEMO_RL_ENV:
        return collection_path.name == BRIDGE or None
    return collection_path.name != BRIDGE or None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the NeMo RL env's session now when the bridge test is selected (`env_session.py`)."""
    if IN_NEMO_RL_ENV or session.config.option.collectonly:
        return
    if any(item.nodeid.endswith(env_session.BRIDGE_TEST) for item in session.items):
        env_session.SESSION.start()


_FINISHED: list[pytest.Session] = []  # the session, once finished (its exit status read at unconfigure)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    env_session.SESSION.close()
    _FINISHED.append(session)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The NeMo RL env's session (`env_session.QUICK_EXIT_ENV`) leaves here with pytest's exit status: its report is
    out, and the interpreter's teardown of Ray, torch and vLLM (which crashed it twice, env_session.py) is skipped."""
    if not (IN_NEMO_RL_ENV and os.environ.get(env_session.QUICK_EXIT_ENV) and _FINISHED):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(_FINISHED[-1].exitstatus))
