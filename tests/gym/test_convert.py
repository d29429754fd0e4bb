# SPDX-License-Identifier: Apache-2.0
"""polar_agent's conversion (`environments/responses_api_agents/polar_agent/convert.py`) and the reproduction of
NeMo RL's contiguity rule, on hand-computed chains (no NeMo Gym needed): the main chain becomes output items that
pass the rule, other chains are reported with their sizes, and the rule really rejects a broken chain."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from nemo_polar.types import SessionResult, Trace, Trajectory, TrajectoryStats

from .contiguity import NonContiguous, to_message_log

AGENT_DIR = Path(__file__).resolve().parents[2] / "environments" / "responses_api_agents" / "polar_agent"


def _convert() -> ModuleType:
    spec = importlib.util.spec_from_file_location("polar_agent_convert", AGENT_DIR / "convert.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _result() -> SessionResult:
    # main chain: prompt [1,2,3]; call a samples [10,11]; tool output [20,21] (masked); call b samples [12]
    main = Trace(
        prompt_ids=[1, 2, 3],
        response_ids=[10, 11, 20, 21, 12],
        loss_mask=[1, 1, 0, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, 0.0, -0.3],
        call_spans=[("a", 0, 2), ("b", 4, 5)],
        chain_kind="main",
    )
    side = Trace(prompt_ids=[7], response_ids=[8, 9], loss_mask=[1, 1], response_logprobs=[-1.0, -1.0],
                 call_spans=[("s", 0, 2)], chain_kind="side")  # fmt: skip
    traj = Trajectory(traces=[main, side], stats=TrajectoryStats(chains=2, records=3, trainable_tokens=5,
                                                                 delivered_fraction=0.6))  # fmt: skip
    return SessionResult(session_id="s1", task_id="t", trajectory=traj, record_ids=["a", "s", "b"], harness="pi")


def test_main_chain_items_pass_the_contiguity_rule() -> None:
    conv = _convert()
    res = _result()
    resp = conv.gym_response(res, [], model="m", created_at=0)
    calls = [i for i in resp["output"] if i.get("generation_token_ids")]
    assert [c["generation_token_ids"] for c in calls] == [[10, 11], [12]]
    assert calls[1]["prompt_token_ids"] == [1, 2, 3, 10, 11, 20, 21]
    log = to_message_log({"response": resp})
    assert [m["token_ids"] for m in log] == [[1, 2, 3], [10, 11], [20, 21], [12]]
    summary = conv.polar_summary(res, elapsed_s=1.0)
    assert summary["delivered_fraction"] == 0.6 and summary["delivered_chain"] == "main"
    assert summary["other_chains"] == [{"trace_index": 1, "chain_kind": "side", "calls": 1, "trainable_tokens": 2}]


def test_no_main_chain_delivers_nothing() -> None:
    conv = _convert()
    res = _result()
    res.trajectory.traces = res.trajectory.traces[1:]
    assert conv.gym_response(res, [], model="m", created_at=0)["output"] == []
    assert conv.polar_summary(res, elapsed_s=0.0)["delivered_fraction"] == 0.0
    assert conv.polar_calls(res, [], harness="pi") == []


@pytest.mark.parametrize("breakage", ["dropped_think", "logprob_count"])
def test_the_rule_rejects_a_broken_chain(breakage: str) -> None:
    resp = _convert().gym_response(_result(), [], model="m", created_at=0)
    bad = copy.deepcopy(resp)
    calls = [i for i in bad["output"] if i.get("generation_token_ids")]
    if breakage == "dropped_think":  # the template re-rendered history without a sampled token
        calls[1]["prompt_token_ids"] = [1, 2, 3, 10, 20, 21]
        with pytest.raises(NonContiguous, match="Non-contiguous"):
            to_message_log({"response": bad})
    else:
        calls[0]["generation_log_probs"] = [-0.1]
        with pytest.raises(NonContiguous, match="logprobs"):
            to_message_log({"response": bad})
