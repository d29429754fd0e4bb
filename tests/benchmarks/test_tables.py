# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/_tables.py --only`: one benchmark re-run alone replaces its own section of RESULTS.md and keeps the rest."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _tables

RESULTS = """# Benchmark results

Written by `make bench` on 2026-11-30.

## `a.py` (1 s)

old a

## `c.py --quick` (3 s)

old c
"""


def test_only_replaces_the_section_of_the_same_script_and_arguments() -> None:
    merged = _tables.merge(RESULTS, ["## `c.py --quick` (4 s)\n\nnew c\n", "## `b.py` (2 s)\n\nnew b\n"])
    assert merged.startswith("# Benchmark results\n\nWritten by `make bench` on 2026-11-30.\n\n## `a.py`")
    assert "old c" not in merged and "old a" in merged
    assert merged.index("`a.py`") < merged.index("`b.py`") < merged.index("`c.py --quick`")
    # the same script with other arguments is another section
    again = _tables.merge(merged, ["## `c.py` (9 s)\n\nfull c\n"])
    assert "new c" in again and "full c" in again and again.count("## `") == 4
    assert _tables.merge(RESULTS, []) == RESULTS
