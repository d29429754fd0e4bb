# SPDX-License-Identifier: Apache-2.0
"""The estimator against NeMo RL's contract, on batches built in NeMo RL's exact layout (`nemo_rl_repro.py`).

Checks shape/dtype/device, zeros where mask == 0, untouched inputs, per-segment values against hand-computed
CALL-CREDIT, equality with NeMo RL's GRPO token advantages at α = 1, the decode route with a real tokenizer,
config from dicts and pydantic models, `last_metrics`, and the loud failures.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
from nemo_polar.credit.nemo_rl import CallCreditAdvantageEstimator
from nemo_polar.credit.nemo_rl.baseline import grpo_sequence_advantages
from nemo_polar.credit.nemo_rl.layout import LayoutError
from nemo_rl.algorithms.advantage_estimator import AdvEstimatorConfig, GRPOAdvantageEstimator

from .nemo_rl_repro import build_batch, reference_grpo

PROPAGATION = {
    "gamma": 0.5,
    "structure": "outdegree",  # the hand computations below are the seed's literal out-degree share
    "leaf_mode": "epsilon",
    "epsilon": 0.5,
    "rescale": "none",
    "omega": {"AE": 1.0, "IG": 0.5, "RV": 0.25, "OTHER": 0.0},
}


def _config(alpha: float, **extra: object) -> dict:
    return {
        "name": "grpo",
        "_target_": "nemo_polar.credit.nemo_rl.CallCreditAdvantageEstimator",
        "normalize_rewards": True,
        "use_leave_one_out_baseline": True,
        "call_credit": {"alpha": alpha, "annotations": "polar_calls", "propagation": PROPAGATION, **extra},
    }


# Two GRPO groups (prompts A and B), rows of 1-3 calls, one masked row (mask_sample) in group B.
PA, PB = [11, 12, 13], [21, 22]
ROWS = [
    [(PA, [31, 32]), ([*PA, 31, 32, 41], [33, 34, 35]), ([*PA, 31, 32, 41, 33, 34, 35, 42, 43], [36])],
    [(PA, [51])],
    [(PA, [61, 62]), ([*PA, 61, 62, 71], [63])],
    [(PB, [81, 82, 83])],
    [(PB, [91]), ([*PB, 91, 92], [93, 94])],
    [(PB, [95]), ([*PB, 95, 96], [97])],
]
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
MASKED = [False, False, False, False, False, True]
POLAR_CALLS = [
    [{"call_index": 0, "role": "IG", "parents": []}, {"call_index": 1, "role": "AE", "parents": [0]},
     {"call_index": 2, "role": "RV", "parents": [1]}],
    [{"call_index": 0, "role": "OTHER", "parents": []}],
    [{"call_index": 0, "role": "IG", "parents": []}, {"call_index": 1, "role": "AE", "parents": [0]}],
    [{"call_index": 0, "role": "AE", "parents": []}],
    [{"call_index": 0, "role": "IG", "parents": []}, {"call_index": 1, "role": "RV", "parents": []}],
    [{"call_index": 0, "role": "IG", "parents": []}, {"call_index": 1, "role": "AE", "parents": [0]}],
]  # fmt: skip


def _batch(divisible_by: int = 8) -> dict:
    batch = build_batch(ROWS, REWARDS, mask_sample=MASKED, divisible_by=divisible_by)
    batch["repeated_batch"]["polar_calls"] = copy.deepcopy(POLAR_CALLS)
    return batch


def _call(est: CallCreditAdvantageEstimator, batch: dict, **kwargs: object) -> torch.Tensor:
    return est.compute_advantage(
        prompt_ids=batch["prompt_ids"],
        rewards=batch["rewards"],
        mask=batch["mask"],
        repeated_batch=batch["repeated_batch"],
        logprobs_policy=torch.zeros(batch["mask"].shape),
        logprobs_reference=None,
        **kwargs,
    )


def test_layout_reproduction_is_nemo_rl_shaped() -> None:
    b = _batch()
    assert b["mask"].shape == (6, 16)  # longest row 12 tokens, padded to a multiple of 8
    row0 = b["repeated_batch"]["message_log"][0]
    assert [m["role"] for m in row0] == ["user", "assistant"] * 3 and all(m["content"] == "" for m in row0)
    assert b["input_ids"][0, :12].tolist() == [11, 12, 13, 31, 32, 41, 33, 34, 35, 42, 43, 36]
    assert b["mask"][0, :12].tolist() == [0, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1]
    assert b["mask"][5].sum() == 0  # the masked sample
    assert b["prompt_ids"].shape == (6, 3) and b["prompt_ids"][3].tolist() == [21, 22, 0]


def test_contract_shape_dtype_zeros_and_untouched_inputs() -> None:
    b = _batch()
    before = copy.deepcopy(b)
    est = CallCreditAdvantageEstimator(_config(0.25), None)
    out = _call(est, b, valid_mask=None, sample_mask=b["repeated_batch"]["loss_multiplier"], teacher_logprobs=None)
    assert out.shape == b["mask"].shape and out.dtype == torch.float32 and out.device.type == "cpu"
    assert not out.requires_grad
    assert torch.all(out[b["mask"] == 0] == 0)
    assert torch.count_nonzero(out[b["mask"] != 0]) > 0
    for key in ("prompt_ids", "rewards", "mask", "input_ids"):
        assert torch.equal(b[key], before[key])
    assert b["repeated_batch"]["polar_calls"] == before["repeated_batch"]["polar_calls"]
    for log_now, log_then in zip(
        b["repeated_batch"]["message_log"], before["repeated_batch"]["message_log"], strict=True
    ):
        for m_now, m_then in zip(log_now, log_then, strict=True):
            assert m_now.keys() == m_then.keys() and torch.equal(m_now["token_ids"], m_then["token_ids"])


def test_per_segment_values_match_hand_computed_call_credit() -> None:
    b = _batch()
    out = _call(CallCreditAdvantageEstimator(_config(0.25), None), b)
    alpha = 0.25
    # group A rewards (1, 0, 0), leave-one-out: row 0 sees (0, 0) → baseline 0, std 0 → Â_τ = 1 (not divided)
    a0 = 1.0
    # row 2 sees (1, 0): baseline 0.5, Bessel std sqrt((0.5 − 0.25)·2) = sqrt(0.5)
    a2 = (0.0 - 0.5) / (math.sqrt(0.5) + 1e-6)
    # row 0: IG→AE→RV; out-degrees (1, 1, 0→ε=0.5): shares (0.4, 0.4, 0.2); γ^(3−pos) = (0.25, 0.5, 1)
    c0 = [a0 * 0.5 * 0.4 * 0.25, a0 * 1.0 * 0.4 * 0.5, a0 * 0.25 * 0.2 * 1.0]
    expect0 = [alpha * a0 + (1 - alpha) * c for c in c0]
    torch.testing.assert_close(out[0, 3:5], torch.full((2,), expect0[0]))
    torch.testing.assert_close(out[0, 6:9], torch.full((3,), expect0[1]))
    torch.testing.assert_close(out[0, 11:12], torch.full((1,), expect0[2]))
    # row 2: IG→AE; degrees (1, 0.5): shares (2/3, 1/3); γ^(2−pos) = (0.5, 1)
    c2 = [a2 * 0.5 * (2 / 3) * 0.5, a2 * 1.0 * (1 / 3) * 1.0]
    torch.testing.assert_close(out[2, 3:5], torch.full((2,), alpha * a2 + (1 - alpha) * c2[0]))
    torch.testing.assert_close(out[2, 6:7], torch.full((1,), alpha * a2 + (1 - alpha) * c2[1]))
    # row 1: a single OTHER call with ω = 0 → only the GRPO part remains
    a1 = (0.0 - 0.5) / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(out[1, 3:4], torch.full((1,), alpha * a1))
    # the masked sample still counts for group B's baseline (NeMo RL) but gets zeros itself
    a3 = (1.0 - 0.5) / (math.sqrt(0.5) + 1e-6)  # row 3 sees (0, 1)
    torch.testing.assert_close(out[3, 2:5], torch.full((3,), alpha * a3 + (1 - alpha) * a3 * 1.0 * 1.0 * 1.0))
    assert torch.all(out[5] == 0)


def test_alpha_one_equals_nemo_rl_grpo_token_advantages() -> None:
    b = _batch()
    out = _call(CallCreditAdvantageEstimator(_config(1.0), None), b)
    grpo = reference_grpo(b["prompt_ids"], b["rewards"], b["mask"], leave_one_out=True, normalize=True)
    torch.testing.assert_close(out, torch.where(b["mask"] != 0, grpo, torch.zeros(())), rtol=0, atol=1e-6)
    theirs = GRPOAdvantageEstimator(AdvEstimatorConfig(), None).compute_advantage(
        b["prompt_ids"], b["rewards"], b["mask"]
    )
    torch.testing.assert_close(out, torch.where(b["mask"] != 0, theirs, torch.zeros(())), rtol=0, atol=1e-6)


@pytest.mark.parametrize("leave_one_out", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_sequence_advantages_match_reference_on_random_groups(leave_one_out: bool, normalize: bool) -> None:
    rng = random.Random(7)
    for _ in range(20):
        groups = [rng.randint(1, 5) for _ in range(rng.randint(1, 4))]
        prompts = torch.tensor([[g, g + 1] for g, size in enumerate(groups) for _ in range(size)])
        perm = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(rng.randint(0, 999)))
        prompts = prompts[perm]
        rewards = torch.tensor([rng.choice([0.0, 1.0, 0.5, 0.25]) for _ in range(len(prompts))])
        mask = torch.ones(len(prompts), 3)
        ref = reference_grpo(prompts, rewards, mask, leave_one_out=leave_one_out, normalize=normalize)[:, 0]
        ours = grpo_sequence_advantages(prompts, rewards, leave_one_out=leave_one_out, normalize=normalize)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
        nemo_rl = GRPOAdvantageEstimator(
            AdvEstimatorConfig(normalize_rewards=normalize, use_leave_one_out_baseline=leave_one_out), None
        ).compute_advantage(prompts, rewards, mask)[:, 0]
        torch.testing.assert_close(ours, nemo_rl, rtol=1e-5, atol=1e-6)  # NeMo RL's own estimator


def test_config_from_pydantic_model_equals_config_from_dict() -> None:
    from nemo_rl.algorithms.advantage_estimator import AdvEstimatorConfig  # NeMo RL's own (extra="allow")

    b = _batch()
    from_dict = _call(CallCreditAdvantageEstimator(_config(0.4), None), b)
    model = AdvEstimatorConfig.model_validate(_config(0.4))
    from_model = _call(CallCreditAdvantageEstimator(model, None), b)
    torch.testing.assert_close(from_model, from_dict, rtol=0, atol=0)


def test_last_metrics_and_core_config() -> None:
    est = CallCreditAdvantageEstimator(_config(0.25), None)
    _call(est, _batch())
    m = est.last_metrics
    assert m["call_credit/alpha"] == 0.25
    assert m["call_credit/calls_per_sample/mean"] == pytest.approx(11 / 6)
    assert m["call_credit/rows_annotated_from_polar_calls"] == 1.0
    assert m["call_credit/role_share/IG"] == pytest.approx(4 / 11)
    assert m["call_credit/masked_tokens_outside_calls"] == 0.0
    assert est.config.propagation.gamma == 0.5


def test_polar_calls_with_session_wide_call_indices() -> None:
    """call_index may count side calls that are not in the delivered chain: parents map to chain positions."""
    from nemo_polar.credit.nemo_rl.annotations import from_polar_calls

    entries = [
        {"call_index": 0, "role": "IG", "parents": []},
        {"call_index": 2, "role": "AE", "parents": [0, 1]},  # 1 was a side call (another chain)
        {"call_index": 5, "role": "RV", "parents": [2]},
    ]
    assert [(a.role, a.parents) for a in from_polar_calls(entries, 3, 0)] == [("IG", ()), ("AE", (0,)), ("RV", (1,))]
    with pytest.raises(ValueError, match="does not increase"):
        from_polar_calls([entries[1], entries[0], entries[2]], 3, 0)
    with pytest.raises(ValueError, match="earlier call indices"):
        from_polar_calls([{"call_index": 0, "role": "IG", "parents": [0]}], 1, 0)


def test_fails_loudly_without_message_log() -> None:
    b = _batch()
    est = CallCreditAdvantageEstimator(_config(0.5), None)
    with pytest.raises(LayoutError, match="message_log"):
        est.compute_advantage(b["prompt_ids"], b["rewards"], b["mask"], repeated_batch=None)
    with pytest.raises(LayoutError, match="message_log"):
        est.compute_advantage(b["prompt_ids"], b["rewards"], b["mask"], repeated_batch={"total_reward": b["rewards"]})


def test_rejects_mismatched_annotations_and_bad_options() -> None:
    b = _batch()
    b["repeated_batch"]["polar_calls"][0] = b["repeated_batch"]["polar_calls"][0][:2]
    with pytest.raises(ValueError, match="2 entries for 3 generated segments"):
        _call(CallCreditAdvantageEstimator(_config(0.5), None), b)
    with pytest.raises(ValueError, match="alpha"):
        CallCreditAdvantageEstimator(_config(1.5), None)
    with pytest.raises(ValueError, match="no_such_option"):
        CallCreditAdvantageEstimator(_config(0.5, no_such_option=1), None)


# -- the decode route: no polar_calls column, calls decoded with a real tokenizer -------------------------------

TEXTS = [
    (
        "<|im_start|>user\nFix add() in /repo/src/calc.py<|im_end|>\n<|im_start|>assistant\n",
        '<tool_call>\n{"name": "read_file", "arguments": {"absolute_path": "/repo/src/calc.py"}}\n</tool_call>',
    ),
    (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n/repo/src/calc.py:\ndef add(a, b):\n    return a - b\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n",
        '<tool_call>\n{"name": "replace", "arguments": {"file_path": "/repo/src/calc.py", '
        '"old_string": "return a - b", "new_string": "return a + b"}}\n</tool_call>',
    ),
    (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nSuccessfully modified file: /repo/src/calc.py (1 "
        "replacements).\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        '<tool_call>\n{"name": "run_shell_command", "arguments": {"command": "python -m pytest tests/test_calc.py'
        ' -q"}}\n</tool_call>',
    ),
    (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n1 passed in 0.01s\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
        "The fix is done.",
    ),
]


def _tokenizers() -> list[tuple[str, object]]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [p + g for p, g in TEXTS] * 3
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    out: list[tuple[str, object]] = [("in-test byte-level BPE", tok)]
    from nemo_polar.backend.config import cache_dir

    cached = cache_dir() / "models" / "tiny-qwen3" / "tokenizer.json"
    if cached.is_file():  # the real Qwen3 tokenizer, prepared by `make backend` (before the suite in `make test`)
        out.append(("tiny-qwen3", Tokenizer.from_file(str(cached))))
    return out


@pytest.mark.parametrize("name,tokenizer", _tokenizers(), ids=lambda v: v if isinstance(v, str) else "")
def test_decode_route_recovers_roles_and_edges(name: str, tokenizer: object) -> None:
    encode = tokenizer.encode  # type: ignore[attr-defined]
    prompt: list[int] = []
    items = []
    for prompt_text, generation_text in TEXTS:
        prompt = prompt + encode(prompt_text).ids
        generation = encode(generation_text).ids
        items.append((list(prompt), generation))
        prompt = prompt + generation
    rows = [items, items[:1]]
    b = build_batch(rows, [1.0, 0.0])
    b["prompt_ids"] = torch.zeros((2, 1), dtype=torch.long)  # one group
    config = _config(0.5, annotations="decode", harness="qwen_code")
    est = CallCreditAdvantageEstimator(config, None, tokenizer=tokenizer)
    decoded = _call(est, b)
    roles = [a.role for a in est.last_annotations[0]]
    assert roles == ["IG", "AE", "RV", "OTHER"], name
    parents = [a.parents for a in est.last_annotations[0]]
    assert 0 in parents[1] and 1 in parents[2], parents  # IG→AE by path, AE→RV by verification
    # the same row annotated through the polar_calls column gives the same advantages
    b2 = build_batch(rows, [1.0, 0.0])
    b2["prompt_ids"] = b["prompt_ids"]
    b2["repeated_batch"]["polar_calls"] = [
        [{"call_index": k, "role": a.role, "parents": list(a.parents)} for k, a in enumerate(anns)]
        for anns in est.last_annotations
    ]
    from_column = _call(CallCreditAdvantageEstimator(_config(0.5), None), b2)
    torch.testing.assert_close(decoded, from_column, rtol=0, atol=0)


def test_decode_route_without_a_tokenizer_fails_loudly() -> None:
    b = build_batch([[(PA, [31])]], [1.0])
    with pytest.raises(ValueError, match="tokenizer"):
        _call(CallCreditAdvantageEstimator(_config(0.5, annotations="decode"), None), b)
