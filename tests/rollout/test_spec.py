# SPDX-License-Identifier: Apache-2.0
"""TaskSpec validation and JSONL round-trip: every error is reported at once, with its line."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from nemo_polar.rollout.spec import TaskSpec, TaskSpecError, dump_jsonl, load_jsonl


def _task(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "task_id": "t1",
        "instruction": "fix it",
        "num_samples": 2,
        "runtime": {"isolation": "none", "source": "example:median"},
        "agent": {"harness": "simulation", "options": {"run_s": 0.1}},
        "builder": "per_request",
        "evaluator": {"name": "swe_tests", "options": {"FAIL_TO_PASS": ["a::b"]}},
        "plans": [{"version": 1, "steps": []}, {"version": 1, "steps": [{"text": "x"}]}],
        "metadata": {"group_id": "g", "policy_version": 3, "rollout_step": 7, "instance_id": "i", "extra": 1},
        "session": {
            "prepare": [
                {"kind": "upload_file", "dest": "a.txt", "content": "hi"},
                {"kind": "exec", "command": "true", "retries": 2},
            ],
            "refresh_runtime": True,
            "post_run": [{"kind": "exec", "command": "ls"}],
        },
    }
    base.update(over)
    return base


def test_round_trip(tmp_path: Path) -> None:
    t = TaskSpec.model_validate(_task())
    assert t.builder.name == "per_request" and t.session.prepare[1].retries == 2
    assert t.metadata.model_extra == {"extra": 1}
    dump_jsonl([t, t.model_copy(update={"task_id": "t2"})], tmp_path / "tasks.jsonl")
    back = load_jsonl(tmp_path / "tasks.jsonl")
    assert back[0] == t and back[1].task_id == "t2"


def test_all_errors_reported_with_lines(tmp_path: Path) -> None:
    lines = [
        orjson.dumps(_task()).decode(),
        "{not json",
        orjson.dumps(_task(task_id="t2", num_samples=0, agent={})).decode(),
        "",
        orjson.dumps(_task()).decode(),  # duplicate id
        orjson.dumps(_task(task_id="t3", plans=[{"steps": []}])).decode(),
        orjson.dumps(_task(task_id="t4", session={"prepare": [{"kind": "upload_file", "dest": "x"}]})).decode(),
        orjson.dumps(_task(task_id="bad id!")).decode(),
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(TaskSpecError) as info:
        load_jsonl(path)
    errs = "\n".join(info.value.errors)
    for needle in (
        "line 2: invalid JSON",
        "line 3: num_samples",
        "line 3: agent.harness",
        "line 5: duplicate task_id 't1'",
        "line 6: <task>: Value error, plans has 1 entries for num_samples=2",
        "line 7: session.prepare.0.upload_file",
        "line 8: task_id",
    ):
        assert needle in errs, errs
