# SPDX-License-Identifier: Apache-2.0
"""Where the NeMo RL tests run: in the NeMo RL environment (`scripts/nemo_rl_venv.sh`), never skipped.

The real NeMo RL (vendored source, Python 3.11 with the pins of `scripts/nemo_rl_pins.txt`) lives in its own cached
venv, not in the project venv. So:
- in the project venv (no `nemo_rl` importable), this folder collects only `test_in_nemo_rl_env.py`, which builds or
  reuses that venv and runs the other modules of this folder there as one pytest session (plus NeMo RL's own unit
  tests with the plug-in installed), failing when they fail;
- in the NeMo RL venv, every module here runs against the real `nemo_rl`, and the bridge module is left out.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BRIDGE = "test_in_nemo_rl_env.py"
IN_NEMO_RL_ENV = importlib.util.find_spec("nemo_rl") is not None


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    if collection_path.parent != Path(__file__).parent or not collection_path.name.startswith("test_"):
        return None
    if IN_NEMO_RL_ENV:
        return collection_path.name == BRIDGE or None
    return collection_path.name != BRIDGE or None
