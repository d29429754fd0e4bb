# SPDX-License-Identifier: Apache-2.0
"""`polar data swe-gym`: the committed sample (`data/swe_gym_sample.jsonl`, five rows written by hand in SWE-Gym's
schema — they name real repositories but are not copies of real instances) converts to Gym rows for `polar_swe`
and TaskSpecs, and every output field is checked against the input row. Runs the real CLI entry point."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from nemo_polar.data import SweGymError, convert_file, task_from_gym_row
from nemo_polar.data import cli as data_cli
from nemo_polar.rollout import TaskSpec, load_jsonl

SAMPLE = Path(__file__).parent / "data" / "swe_gym_sample.jsonl"


def main(argv: list[str]) -> int:
    """`polar ARGV` through the `register(subparsers)` hook `nemo_polar.cli` loads (also before it lists us)."""
    parser = argparse.ArgumentParser(prog="polar")
    data_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def _rows() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]


def _as_list(v: object) -> list[str]:
    return json.loads(v) if isinstance(v, str) else list(v)  # type: ignore[arg-type]


def test_cli_converts_every_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    rc = main(["data", "swe-gym", str(SAMPLE), "--out", str(out), "--harness", "codex", "--num-samples", "4"])
    assert rc == 0, capsys.readouterr().err
    src = _rows()
    gym = [json.loads(line) for line in (out / "gym.jsonl").read_text().splitlines()]
    tasks = load_jsonl(out / "tasks.jsonl")  # the rollout service's own loader validates them
    assert len(src) == len(gym) == len(tasks) == 5
    for s, g, t in zip(src, gym, tasks, strict=True):
        f2p, p2p = _as_list(s["FAIL_TO_PASS"]), _as_list(s["PASS_TO_PASS"])
        image = s.get("image") or "xingyaoww/sweb.eval.x86_64." + s["instance_id"].replace("__", "_s_").lower()
        # Gym row (polar_swe TaskData)
        assert g["responses_create_params"] == {"input": [{"role": "user", "content": s["problem_statement"]}]}
        assert g["instance_id"] == s["instance_id"]
        assert g["repo"] == s["repo"] and g["base_commit"] == s["base_commit"]
        assert g["FAIL_TO_PASS"] == f2p and g["PASS_TO_PASS"] == p2p
        assert g["image"] == image
        assert g["runtime"] == {"kind": "docker", "isolation": "sandbox", "image": image}
        assert g["workdir"] == "/testbed"
        assert g["version"] == s["version"]
        assert "data_source" not in g and "patch" not in g and "test_patch" not in g  # never leak the gold patch
        # TaskSpec
        assert t.task_id == s["instance_id"]
        assert t.instruction == s["problem_statement"]
        assert t.num_samples == 4
        assert t.runtime.kind == "docker" and t.runtime.image == image and t.runtime.isolation == "sandbox"
        assert t.agent.harness == "codex"
        assert t.builder.name == "prefix_merging"
        assert t.evaluator.name == "swe_tests"
        want = {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "base_commit": s["base_commit"]}
        if s.get("test_patch"):
            want["test_patch"] = s["test_patch"]  # server side only: the Gym row above never carries it
        assert t.evaluator.options == want
        assert t.session.refresh_runtime is True
        md = t.metadata.model_dump()
        assert md["group_id"] == md["instance_id"] == s["instance_id"]
        assert md["repo"] == s["repo"] and md["base_commit"] == s["base_commit"] and md["workdir"] == "/testbed"
    # the SWE-bench JSON-string form and the missing-image fallback are both in the sample
    assert any(isinstance(s["FAIL_TO_PASS"], str) for s in src)
    assert any("image" not in s for s in src)
    assert "5 rows" in capsys.readouterr().out


def test_apptainer_runtime_uses_docker_uri(tmp_path: Path) -> None:
    rows, tasks = convert_file(SAMPLE, tmp_path, runtime="apptainer")
    for g, t in zip(rows, tasks, strict=True):
        assert g["runtime"]["kind"] == t.runtime.kind == "apptainer"
        assert t.runtime.image is not None and t.runtime.image == "docker://" + g["image"]


def test_every_bad_row_is_reported(tmp_path: Path) -> None:
    good = SAMPLE.read_text().splitlines()[0]
    bad = tmp_path / "bad.jsonl"
    missing = json.loads(good)
    del missing["problem_statement"]
    bad.write_text(
        "\n".join([good, "{not json", json.dumps(missing), good, json.dumps({**json.loads(good), "repo": "x"})]) + "\n"
    )
    with pytest.raises(SweGymError) as err:
        convert_file(bad, tmp_path / "o")
    text = "\n".join(err.value.errors)
    assert "line 2: invalid JSON" in text
    assert "line 3: problem_statement" in text
    assert "line 4: duplicate instance_id" in text
    assert "line 5: repo" in text
    assert not (tmp_path / "o").exists()  # nothing half-written
    assert main(["data", "swe-gym", str(bad), "--out", str(tmp_path / "o")]) == 1


def test_gym_row_back_to_a_one_sample_task(tmp_path: Path) -> None:
    rows, _ = convert_file(SAMPLE, tmp_path)
    plan = {"version": 1, "steps": [{"text": "done"}]}
    row = {**rows[0], "plan": plan}
    t = task_from_gym_row(row, task_id="getmoto__moto-6212.r0", harness="pi", builder="per_request", model="m")
    assert isinstance(t, TaskSpec) and t.num_samples == 1 and t.plans == [plan]
    assert t.instruction == rows[0]["responses_create_params"]["input"][0]["content"]
    assert t.runtime.image == rows[0]["image"] and t.agent.harness == "pi" and t.agent.model == "m"
    assert t.builder.name == "per_request"
    assert t.evaluator.options["FAIL_TO_PASS"] == rows[0]["FAIL_TO_PASS"]
    assert t.metadata.model_dump()["group_id"] == rows[0]["instance_id"]
    with pytest.raises(ValueError, match="no user prompt"):
        task_from_gym_row({**rows[0], "responses_create_params": {"input": []}}, task_id="x", harness="pi")
