# SPDX-License-Identifier: Apache-2.0
"""Â_τ as GRPO computes it and Â_v = Â_τ·ω·outdeg share·γ^(|τ|−pos): hand-computed cases and properties."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nemo_polar.credit import assign, group_advantages, propagate
from nemo_polar.credit.config import CallCreditConfig, PropagationConfig
from torch.testing import assert_close

from .sessions import synthetic_graph

# IG reads what AE edits, RV verifies it, a final OTHER reply: out-degrees [2, 1, 0, 0]
ROLES = ["IG", "AE", "RV", "OTHER"]
EDGES = [(0, 1), (0, 2), (1, 2)]


def test_literal_product_by_hand() -> None:
    g = synthetic_graph(ROLES, EDGES)
    cfg = PropagationConfig(gamma=0.9, leaf_mode="epsilon", epsilon=0.5, rescale="none")
    credit, parts = propagate(g, 2.0, cfg)
    # d = [2, 1, .5, .5] / 4; γ^(4-pos) = [.729, .81, .9, 1]; ω = [.6, 1, .3, .1]
    expected = torch.tensor(
        [2 * 0.6 * 0.5 * 0.729, 2 * 1.0 * 0.25 * 0.81, 2 * 0.3 * 0.125 * 0.9, 2 * 0.1 * 0.125 * 1.0],
        dtype=torch.float64,
    )
    assert_close(credit, expected)
    assert_close(parts["share"], torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64))
    assert_close(parts["discount"], torch.tensor([0.729, 0.81, 0.9, 1.0], dtype=torch.float64))


def test_literal_leaves_get_nothing() -> None:
    g = synthetic_graph(ROLES, EDGES)
    credit, _ = propagate(g, 1.0, PropagationConfig(gamma=1.0, leaf_mode="literal", rescale="none"))
    assert_close(credit, torch.tensor([0.6 * 2 / 3, 1.0 / 3, 0.0, 0.0], dtype=torch.float64))
    # no edges at all: the share is uniform
    flat, _ = propagate(
        synthetic_graph(ROLES, []), 1.0, PropagationConfig(gamma=1.0, leaf_mode="literal", rescale="none")
    )
    assert_close(flat, torch.tensor([0.6, 1.0, 0.3, 0.1], dtype=torch.float64) / 4)


def test_rescale_modes_by_hand() -> None:
    g = synthetic_graph(ROLES, EDGES, n_tokens=[10, 30, 20, 40])
    f = [0.6 * 0.5 * 0.729, 1.0 * 0.25 * 0.81, 0.3 * 0.125 * 0.9, 0.1 * 0.125 * 1.0]
    base = PropagationConfig(gamma=0.9, epsilon=0.5)
    mean, _ = propagate(g, 2.0, base.model_copy(update={"rescale": "mean"}))
    assert_close(mean, torch.tensor([2.0 * x * 4 / sum(f) for x in f], dtype=torch.float64))
    assert math.isclose(float(mean.mean()), 2.0)
    tok, _ = propagate(g, 2.0, base.model_copy(update={"rescale": "token_mean"}))
    w = [10, 30, 20, 40]
    s = sum(w) / sum(a * b for a, b in zip(w, f, strict=True))
    assert_close(tok, torch.tensor([2.0 * x * s for x in f], dtype=torch.float64))
    mx, _ = propagate(g, -2.0, base.model_copy(update={"rescale": "max"}))
    assert_close(mx, torch.tensor([-2.0 * x / max(f) for x in f], dtype=torch.float64))


def test_group_advantages_by_hand() -> None:
    r = [1.0, 0.0, 0.0, 1.0, 0.7, 0.5, 0.5]
    gid = ["a", "a", "a", "a", "solo", "same", "same"]
    loo = group_advantages(r, gid)
    # leave-one-out for r=1 in {1,0,0,1}: baseline 1/3, std sqrt(1/3 - 1/9) = sqrt(2/9)
    s = math.sqrt(2 / 9)
    assert_close(
        loo[:4], torch.tensor([(2 / 3) / (s + 1e-6), -(2 / 3) / (s + 1e-6)] * 2, dtype=torch.float64)[[0, 1, 1, 0]]
    )
    assert loo[4] == 0.0  # a group of one has nothing to compare against
    assert loo[5] == 0.0 and loo[6] == 0.0  # identical rewards
    mean = group_advantages(r[:4], gid[:4], baseline="mean")
    assert_close(mean, torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64) * (0.5 / (0.5 + 1e-6)))
    raw = group_advantages(r[:4], gid[:4], baseline="mean", normalize_std=False)
    assert_close(raw, torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64))


def test_assign_uses_groups_and_precomputed_advantages() -> None:
    gs = [synthetic_graph(ROLES, EDGES, session_id=f"s{i}") for i in range(4)]
    out = assign(gs, [1.0, 0.0, 1.0, 1.0], group_ids=["a", "a", "b", "b"])
    assert out[0].advantage > 0 > out[1].advantage
    assert out[2].advantage == 0 and torch.count_nonzero(out[2].credit) == 0
    pre = assign(gs, [1.0, 0.0, 1.0, 1.0], advantages=[0.5, -0.5, 0.0, 2.0])
    assert_close(pre[3].credit, 4 * pre[0].credit)


def test_rv_reward_is_added_only_when_weighted() -> None:
    g = synthetic_graph(["AE", "RV", "RV"], [(0, 1), (0, 2)], outcomes=[None, "failed", "passed"])
    plain = assign([g], [0.0], advantages=[0.0])[0]
    assert torch.count_nonzero(plain.credit) == 0
    assert plain.rv_reward.tolist() == [0.0, 0.0, 1.0]  # the failure was never identified (no AE after it)
    cfg = CallCreditConfig(propagation=PropagationConfig(rv_reward_weight=0.2))
    weighted = assign([g], [0.0], cfg, advantages=[0.0])[0]
    assert weighted.credit.tolist() == [0.0, 0.0, 0.2]


# --- properties --------------------------------------------------------------------------------------------------

_role = st.sampled_from(["IG", "AE", "RV", "OTHER"])


@st.composite
def graphs(draw: st.DrawFn) -> tuple[list[str], list[tuple[int, int]]]:
    n = draw(st.integers(1, 12))
    roles = draw(st.lists(_role, min_size=n, max_size=n))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs))) if pairs else []
    return roles, edges


_prop_cfg = st.builds(
    PropagationConfig,
    gamma=st.floats(0.05, 1.0),
    leaf_mode=st.sampled_from(["epsilon", "literal"]),
    epsilon=st.floats(0.0, 2.0),
    rescale=st.sampled_from(["none", "mean", "token_mean", "max"]),
)


@settings(max_examples=150, deadline=None)
@given(graphs(), _prop_cfg)
def test_zero_group_advantage_gives_zero_credit(
    g: tuple[list[str], list[tuple[int, int]]], cfg: PropagationConfig
) -> None:
    credit, _ = propagate(synthetic_graph(*g), 0.0, cfg)
    assert torch.count_nonzero(credit) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(graphs(), min_size=2, max_size=5), st.floats(-3, 3))
def test_identical_group_rewards_give_zero_credit(gs: list[tuple[list[str], list[tuple[int, int]]]], r: float) -> None:
    out = assign([synthetic_graph(*g, session_id=f"s{i}") for i, g in enumerate(gs)], [r] * len(gs))
    assert all(torch.count_nonzero(a.credit) == 0 for a in out)


@settings(max_examples=150, deadline=None)
@given(graphs(), _prop_cfg, st.floats(-5, 5).filter(lambda x: abs(x) > 1e-6))
def test_sign_of_the_trajectory_advantage_is_preserved(
    g: tuple[list[str], list[tuple[int, int]]], cfg: PropagationConfig, adv: float
) -> None:
    credit, parts = propagate(synthetic_graph(*g), adv, cfg)
    sign = math.copysign(1.0, adv)
    assert bool(((credit * sign) >= 0).all())
    positive = parts["omega"] * parts["share"] > 0
    assert bool(((credit * sign)[positive] > 0).all())
