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
    cfg = PropagationConfig(structure="outdegree", gamma=0.9, leaf_mode="epsilon", epsilon=0.5, rescale="none")
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
    credit, _ = propagate(
        g, 1.0, PropagationConfig(structure="outdegree", gamma=1.0, leaf_mode="literal", rescale="none")
    )
    assert_close(credit, torch.tensor([0.6 * 2 / 3, 1.0 / 3, 0.0, 0.0], dtype=torch.float64))
    # no edges at all: the share is uniform
    flat, _ = propagate(
        synthetic_graph(ROLES, []),
        1.0,
        PropagationConfig(structure="outdegree", gamma=1.0, leaf_mode="literal", rescale="none"),
    )
    assert_close(flat, torch.tensor([0.6, 1.0, 0.3, 0.1], dtype=torch.float64) / 4)


def test_rescale_modes_by_hand() -> None:
    g = synthetic_graph(ROLES, EDGES, n_tokens=[10, 30, 20, 40])
    f = [0.6 * 0.5 * 0.729, 1.0 * 0.25 * 0.81, 0.3 * 0.125 * 0.9, 0.1 * 0.125 * 1.0]
    base = PropagationConfig(structure="outdegree", gamma=0.9, epsilon=0.5)
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
    # leave-one-out for r=1 in {1,0,0,1}: baseline 1/3, Bessel-corrected std of {0,0,1}: sqrt((2/9)·3/2)
    s = math.sqrt(1 / 3)
    assert_close(
        loo[:4], torch.tensor([(2 / 3) / (s + 1e-6), -(2 / 3) / (s + 1e-6)] * 2, dtype=torch.float64)[[0, 1, 1, 0]]
    )
    assert loo[4] == 0.0  # a group of one has nothing to compare against
    assert loo[5] == 0.0 and loo[6] == 0.0  # identical rewards
    mean = group_advantages(r[:4], gid[:4], baseline="mean")
    sd = math.sqrt(0.25 * 4 / 3)  # Bessel-corrected std of {1, 0, 0, 1}
    assert_close(mean, torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64) * (0.5 / (sd + 1e-6)))
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


# a weight is 0 or at least 1e-3: a positive weight near float64's smallest (5e-324, which hypothesis draws) times
# the shares and a discount of up to 0.05^11 underflows to exactly 0, so "positive weight, nonzero credit" could not
# hold for it in any arithmetic; no configuration means such a weight
_weight = st.one_of(st.just(0.0), st.floats(1e-3, 1.0))

