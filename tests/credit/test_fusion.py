# SPDX-License-Identifier: Apache-2.0
"""Ã_t = α·A^GRPO + (1−α)·Â_v(t) on per_request and prefix_merging traces; α = 1 is GRPO exactly."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nemo_polar.credit import annotate, assign, fuse_batch, fuse_row, token_advantages
from nemo_polar.credit.config import CallCreditConfig, FusionConfig
from torch.testing import assert_close

from .sessions import bugfix_steps, make_session, per_request_trajectory, prefix_merged_trajectory


def test_fuse_row_by_hand() -> None:
    # 10 tokens: call 0 = [0, 3), interstitial [3, 5), call 1 = [5, 8), then 2 masked tokens
    mask = torch.tensor([1, 1, 1, 0, 0, 1, 1, 1, 0, 0])
    out = fuse_row(mask, [(0, 3, 0), (5, 8, 1)], torch.tensor([2.0, -1.0]), 0.5, alpha=0.25)
    a0 = 0.25 * 0.5 + 0.75 * 2.0
    a1 = 0.25 * 0.5 + 0.75 * -1.0
    assert_close(out, torch.tensor([a0, a0, a0, 0, 0, a1, a1, a1, 0, 0], dtype=torch.float32))


def test_unspanned_trainable_tokens() -> None:
    mask = torch.tensor([1, 1, 1, 1])
    traj = fuse_row(mask, [(0, 2, 0)], torch.tensor([3.0]), 1.0, alpha=0.5)
    zero = fuse_row(mask, [(0, 2, 0)], torch.tensor([3.0]), 1.0, alpha=0.5, unspanned="zero")
    assert_close(traj, torch.tensor([2.0, 2.0, 1.0, 1.0]))
    assert_close(zero, torch.tensor([2.0, 2.0, 0.5, 0.5]))


def test_call_weights_multiply_their_span() -> None:
    out = fuse_row(
        torch.ones(4), [(0, 2, 0), (2, 4, 1)], torch.tensor([1.0, 1.0]), 1.0, 0.0, call_weight=torch.tensor([0.3, 1.0])
    )
    assert_close(out, torch.tensor([0.3, 0.3, 1.0, 1.0]))


def test_per_request_and_prefix_merging_give_each_call_the_same_advantage() -> None:
    recs = make_session(bugfix_steps(), gen_len=[3, 4, 5, 6, 7, 3, 4, 5, 2])
    g = annotate(recs, harness="claude_code")
    a = assign([g, g], [1.0, 0.0], group_ids=[0, 0])[0]
    cfg = CallCreditConfig(fusion=FusionConfig(alpha=0.3))
    pr = per_request_trajectory(recs)
    pm = prefix_merged_trajectory(recs)
    pr_adv = token_advantages(pr, g, a, cfg)
    (pm_adv,) = token_advantages(pm, g, a, cfg)
    assert len(pr_adv) == len(recs)
    for k, (rid, s, e) in enumerate(pm.traces[0].call_spans):
        assert rid == recs[k].id
        assert_close(pm_adv[s:e], pr_adv[k])
        expected = 0.3 * a.advantage + 0.7 * float(a.credit[k])
        assert_close(pr_adv[k], torch.full((e - s,), expected, dtype=torch.float32))
    inter = torch.tensor(pm.traces[0].loss_mask) == 0
    assert inter.any() and torch.count_nonzero(pm_adv[inter]) == 0


def test_fuse_batch_matches_rows() -> None:
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    spans = [[(0, 2, 0), (3, 5, 1)], [(0, 4, 0)]]
    credits = [torch.tensor([1.0, 2.0]), torch.tensor([-1.0])]
    adv = torch.tensor([0.5, -0.25])
    batch = fuse_batch(mask, spans, adv, credits, 0.4)
    for i in range(2):
        assert_close(batch[i], fuse_row(mask[i], spans[i], credits[i], float(adv[i]), 0.4))


@st.composite
def rows(draw: st.DrawFn) -> tuple[torch.Tensor, list[tuple[int, int, int]], torch.Tensor, float]:
    n = draw(st.integers(1, 60))
    mask = torch.tensor(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=0, max_size=10)))
    spans = [(cuts[i], cuts[i + 1], i // 2) for i in range(0, len(cuts) - 1, 2)]
    k = max((s[2] for s in spans), default=-1) + 1
    credit = torch.tensor(draw(st.lists(st.floats(-10, 10), min_size=k, max_size=k)), dtype=torch.float64)
    adv = draw(st.floats(-5, 5))
    return mask, spans, credit, adv


@settings(max_examples=200, deadline=None)
@given(rows())
def test_alpha_one_reproduces_grpo_exactly(
    row: tuple[torch.Tensor, list[tuple[int, int, int]], torch.Tensor, float],
) -> None:
    mask, spans, credit, adv = row
    grpo = torch.full((mask.numel(),), adv, dtype=torch.float32) * mask.to(torch.float32)
    out = fuse_row(mask, spans, credit, adv, alpha=1.0)
    assert torch.equal(out, grpo)
    batch = fuse_batch(mask[None], [spans], [adv], [credit], 1.0)
    assert torch.equal(batch[0], grpo)


@settings(max_examples=100, deadline=None)
@given(rows(), st.floats(0, 1))
def test_masked_tokens_are_always_zero(
    row: tuple[torch.Tensor, list[tuple[int, int, int]], torch.Tensor, float], alpha: float
) -> None:
    mask, spans, credit, adv = row
    out = fuse_row(mask, spans, credit, adv, alpha)
    assert torch.count_nonzero(out[mask == 0]) == 0


def test_with_the_real_trajectory_builders() -> None:
    from nemo_polar.trajectory import build

    recs = make_session(bugfix_steps(), gen_len=[3, 4, 5, 6, 7, 3, 4, 5, 2])
    g = annotate(recs, harness="claude_code")
    a = assign([g, g], [1.0, 0.0])[0]
    cfg = CallCreditConfig(fusion=FusionConfig(alpha=0.0))
    per_call: dict[str, list[torch.Tensor]] = {}
    for builder in ("per_request", "prefix_merging"):
        traj = build(recs, builder=builder, reward=1.0)
        assert annotate(traj, records=recs, harness="claude_code").roles() == g.roles()
        advs = token_advantages(traj, g, a, cfg)
        for tr, adv in zip(traj.traces, advs, strict=True):
            assert adv.shape == (len(tr.response_ids),)
            for rid, s, e in tr.call_spans:
                per_call.setdefault(rid, []).append(adv[s:e])
    assert len(per_call) == len(recs)
    for k, r in enumerate(recs):
        pr, pm = per_call[r.id]
        assert_close(pr, pm)
        assert_close(pr, torch.full_like(pr, float(a.credit[k])))


def test_polar_calls_shape() -> None:
    g = annotate(make_session(bugfix_steps()), harness="claude_code")
    calls = g.polar_calls()
    assert [c["call_index"] for c in calls] == list(range(len(g)))
    assert set(calls[0]) == {"call_index", "record_id", "role", "evidence", "parents", "chain_kind"}
    assert calls[4]["parents"] == g.parents(4) and calls[4]["chain_kind"] == "main"


def test_ig_damping_reaches_the_loss_as_token_and_sample_weights() -> None:
    from nemo_polar.credit import sampling_weights
    from nemo_polar.credit.fusion import sample_weights, token_weights

    recs = make_session(bugfix_steps(), gen_len=[3, 4, 5, 6, 7, 3, 4, 5, 2])
    g = annotate(recs, harness="claude_code")
    a = assign([g, g], [1.0, 0.0], group_ids=[0, 0])[0]
    cw = sampling_weights(g, a)
    damped = [k for k, n in enumerate(g.nodes) if n.role == "IG" and float(cw[k]) < 1.0]
    assert damped, "the unused reads of this session are damped"
    pm = prefix_merged_trajectory(recs)
    (tw,) = token_weights(pm, g, cw)
    mask = torch.tensor(pm.traces[0].loss_mask, dtype=torch.float32)
    for k, (_, s, e) in enumerate(pm.traces[0].call_spans):
        assert_close(tw[s:e], torch.full((e - s,), float(cw[k])) * mask[s:e])
    assert torch.count_nonzero(tw[mask == 0]) == 0
    # per sample: per_request has one trace per call, so its weight is the call's
    pr = per_request_trajectory(recs)
    assert sample_weights(pr, g, cw) == pytest.approx([float(w) for w in cw])
    (merged,) = sample_weights(pm, g, cw)
    assert merged == pytest.approx(float(tw.sum() / mask.sum())) and merged < 1.0
