# SPDX-License-Identifier: Apache-2.0
"""The suite-wide conftest names only fixture plugins that exist (a stale name is a silent no-op otherwise); the
NeMo RL folder's conftest starts its env session early only when asked to."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

CONFTEST = Path(__file__).with_name("conftest.py")


def test_every_plugin_module_named_in_conftest_exists() -> None:
    tree = ast.parse(CONFTEST.read_text())
    named = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("tests.")
    ]
    assert named, "conftest.py names no fixture plugin"
    missing = [name for name in named if importlib.util.find_spec(name) is None]
    assert not missing, f"conftest.py names fixture plugins that do not exist: {missing}"


def test_the_nemo_rl_session_starts_early_only_when_its_bridge_test_is_selected(monkeypatch: Any) -> None:
    """tests/nemo_rl/conftest.py starts the NeMo RL env's session when collection ends (env_session.py): only when
    the bridge test is among the selected items, never under --collect-only, never inside that env itself."""
    from tests.nemo_rl import conftest as nrl
    from tests.nemo_rl import env_session

    started: list[bool] = []
    monkeypatch.setattr(env_session.SESSION, "start", lambda: started.append(True))
    monkeypatch.setattr(nrl, "IN_NEMO_RL_ENV", False)

    def session(nodeids: list[str], collect_only: bool = False) -> Any:
        items = [SimpleNamespace(nodeid=n) for n in nodeids]
        return SimpleNamespace(items=items, config=SimpleNamespace(option=SimpleNamespace(collectonly=collect_only)))

    bridge = f"tests/nemo_rl/{env_session.BRIDGE_TEST}"
    nrl.pytest_collection_finish(session(["tests/test_types.py::test_x"]))
    assert started == []
    nrl.pytest_collection_finish(session([bridge], collect_only=True))
    assert started == []
    nrl.pytest_collection_finish(session(["tests/test_types.py::test_x", bridge]))
    assert started == [True]
    monkeypatch.setattr(nrl, "IN_NEMO_RL_ENV", True)
    nrl.pytest_collection_finish(session([bridge]))
    assert started == [True]
