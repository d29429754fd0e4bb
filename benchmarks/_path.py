# SPDX-License-Identifier: Apache-2.0
"""Makes the repository root importable for a benchmark run as `python benchmarks/x.py` (and for its children).

`polar_lab` (fakes and experiments, not in the wheel) lives at the repository root; a benchmark imports this module
first (`import _path`), which puts the root on `sys.path` and on `PYTHONPATH`, so `python -m polar_lab.fake_upstream`
started by the benchmark finds it too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
_parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(REPO) not in _parts:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *_parts])
