# SPDX-License-Identifier: Apache-2.0
"""TaskSpec option blocks are checked at submit against the builder / evaluator / harness they name: a wrong key
is a 422 from the real rollout server (and an error from `load_jsonl`), never a lost trajectory at POSTRUN."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from pydantic import BaseModel, ConfigDict

from nemo_polar.evaluators import EvalContext
from nemo_polar.rollout.spec import TaskSpec, TaskSpecError, load_jsonl
from nemo_polar.rollout.task_options import TaskOptionsError, check_task_options, option_errors
from nemo_polar.types import EvalResult

from .helpers import example_task, start_server


class _MyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threshold: float


async def checked_evaluator(ctx: EvalContext) -> EvalResult:
    return EvalResult(reward=1.0, resolved=True)


checked_evaluator.options_model = _MyOptions  # type: ignore[attr-defined]


async def unchecked_evaluator(ctx: EvalContext) -> EvalResult:
    return EvalResult(reward=1.0, resolved=True)


def _task(**over: Any) -> TaskSpec:
    data = example_task("slugify").model_dump(mode="json")
    for dotted, value in over.items():  # "evaluator__options" -> data["evaluator"]["options"]
        *parents, last = dotted.split("__")
        node = data
        for p in parents:
            node = node[p]
        node[last] = value
    return TaskSpec.model_validate(data)


def test_a_well_formed_task_has_no_option_errors() -> None:
    assert option_errors(example_task("slugify")) == []
    check_task_options(_task(agent={"harness": "pi", "options": {"max_turns": 4, "provider_api": "openai"}}))
    check_task_options(_task(builder={"name": "prefix_merging", "options": {"side_calls": "drop"}}))
    check_task_options(_task(evaluator={"name": "command", "options": {"command": "true", "fresh": True}}))
    # an evaluator without an options model is not checked; one with a model is
    check_task_options(_task(evaluator={"name": f"{__name__}:unchecked_evaluator", "options": {"any": 1}}))
    check_task_options(_task(evaluator={"name": f"{__name__}.checked_evaluator", "options": {"threshold": 0.5}}))


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({"evaluator__options": {"FAIL_TO_PAS": ["t::x"]}}, "evaluator.options.FAIL_TO_PAS: Extra inputs"),
        ({"evaluator__options": {"PASS_TO_PASS": []}}, "swe_tests needs FAIL_TO_PASS"),
        ({"evaluator": {"name": "command", "options": {"comand": "true"}}}, "evaluator.options.comand: Extra"),
        ({"evaluator": {"name": "session_completed", "options": {"x": 1}}}, "evaluator.options.x: Extra"),
        ({"evaluator": {"name": f"{__name__}:checked_evaluator", "options": {"treshold": 1}}}, "options.treshold"),
        ({"evaluator": {"name": "no_such_evaluator"}}, "evaluator.name: unknown evaluator 'no_such_evaluator'"),
        ({"builder": {"name": "prefix_merging", "options": {"fidelty": "exact"}}}, "builder.options.fidelty: Extra"),
        ({"builder": {"name": "prefix_merging", "options": {"fidelity": "lossy"}}}, "builder.options.fidelity"),
        ({"builder": {"name": "no.such:builder"}}, "builder.name: cannot load builder 'no.such:builder'"),
        ({"agent__options": {"run_seconds": 1}}, "agent.options.run_seconds: Extra"),
        ({"agent": {"harness": "pi", "options": {"max_turn": 3}}}, "agent.options.max_turn: Extra"),
        ({"agent": {"harness": "pi", "options": {"max_turns": "many"}}}, "agent.options.max_turns"),
        ({"agent": {"harness": "vim"}}, "agent.harness: unknown harness 'vim'"),
    ],
)
def test_a_wrong_option_is_named(over: dict[str, Any], expected: str) -> None:
    errors = option_errors(_task(**over))
    assert any(expected in e for e in errors), errors
    with pytest.raises(TaskOptionsError):
        check_task_options(_task(**over))


def test_the_builder_check_leaves_cross_field_rules_to_the_gateway() -> None:
    # canonical fidelity needs eot_token_ids, which the gateway supplies from its model: not an error at submit
    assert option_errors(_task(builder={"name": "prefix_merging", "options": {"fidelity": "canonical"}})) == []


def test_load_jsonl_reports_a_wrong_option_with_its_line(tmp_path: Path) -> None:
    good = example_task("slugify", task_id="good").model_dump(mode="json")
    bad = {**good, "task_id": "bad", "evaluator": {"name": "swe_tests", "options": {"FAIL_TO_PAS": ["t::x"]}}}
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(orjson.dumps(good) + b"\n" + orjson.dumps(bad) + b"\n")
    with pytest.raises(TaskSpecError) as info:
        load_jsonl(path)
    assert info.value.errors == ["line 2: evaluator.options.FAIL_TO_PAS: Extra inputs are not permitted"]


def test_the_rollout_server_answers_422_at_submit_for_a_wrong_key(tmp_path: Path) -> None:
    async def main() -> list[tuple[int, Any]]:
        runner, url, _ = await start_server(tmp_path)
        out = []
        try:
            async with aiohttp.ClientSession() as http:
                good = example_task("slugify", task_id="t-good").model_dump(mode="json")
                wrong_eval = {**good, "task_id": "t-eval", "evaluator": {"name": "swe_tests", "options": {"F2P": []}}}
                wrong_agent = {**good, "task_id": "t-agent", "agent": {"harness": "pi", "options": {"turns": 3}}}
                for body in (wrong_eval, wrong_agent, good):
                    async with http.post(url + "/tasks", json=body) as r:
                        out.append((r.status, await r.json()))
                async with http.get(url + "/tasks/t-eval") as r:
                    out.append((r.status, None))
        finally:
            await runner.cleanup()
        return out

    (s1, b1), (s2, b2), (s3, b3), (s4, _) = asyncio.run(main())
    assert s1 == 422 and "evaluator.options.F2P: Extra inputs are not permitted" in b1["error"]["errors"]
    assert "F2P" in orjson.dumps(b1).decode()
    assert s2 == 422 and "agent.options.turns: Extra inputs are not permitted" in b2["error"]["errors"]
    assert s3 == 201 and b3["created"] is True
    assert s4 == 404  # the refused task was never journalled
