# SPDX-License-Identifier: Apache-2.0
"""The replay subset's acceptance check (`benchmarks/_replay_truth.decisive_first`) on hand-made rows."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _replay_truth


def _row(ex: str, session: str, call: int, rules: float, delta: float) -> dict:
    return {"example": ex, "session": session, "call": call, "rules": rules, "delta": delta}


def test_decisive_first() -> None:
    rows = [
        _row("median", "fix", 0, 0.59, 0),  # the read before the fix
        _row("median", "fix", 1, 3.09, 1),  # the fix
        _row("median", "fix", 2, 0.33, 0),
        _row("median", "noop", 0, -1.0, 0),
        _row("roman", "fix", 0, 1.41, 0),  # a read credited above the fix
        _row("roman", "fix", 1, 1.20, 1),
        _row("quiet", "fix", 0, 0.5, 0),  # no decisive call: not judged
    ]
    assert _replay_truth.decisive_first(rows) == {"median": True, "roman": False}
    # a tie with the fix is not "highest"
    assert _replay_truth.decisive_first([_row("x", "fix", 0, 1.0, 0), _row("x", "fix", 1, 1.0, 1)]) == {"x": False}
