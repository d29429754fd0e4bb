# SPDX-License-Identifier: Apache-2.0
"""The benchmark's experiment on a tiny config: every scenario × split × builder × arm × metric is filled, one
value per seed, and the table prints a row for each; plus the metric helpers on hand-made inputs."""

from __future__ import annotations

import math

import pytest
from nemo_polar.credit import CallCreditConfig

from polar_lab.credit_sim.fidelity import (
    ARMS,
    BUILDERS,
    METRICS,
    FidelityConfig,
    format_table,
    make_batch,
    run,
    spearman,
    summarize,
    vocabulary_check,
)
from polar_lab.credit_sim.records import ChatTokenizer
from polar_lab.credit_sim.render import HELD_IN, HELD_OUT


def test_spearman_by_hand() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties get average ranks: x ranks (0.5, 0.5, 2), y ranks (0, 1, 2) → ρ = 0.75 / (√0.5·√(2/3)·... ) by hand
    rx, ry = [0.5, 0.5, 2.0], [0.0, 1.0, 2.0]
    mx, my = sum(rx) / 3, sum(ry) / 3
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)) / 3
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx) / 3)
    sy = math.sqrt(sum((b - my) ** 2 for b in ry) / 3)
    assert spearman([5, 5, 9], [1, 2, 3]) == pytest.approx(cov / (sx * sy))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_summarize_t_interval() -> None:
    m, h, n = summarize([1.0, 2.0, 3.0, float("nan")])
    assert (m, n) == (2.0, 3)
    assert h == pytest.approx(4.303 * 1.0 / math.sqrt(3))


def test_table_shape_on_a_tiny_config(chat_tokenizer: ChatTokenizer) -> None:
    fc = FidelityConfig(
        scenarios=("confounded",), seeds=(0, 1), tasks_in=2, tasks_out=1, samples=4,
        adapt_steps=1, adapt_tasks=2, truth_calls=1, truth_runs=20,
    )  # fmt: skip
    out = run(fc, chat_tokenizer)
    res = out["results"]
    assert set(res) == {
        ("confounded", split, b, a) for split in ("held-in", "held-out") for b in BUILDERS for a in ARMS
    }
    for slot in res.values():
        assert set(slot) == set(METRICS)
        assert all(len(v) == 2 for v in slot.values())
        rho = [x for x in slot["rho"] if math.isfinite(x)]
        assert all(-1.0 <= x <= 1.0 for x in rho)
        for k in ("hack", "irr_pos"):
            assert all(0.0 <= x <= 1.0 for x in slot[k] if math.isfinite(x))
    for split in ("held-in", "held-out"):
        for arm in ARMS:  # both builders hand every call its own credit (spans), so they agree exactly
            a = res[("confounded", split, "per_request", arm)]["rho"]
            b = res[("confounded", split, "prefix_merging", arm)]["rho"]
            assert a == pytest.approx(b, nan_ok=True)
    assert len(out["extras"]["truth"]) == 2
    table = format_table(out)
    assert table.count("== confounded /") == 2
    rows = [ln for ln in table.splitlines() if ln.startswith(BUILDERS)]
    assert len(rows) == 2 * len(BUILDERS) * len(ARMS)
    assert "ω after 1 co-evolution steps" in table and "ground truth through the runner" in table
    assert len(out["extras"]["vocab"]["confounded"]) == 2  # one vocabulary check per seed's held-out batch
    assert "held-out sessions re-rendered in each held-in vocabulary (confounded," in table


def test_vocabulary_check_compares_the_same_sessions_in_every_held_in_vocabulary() -> None:
    cfg = CallCreditConfig()
    ref = make_batch("basic", 7, "held-out", (HELD_OUT,), 2, 3, None, builders=False)
    n_calls = sum(len(g.nodes) for g in ref.graphs)
    out = vocabulary_check("basic", 7, 2, 3, cfg)
    assert out["calls"] == n_calls * len(HELD_IN)
    assert 0 <= out["role_mismatch"] <= out["calls"]
    assert out["max_abs_credit_diff"] >= 0.0


def test_run_is_reproducible(chat_tokenizer: ChatTokenizer) -> None:
    fc = FidelityConfig(
        scenarios=("noisy",), seeds=(3,), tasks_in=2, tasks_out=0, samples=3,
        adapt_steps=1, adapt_tasks=1, truth_calls=0, truth_runs=0,
    )  # fmt: skip
    a, b = run(fc, chat_tokenizer)["results"], run(fc, chat_tokenizer)["results"]
    assert set(a) == set(b) and all(("noisy", "held-out", x, y) not in a for x in BUILDERS for y in ARMS)
    for key in a:
        for m in METRICS:
            assert a[key][m] == pytest.approx(b[key][m], nan_ok=True)
