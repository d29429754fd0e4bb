# SPDX-License-Identifier: Apache-2.0
"""`polar_agent`'s Gym results through NeMo RL's own post-processing, up to the CALL-CREDIT advantages.

`polar_agent/convert.py` turns a session into Gym output items and `polar_calls`; NeMo RL's
`NemoGym._postprocess_nemo_gym_to_nemo_rl_result` (the real method, called on the actor's class: the Ray actor
itself needs running Gym servers) turns them into a message log, asserting contiguity; its
`_postprocess_single_nemo_gym_group` builds the group batch (with the `polar_calls` patch); NeMo RL's loss-mask and
flattening functions make the mask; the estimator gives per-call advantages that follow the `polar_calls` roles.
Tokenizer: the embedded backend's tiny-qwen3 (`make backend`).
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from nemo_polar.credit.nemo_rl import CallCreditAdvantageEstimator
from nemo_polar.credit.nemo_rl.patches import install_polar_calls_patch

from nemo_polar.types import SessionResult, Trace, Trajectory, TrajectoryStats

ROOT = Path(__file__).resolve().parents[2]
AGENT_DIR = ROOT / "environments" / "responses_api_agents" / "polar_agent"
ROW = {"responses_create_params": {"input": [{"role": "user", "content": "fix it"}]}, "agent_ref": {"name": "a"}}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from nemo_polar.backend.config import model_dir

    path = model_dir("tiny-qwen3")
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"tiny-qwen3 is not built at {path} (make backend)")
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def convert() -> ModuleType:
    spec = importlib.util.spec_from_file_location("polar_agent_convert_nrl", AGENT_DIR / "convert.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _session(reward_id: str, extra: list[int]) -> SessionResult:
    # main chain: prompt [1,2,3]; call a samples [10,11]; tool output [20,21] (not trained); call b samples [12,*extra]
    main = Trace(
        prompt_ids=[1, 2, 3],
        response_ids=[10, 11, 20, 21, 12, *extra],
        loss_mask=[1, 1, 0, 0, 1, *([1] * len(extra))],
        response_logprobs=[-0.1, -0.2, 0.0, 0.0, -0.3, *([-0.4] * len(extra))],
        call_spans=[("a", 0, 2), ("b", 4, 5 + len(extra))],
        chain_kind="main",
    )
    side = Trace(prompt_ids=[7], response_ids=[8, 9], loss_mask=[1, 1], response_logprobs=[-1.0, -1.0],
                 call_spans=[("s", 0, 2)], chain_kind="side")  # fmt: skip
    trajectory = Trajectory(traces=[main, side], stats=TrajectoryStats(chains=2, records=3, trainable_tokens=5))
    return SessionResult(session_id=reward_id, task_id="t", trajectory=trajectory, record_ids=["a", "s", "b"])


def _nemo_rl_result(convert: ModuleType, session: SessionResult, reward: float, tokenizer: Any) -> dict[str, Any]:
    from nemo_rl.environments.nemo_gym import NemoGym

    response = convert.gym_response(session, [], model="m", created_at=0)
    full = {
        "response": response,
        "responses_create_params": ROW["responses_create_params"],
        "reward": reward,
        "polar_calls": [
            {"call_index": 0, "record_id": "a", "role": "IG", "parents": []},
            {"call_index": 2, "record_id": "b", "role": "AE", "parents": [0]},
        ],
        "instance_config": {"mask_sample": False},
    }
    actor = NemoGym.__ray_actor_class__  # the class behind the Ray actor handle
    out = actor._postprocess_nemo_gym_to_nemo_rl_result(SimpleNamespace(cfg={}, _processor=None), ROW, full, tokenizer)
    return {**out, "full_result": full}


def _postprocess_group(rollouts: Any, timer_cls: Any, results: list[Any], tokenizer: Any) -> Any:
    """NeMo RL's own post-processing of one Gym group of two rows (`results`, in row order)."""

    return rollouts._postprocess_single_nemo_gym_group(
        [ROW, ROW],
        results,
        timer_cls(),
        "test",
        SimpleNamespace(cfg={"max_total_sequence_length": 4096}),
        {"loss_multiplier": torch.ones(2)},
        tokenizer,
        False,
    )


def test_the_main_chain_becomes_nemo_rl_message_log_and_a_broken_chain_is_refused(
    convert: ModuleType, tokenizer: Any
) -> None:
    from nemo_rl.environments.nemo_gym import NemoGym

    result = _nemo_rl_result(convert, _session("s1", []), 1.0, tokenizer)
    log = [(m["role"], m["token_ids"].tolist()) for m in result["message_log"]]
    assert log == [("user", [1, 2, 3]), ("assistant", [10, 11]), ("user", [20, 21]), ("assistant", [12])]
    # the side chain is not sent with token ids (it would break NeMo RL's contiguity rule and the whole batch)
    response = convert.gym_response(_session("s1", []), [], model="m", created_at=0)
    with_ids = [item for item in response["output"] if item.get("generation_token_ids")]
    assert [item["generation_token_ids"] for item in with_ids] == [[10, 11], [12]]
    broken = copy.deepcopy(response)
    with_ids = [item for item in broken["output"] if item.get("generation_token_ids")]
    with_ids[1]["prompt_token_ids"] = [1, 2, 3, 99]  # not an extension of what was seen
    full = {"response": broken, "responses_create_params": ROW["responses_create_params"], "reward": 0.0}
    with pytest.raises(AssertionError, match="Non-contiguous"):
        NemoGym.__ray_actor_class__._postprocess_nemo_gym_to_nemo_rl_result(
            SimpleNamespace(cfg={}, _processor=None), ROW, full, tokenizer
        )


