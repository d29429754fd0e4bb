# SPDX-License-Identifier: Apache-2.0
"""The suite-wide conftest names only fixture plugins that exist (a stale name is a silent no-op otherwise)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

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