_prop_cfg = st.builds(
    PropagationConfig,
    structure=st.sampled_from(["direct", "outdegree"]),
    unverified_weight=_weight,
    source_weight=st.sampled_from(["kinds", "edge"]),
    gamma=st.floats(0.05, 1.0),
    leaf_mode=st.sampled_from(["epsilon", "literal"]),
    epsilon=st.one_of(st.just(0.0), st.floats(1e-3, 2.0)),
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


# --- the direct structure (docs/call_credit.md, propagation) -----------------------------------------------------


def _direct(**kw: object) -> PropagationConfig:
    return PropagationConfig(structure="direct", gamma=1.0, rescale="none", **kw)  # type: ignore[arg-type]


def test_direct_by_hand() -> None:
    # the edit survives and a verification covers it: Y gives it ω(AE) = 1, split among the edit (1), its read
    # (0.6 · 1/3: one evidence kind of three) and its verification (0.3 · 1/3); the final reply gets nothing
    g = synthetic_graph(ROLES, EDGES)
    credit, parts = propagate(g, 2.0, _direct())
    total = 1.0 + 0.2 + 0.1
    assert_close(parts["share"], torch.tensor([0.2, 1.0, 0.1, 0.0], dtype=torch.float64) / total)
    assert_close(credit, 2.0 * parts["share"])
    # ω weighs the splits (it is not applied a second time)
    edge, _ = propagate(g, 2.0, _direct(source_weight="edge"))
    assert_close(edge, 2.0 * torch.tensor([0.6, 1.0, 0.3, 0.0], dtype=torch.float64) / 1.9)


def test_read_then_edit_credits_the_edit() -> None:
    # the two-call row: a read, then the edit that used it, reward 1
    g = synthetic_graph(["IG", "AE"], [(0, 1)])
    direct, _ = propagate(g, 1.0, PropagationConfig())
    assert float(direct[1]) > float(direct[0]) > 0
    literal, _ = propagate(g, 1.0, PropagationConfig(structure="outdegree", leaf_mode="epsilon"))
    assert float(literal[0]) > float(literal[1])  # the seed formula credits the read (out-degree 1) over the leaf


def _edit(g: object, k: int, path: str, *, revert: bool = False) -> None:
    node = g.nodes[k]  # type: ignore[attr-defined]
    node.paths_written = [path]
    if revert:
        node.evidence = ["tool:Bash→SHELL", "shell:git checkout→AE"]


def test_an_undone_edit_gets_nothing_and_the_revert_earns_through_the_fix() -> None:
    # read R, wrong edit, failing test, revert, the fix, passing test
    roles = ["IG", "AE", "RV", "AE", "AE", "RV"]
    edges = [(0, 1), (0, 4), (1, 2), (2, 3), (3, 4), (1, 4), (4, 5)]
    g = synthetic_graph(roles, edges)
    _edit(g, 1, "src/pkg/mod.py")
    _edit(g, 3, "src/pkg/mod.py", revert=True)
    _edit(g, 4, "/repo/src/pkg/mod.py")
    from nemo_polar.credit.propagation import surviving_edits

    assert surviving_edits(g) == [4]
    credit, _ = propagate(g, 1.0, _direct())
    assert float(credit[1]) == 0.0  # undone: its change reached nothing
    assert float(credit[4]) == float(credit.max())
    assert 0 < float(credit[0]) < float(credit[4]) and 0 < float(credit[3]) < float(credit[4])
    assert float(credit[5]) > 0  # the passing verification of the fix
    # a revert of another file undoes nothing here; a revert of the whole tree undoes every earlier edit
    _edit(g, 3, "src/pkg/other.py", revert=True)
    assert surviving_edits(g) == [1, 4]
    _edit(g, 3, ".", revert=True)
    assert surviving_edits(g) == [4]


def test_unverified_surviving_edits_weigh_less() -> None:
    # two surviving edits, only the second is covered by a verification
    g = synthetic_graph(["AE", "AE", "RV"], [(1, 2)])
    full, _ = propagate(g, 1.0, _direct(unverified_weight=1.0))
    quarter, _ = propagate(g, 1.0, _direct(unverified_weight=0.25))
    assert float(full[0] / full[1]) > float(quarter[0] / quarter[1]) > 0


def test_without_a_surviving_edit_the_outdegree_share_is_used() -> None:
    g = synthetic_graph(["IG", "IG", "RV"], [(0, 1), (0, 2)])
    direct, _ = propagate(g, 1.0, _direct())
    outdeg, _ = propagate(g, 1.0, PropagationConfig(structure="outdegree", gamma=1.0, rescale="none"))
    assert_close(direct, outdeg)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, 1.0, 0.5, 0.25])), min_size=1, max_size=24),
    st.booleans(),
    st.booleans(),
)
def test_group_advantages_equal_nemo_rl(rows: list[tuple[int, float]], loo: bool, normalize: bool) -> None:
    """One Â_τ: the offline path (`polar credit`) and the trainer's NeMo RL formula agree (Bessel's correction
    included)."""
    from nemo_polar.credit.nemo_rl.baseline import grpo_sequence_advantages

    gids = [g for g, _ in rows]
    rewards = [r for _, r in rows]
    ours = group_advantages(
        rewards, gids, baseline="leave_one_out" if loo else "mean", normalize_std=normalize, std_eps=1e-6
    )
    prompts = torch.tensor([[g, 7] for g in gids])
    theirs = grpo_sequence_advantages(
        prompts, torch.tensor(rewards, dtype=torch.float64), leave_one_out=loo, normalize=normalize
    )
    assert_close(ours, theirs.to(torch.float64), rtol=1e-9, atol=1e-9)


def test_the_trainer_credits_the_edit_over_the_read() -> None:
    """The issue's two-call row "read, then edit", reward 1, through the NeMo RL estimator's credit (its graph has
    roles and parents only): the edit gets more than the read."""
    from nemo_polar.credit.nemo_rl.annotations import CallAnnotation
    from nemo_polar.credit.nemo_rl.core import call_credit

    anns = [CallAnnotation("IG"), CallAnnotation("AE", parents=(0,))]
    read, edit = call_credit(1.0, anns, [20, 20], CallCreditConfig())
    assert edit > read > 0
