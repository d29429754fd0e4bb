# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/proxy_overhead.py`'s long-stream report: rounds are folded into medians, each round's ratio is kept
against the pass-through of the same round, and the verdict is on the medians (pure functions; no servers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import proxy_overhead as po


def _round(polar_cpu: float, pt_cpu: float, polar_rps: float, pt_rps: float) -> list[dict[str, object]]:
    rows = []
    for c in (1, 64):
        for path, cpu, rps in (
            ("direct", None, 1000.0),
            ("passthrough", pt_cpu, pt_rps),
            ("polar", polar_cpu, polar_rps),
        ):
            rows.append(
                {
                    "upstream": "mix/1",
                    "path": path,
                    "concurrency": c,
                    "n": 10,
                    "p50_ms": 1.0,
                    "p99_ms": 2.0,
                    "rps": rps,
                    "cpu_ms_per_req": cpu,
                    "added_p50_ms": 0.0,
                    "added_p99_ms": 0.0,
                    "throughput_ratio": rps / 1000.0,
                }
            )
    return rows


def test_rounds_become_medians_with_each_rounds_own_ratio() -> None:
    rows = po.median_rows([_round(1.0, 0.5, 300, 900), _round(3.0, 0.5, 100, 1000), _round(1.2, 0.4, 400, 800)])
    pol = next(r for r in rows if r["path"] == "polar" and r["concurrency"] == 64)
    pt = next(r for r in rows if r["path"] == "passthrough" and r["concurrency"] == 64)
    assert (pol["cpu_ms_per_req"], pt["cpu_ms_per_req"], pol["rps"], pt["rps"]) == (1.2, 0.5, 300, 900)
    assert pol["rounds"] == 3
    assert pol["cpu_ratios"] == pytest.approx([2.0, 6.0, 3.0]) and pol["rps_ratios"] == pytest.approx(
        [1 / 3, 0.1, 0.5]
    )
    assert next(r for r in rows if r["path"] == "direct")["cpu_ms_per_req"] is None  # no CPU figure stays none

    for r in rows:
        r["interval"], r["requests"] = 1, "whole mix"
    verdict = po.mix_verdict(rows)
    assert "**2.40×** (rounds: 2.00, 6.00, 3.00) (≤ 2×: NOT met)" in verdict  # the median rows' ratio, not a round's
    assert "throughput 300 vs 900 req/s = **0.33×** (rounds: 0.33, 0.10, 0.50)" in verdict


def test_one_round_prints_no_spread() -> None:
    rows = po.median_rows([_round(0.8, 0.5, 600, 900)])
    for r in rows:
        r["interval"], r["requests"] = 8, "whole mix"
    verdict = po.mix_verdict(rows)
    assert "= **1.60×** (≤ 2×: met)" in verdict and "rounds:" not in verdict