def test_per_call_advantages_follow_the_polar_calls_through_nemo_rl_batching(
    convert: ModuleType, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nemo_rl.algorithms.grpo import add_grpo_token_loss_masks_and_generation_logprobs
    from nemo_rl.data.llm_message_utils import batched_message_log_to_flat_message
    from nemo_rl.experience import rollouts
    from nemo_rl.utils.timer import Timer

    monkeypatch.setattr(rollouts, "_postprocess_single_nemo_gym_group", rollouts._postprocess_single_nemo_gym_group)
    install_polar_calls_patch(rollouts)
    results = [
        _nemo_rl_result(convert, _session("s1", []), 1.0, tokenizer),
        _nemo_rl_result(convert, _session("s2", [13]), 0.0, tokenizer),
    ]
    group = _postprocess_group(rollouts, Timer, results, tokenizer)
    batch = group.final_batch
    assert [len(c) for c in batch["polar_calls"]] == [2, 2]
    add_grpo_token_loss_masks_and_generation_logprobs(batch["message_log"])
    flat, _ = batched_message_log_to_flat_message(batch["message_log"], pad_value_dict={"token_ids": 0})
    mask = flat["token_loss_mask"] * (~batch["mask_sample"]).float().unsqueeze(-1)
    # forced and interstitial tokens (the prompt, the tool output) are not trainable
    assert flat["token_loss_mask"][0].tolist()[:9] == [0, 0, 0, 1, 1, 0, 0, 1, 0]
    prompt_ids = flat["token_ids"][:, :3]
    estimator = CallCreditAdvantageEstimator({"call_credit": {"alpha": 0.0}}, None)
    adv = estimator.compute_advantage(prompt_ids, batch["total_reward"], mask, repeated_batch=batch)
    assert [[a.role for a in row] for row in estimator.last_annotations] == [["IG", "AE"], ["IG", "AE"]]
    assert torch.all(adv[mask == 0] == 0)
    for row in range(2):
        ig, ae = adv[row, 3:5], adv[row, 7:8]
        assert torch.all(ig == ig[0]) and torch.all(ae == ae[0])  # one value per call
        assert float(ig[0]) != float(ae[0])  # roles weigh calls differently (ω_AE ≠ ω_IG)
    assert float(adv[0, 7]) > 0 > float(adv[1, 7])  # the rewarded session's AE call is pushed up, the other down


def test_delivery_metrics_reach_nemo_rl_rollout_metrics_and_a_dropped_chain_is_warned_about(
    convert: ModuleType, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The undelivered share is visible to a NeMo RL user: `polar_agent`'s top-level delivery numbers come out of
    NeMo RL's own group post-processing as per-agent rollout metrics, and the agent warns about a dropped chain."""
    import logging

    from nemo_rl.experience import rollouts
    from nemo_rl.utils.timer import Timer

    spec = importlib.util.spec_from_file_location("polar_agent_app_nrl", AGENT_DIR / "app.py")
    assert spec is not None and spec.loader is not None
    polar_agent = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, polar_agent)
    spec.loader.exec_module(polar_agent)

    results, expected = [], []
    for sid, extra in (("s1", []), ("s2", [13, 14])):
        session = _session(sid, extra)
        sent = convert.delivery(session, [])  # no records: each call's generated tokens are its span's
        metrics = convert.delivery_metrics(sent)
        result = _nemo_rl_result(convert, session, 1.0, tokenizer)
        verify = polar_agent.PolarAgentVerifyResponse.model_validate(
            {**result["full_result"], "responses_create_params": {"input": []}, **metrics}
        )
        result["full_result"] = {**result["full_result"], **verify.model_dump(include=set(metrics))}
        results.append(result)
        expected.append(metrics["polar_delivered_tokens_fraction"])
    assert expected == [3 / 5, (3 + 2) / (5 + 2)]  # the side chain's 2 tokens are what is left out
    group = _postprocess_group(rollouts, Timer, results, tokenizer)
    logged = group.rollout_metrics
    assert logged["a/polar_delivered_tokens_fraction/mean"] == pytest.approx(sum(expected) / 2)
    assert logged["a/polar_undelivered_calls/mean"] == 1.0 and logged["a/polar_undelivered_tokens/max"] == 2.0
    # the warning: once per newly dropped chain kind in the process, with the numbers
    agent = SimpleNamespace(_warned_chains=set(), config=SimpleNamespace(harness="pi"))
    with caplog.at_level(logging.WARNING, logger="polar_agent"):
        for _ in range(2):
            polar_agent.PolarAgent._warn_undelivered(agent, convert.delivery(_session("s1", []), []), "s1")
    warned = [r.getMessage() for r in caplog.records if r.name == "polar_agent"]
    assert len(warned) == 1 and "2 of 3 calls" in warned[0] and "side: 1 calls, 2 generated" in warned[0], warned
