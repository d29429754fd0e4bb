# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/proxy_flags.py`: an arm is `NAME=FLAGS`; the summary takes medians over rounds, each round's ratio
against the pass-through of that round, and against the baseline arm counts the rounds an arm used less CPU (pure
functions; no servers)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import proxy_flags as pf


def test_an_arm_is_a_name_and_its_flags_split_as_a_shell_would() -> None:
    assert pf.parse_arm("off=--store-direct-io off --sampling '{\"a\": 1}'") == (
        "off",
        ("--store-direct-io", "off", "--sampling", '{"a": 1}'),
    )
    assert pf.parse_arm("defaults=") == ("defaults", ())
    for bad in ("no-equals", "=--x", "passthrough=--x"):
        with pytest.raises(argparse.ArgumentTypeError):
            pf.parse_arm(bad)


def test_the_summary_is_medians_of_rounds_and_per_round_ratios() -> None:
    # (CPU ms a request, system ms, req/s) per arm and round; the pass-through's load moves from round to round
    rounds = [
        {"base": (0.40, 0.10, 2000.0), "passthrough": (0.20, 0.02, 5000.0), "new": (0.30, 0.05, 2500.0)},
        {"base": (0.80, 0.20, 1000.0), "passthrough": (0.40, 0.04, 2500.0), "new": (0.84, 0.10, 1100.0)},
        {"base": (0.44, 0.12, 1900.0), "passthrough": (0.20, 0.02, 5200.0), "new": (0.33, 0.06, 2400.0)},
    ]
    rows = {r["arm"]: r for r in pf.summary(rounds, "base")}
    assert list(rows) == ["base", "passthrough", "new"]
    assert rows["new"]["cpu_ms"] == 0.33 and rows["new"]["sys_ms"] == 0.06 and rows["new"]["rps"] == 2400.0
    assert rows["new"]["cpu_vs_pass"] == pytest.approx(1.65)  # 1.5, 2.1, 1.65: the median of each round's ratio
    assert rows["base"]["cpu_vs_pass"] == pytest.approx(2.0)
    assert rows["new"]["cpu_vs_base"] == pytest.approx(0.75)  # 0.75, 1.05, 0.75
    assert rows["new"]["lower_rounds"] == 2
    assert "cpu_vs_base" not in rows["base"] and "cpu_vs_base" not in rows["passthrough"]
    assert rows["passthrough"]["cpu_vs_pass"] == 1.0


def test_an_arm_s_code_is_a_directory_holding_the_package(tmp_path: Path) -> None:
    (tmp_path / "old" / "nemo_polar").mkdir(parents=True)
    assert pf.parse_code(f"old={tmp_path / 'old'}") == ("old", str(tmp_path / "old"))
    for bad in (f"old={tmp_path}", "old", f"={tmp_path / 'old'}"):
        with pytest.raises(argparse.ArgumentTypeError):
            pf.parse_code(bad)


def test_where_a_process_loaded_the_c_scanner_from() -> None:
    import os

    from nemo_polar.proxy.engines import vllm_stream

    if vllm_stream.SCANNER != "c":
        pytest.skip("the C scanner is not built here (no compiler at install)")
    assert pf.loaded_from(os.getpid()) == {str(Path(vllm_stream.__file__).resolve().parents[3])}


def test_an_older_checkout_without_session_deltas_runs_without_their_flag(tmp_path: Path) -> None:
    cli = tmp_path / "nemo_polar" / "proxy" / "cli.py"
    cli.parent.mkdir(parents=True)
    cli.write_text('p.add_argument("--strict-models", action="store_true")\n')
    assert not pf.has_deltas_flag(str(tmp_path))
    cli.write_text('p.add_argument("--no-session-deltas", action="store_true")\n')
    assert pf.has_deltas_flag(str(tmp_path))
    assert pf.has_deltas_flag(str(Path(__file__).resolve().parents[2]))  # this checkout's CLI has it


def test_the_reference_request_is_the_4_5_kb_one_and_the_mix_needs_a_sized_upstream() -> None:
    import json

    bodies, fake_args = pf.request_bodies("reference")
    assert fake_args == [] and len(bodies) == 1
    body = json.loads(bodies[0])
    assert 4000 < len(bodies[0]) < 5500 and body["max_tokens"] == 64 and not body.get("stream")
    bodies, fake_args = pf.request_bodies("mix")
    assert fake_args == ["--sized"] and len(bodies) == 4
    assert sorted(bool(json.loads(b).get("stream")) for b in bodies) == [False, False, True, True]
