# SPDX-License-Identifier: Apache-2.0
"""Co-evolution of ω (estimates, rules, save/restore) and the metrics (reward hacking, distributions, weaknesses)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nemo_polar.credit import (
    CoevolutionState,
    assign,
    broadcast_factors,
    estimate_role_effects,
    reward_hacking,
    role_distributions,
    update_omega,
    weakness_report,
)
from nemo_polar.credit import coevolution as coevo
from nemo_polar.credit.config import CallCreditConfig, CoevolutionConfig, MetricsConfig, PropagationConfig
from nemo_polar.credit.metrics import is_hacked

from .sessions import synthetic_graph


def test_literal_rule_raises_omega_ig_when_ae_effect_falls() -> None:
    st = CoevolutionState.initial()
    cfg = CoevolutionConfig(eta=0.1, threshold=0.01, ema=0.0)
    st = update_omega(st, {"AE": 0.8, "IG": 0.2, "RV": 0.1}, cfg)
    assert st.omega == CoevolutionState.initial().omega  # first step: no drift yet
    st2 = update_omega(st, {"AE": 0.5, "IG": 0.2, "RV": 0.3}, cfg)
    assert st2.omega["IG"] == pytest.approx(0.6 * 1.1)
    assert st2.omega["RV"] == pytest.approx(0.3 * 1.1)
    assert st2.omega["AE"] == 1.0 and st2.step == 2
    assert len(st2.history) == 2 and st2.history[-1]["moves"]
    # small drifts are ignored; the reverse moves only in `symmetric`
    st3 = update_omega(st2, {"AE": 0.9, "RV": 0.1}, cfg)
    assert st3.omega == st2.omega
    st4 = update_omega(st2, {"AE": 0.9, "RV": 0.1}, cfg.model_copy(update={"rule": "symmetric"}))
    assert st4.omega["IG"] == pytest.approx(st2.omega["IG"] * 0.9)
    assert st4.omega["RV"] == pytest.approx(st2.omega["RV"] * 0.9)


def test_clamps_and_order() -> None:
    st = CoevolutionState(omega={"AE": 1.0, "IG": 1.9, "RV": 0.3, "OTHER": 0.1}, effects={"AE": 1.0, "RV": 0.0})
    cfg = CoevolutionConfig(eta=0.5, threshold=0.0, ema=0.0, omega_max=2.0, keep_order=True)
    out = update_omega(st, {"AE": 0.0, "RV": 0.0}, cfg)
    assert out.omega["IG"] == 1.0  # 1.9·1.5 capped at 2.0, then kept ≤ ω(AE)


def test_proportional_rule() -> None:
    st = CoevolutionState(omega={"AE": 1.0, "IG": 0.6, "RV": 0.3, "OTHER": 0.1})
    out = update_omega(st, {"AE": 0.5, "IG": 0.5, "RV": 0.0}, CoevolutionConfig(rule="proportional", eta=0.5, ema=0.0))
    assert out.omega["IG"] == pytest.approx(0.5 * 0.6 + 0.5 * 1.0)
    assert out.omega["RV"] == pytest.approx(max(0.5 * 0.3, 0.01))


def test_state_saved_and_restored(tmp_path: Path) -> None:
    st = CoevolutionState.initial()
    cfg = CoevolutionConfig(ema=0.0)
    for eff in ({"AE": 0.9, "RV": 0.1}, {"AE": 0.5, "RV": 0.4}):
        st = update_omega(st, eff, cfg)
    path = tmp_path / "coevo.json"
    st.save(path)
    back = CoevolutionState.load(path)
    assert back == st
    # a restored state continues exactly like the original
    assert update_omega(back, {"AE": 0.2, "RV": 0.6}, cfg) == update_omega(st, {"AE": 0.2, "RV": 0.6}, cfg)
    # the restored ω is what assign() uses
    g = synthetic_graph(["IG", "AE"], [(0, 1)])
    a1 = assign([g, g], [1.0, 0.0], omega=back.omega)[0]
    a2 = assign([g, g], [1.0, 0.0], omega=st.omega)[0]
    assert torch.equal(a1.credit, a2.credit)
    path.write_text('{"version": 99}')
    with pytest.raises(ValueError):
        CoevolutionState.load(path)


def test_observational_estimate_within_groups() -> None:
    # in each group, trajectories whose AE call is connected succeed; IG makes no difference
    win = synthetic_graph(["IG", "AE", "RV"], [(0, 1), (1, 2)])
    lose = synthetic_graph(["IG", "AE", "RV"], [(0, 2)])
    eff = estimate_role_effects([win, lose, win, lose], [1.0, 0.0, 1.0, 0.0], group_ids=["a", "a", "b", "b"])
    assert eff["AE"] == pytest.approx(1.0)
    assert eff["IG"] is None  # IG is connected in every trajectory: no variation, no estimate
    assert eff["OTHER"] is None


def test_step_prefers_counterfactuals_in_auto() -> None:
    from nemo_polar.credit.counterfactual import CounterfactualOutcome, Measurement

    g = synthetic_graph(["IG", "AE"], [(0, 1)])
    m = Measurement(0, "g", 1, "g-r1", "AE", 1.0, CounterfactualOutcome(reward=0.75), "plan")
    st = coevo.step(CoevolutionState.initial(), [g, g], [1.0, 0.0], CallCreditConfig(), measurements=[m])
    assert st.effects["AE"] == pytest.approx(0.25)


def test_reward_hacking_rate_definition() -> None:
    # many unused reads and one edit: IG calls get less credit per call than the edit
    roles = ["IG"] * 6 + ["AE", "RV"]
    g = synthetic_graph(roles, [(0, 6), (6, 7)])
    a = assign([g, g], [1.0, 0.0])
    rep = reward_hacking([g, g], [1.0, 0.0], [x.factor for x in a])
    assert rep["n_successful"] == 1 and rep["rate"] == 0.0
    # compared per call, broadcast credit (equal for every call) is never hacked; summed over the unequal counts
    # of reads and edits (the old definition) the six reads outweigh the one edit
    rep_b = reward_hacking([g, g], [1.0, 0.0], [broadcast_factors(g)] * 2)
    assert rep_b["rate"] == 0.0
    summed = MetricsConfig(hacking_aggregate="sum")
    rep_s = reward_hacking([g, g], [1.0, 0.0], [broadcast_factors(g)] * 2, summed)
    assert rep_s["rate"] == 1.0 and rep_s["sessions"] == ["g"]
    assert rep_s["per_harness"]["claude_code"]["n_hacked"] == 1
    # one read that three edits used: the literal out-degree share credits the read above every edit (hacked);
    # the direct structure credits the edits and the read through them (not hacked)
    h = synthetic_graph(["IG", "AE", "AE", "AE"], [(0, 1), (0, 2), (0, 3)])
    literal = CallCreditConfig(propagation=PropagationConfig(structure="outdegree", leaf_mode="literal"))
    f_lit = assign([h, h], [1.0, 0.0], literal)[0].factor
    assert float(f_lit[0]) > float(f_lit[1:].max())
    assert reward_hacking([h], [1.0], [f_lit])["rate"] == 1.0
    f_dir = assign([h, h], [1.0, 0.0])[0].factor
    assert float(f_dir[0]) < float(f_dir[1:].min())
    assert reward_hacking([h], [1.0], [f_dir])["rate"] == 0.0
    # "significantly" is an option
    f = torch.tensor([1.2, 1.0])
    assert not is_hacked(["IG", "AE"], f, MetricsConfig(hacking_margin=0.25))
    assert is_hacked(["IG", "AE"], f, MetricsConfig(hacking_margin=0.1))
    z = MetricsConfig(hacking_test="zscore")
    assert is_hacked(["IG", "IG", "IG", "AE", "AE"], torch.tensor([5.0, 5.1, 4.9, 1.0, 1.1]), z)
    assert not is_hacked(["IG", "IG", "AE", "AE"], torch.tensor([1.0, 3.0, 2.0, 1.9]), z)


def test_role_distributions_per_harness() -> None:
    g1 = synthetic_graph(["IG", "AE", "RV"], [(0, 1), (1, 2)], session_id="a", harness="codex")
    g2 = synthetic_graph(["IG", "AE"], [(0, 1)], session_id="b", harness="pi")
    a = assign([g1, g2], [1.0, 0.0])
    d = role_distributions([g1, g2], a)
    assert set(d) == {"codex", "pi"}
    assert set(d["codex"]) == {"IG", "AE", "RV"} and d["codex"]["AE"]["n"] == 1.0
    assert sum(r["mass_share"] for r in d["codex"].values()) == pytest.approx(1.0)
    assert d["codex"]["AE"]["mean"] == pytest.approx(float(a[0].credit[1]))


def test_weakness_report() -> None:
    g = synthetic_graph(
        ["IG", "IG", "AE", "AE", "RV", "RV"],
        [(0, 2), (2, 4)],
        outcomes=[None, None, None, None, "passed", "failed"],
    )
    w = weakness_report([g])["claude_code"]
    assert w["unused_reads"]["count"] == 1 and w["unused_reads"]["examples"][0]["call_index"] == 1
    assert w["unverified_edits"]["count"] == 1 and w["unverified_edits"]["examples"][0]["call_index"] == 3
    assert w["uncorrected_failures"]["count"] == 1 and w["failed_verifications"] == 1
    assert w["unused_reads"]["rate"] == 0.5 and w["unverified_edits"]["rate"] == 0.5


def test_training_metrics_for_a_logger() -> None:
    from nemo_polar.credit import training_metrics

    g = synthetic_graph(["IG", "AE", "RV"], [(0, 1), (1, 2)])
    out = assign([g, g], [1.0, 0.0])
    out[0].calibrated[1] = 1.0
    m = training_metrics([g, g], out)
    assert m["call_credit/hacking_rate"] == 0.0 and m["call_credit/successful"] == 1.0
    assert m["call_credit/calibrated_calls"] == 1.0 and m["call_credit/calibrated_mean_delta"] == 1.0
    shares = [m[f"call_credit/credit_share/{r}"] for r in ("IG", "AE", "RV", "OTHER")]
    assert abs(sum(shares) - 1.0) < 1e-9 and shares[1] == max(shares)
    assert m["call_credit/calls"] == 6.0
    empty = training_metrics([], [])
    assert empty["call_credit/hacking_rate"] != empty["call_credit/hacking_rate"]  # NaN: nothing successful
