# SPDX-License-Identifier: Apache-2.0
"""SWE-Gym / SkyRL-v0-293-data rows → NeMo Gym rows for `polar_swe` and Polar `TaskSpec`s (docs/contracts.md).

Input rows follow SWE-Gym's schema (SWE-bench's): `instance_id`, `repo`, `base_commit`, `problem_statement`,
`FAIL_TO_PASS`, `PASS_TO_PASS` (lists of pytest node ids, or the JSON-encoded strings SWE-bench ships), `image`
(the instance's docker image), plus optional `version`, `environment_setup_commit`, `hints_text`, `created_at`,
`patch`, `test_patch`; other keys (SkyRL's `data_source`, `prompt`, ...) are ignored. A row without `image`
gets SWE-Gym's image naming (`xingyaoww/sweb.eval.x86_64.<owner>_s_<repo>-<number>`).

Outputs, one per input row:
- a Gym row (the `polar_swe` TaskData of `environments/resources_servers/polar_swe/task_data.py`): the prompt in
  `responses_create_params.input`, the verifier fields, and the `runtime` the agent's session runs in;
- a `TaskSpec`: the same runtime (docker, or apptainer with a `docker://` image), the `swe_tests` evaluator on a
  fresh runtime, metadata (`group_id` = instance id, repo, base commit, workdir `/testbed`).

`task_from_gym_row` is the inverse direction the `polar_agent` uses: one Gym row (plus the agent's configured
harness and builder) → the one-sample TaskSpec it submits. Pure functions; no network, no NeMo Gym import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from nemo_polar.errors import InputProblems
from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.rundir import RunDir

__all__ = [
    "DEFAULT_IMAGE_PREFIX",
    "SWE_GYM_WORKDIR",
    "SweGymError",
    "SweGymRow",
    "convert_file",
    "convert_row",
    "gym_row",
    "instruction_of",
    "task_from_gym_row",
    "task_spec",
]

DEFAULT_IMAGE_PREFIX = "xingyaoww/sweb.eval.x86_64."
# the Gym agent server every row is dispatched to (`polar_agent` in environments/.../polar_swe/configs)
DEFAULT_AGENT = "polar_agent"
SWE_GYM_WORKDIR = "/testbed"  # where SWE-Gym / SWE-bench images keep the repository
RuntimeKind = Literal["docker", "apptainer"]


class SweGymError(InputProblems):
    """Input rows are invalid; `errors` lists every problem with its line number."""

    noun = "invalid SWE-Gym row(s)"


class SweGymRow(BaseModel):
    """One SWE-Gym instance (the fields this converter reads; unknown keys are accepted and ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1, description="owner/name on GitHub")
    base_commit: str = Field(min_length=7)
    problem_statement: str = Field(min_length=1)
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    image: str | None = None
    version: str | None = None
    environment_setup_commit: str | None = None
    hints_text: str | None = None
    created_at: str | None = None
    patch: str | None = None
    test_patch: str | None = None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        # SWE-bench ships these as JSON-encoded strings; SWE-Gym as lists
        if isinstance(v, str):
            try:
                return json.loads(v) if v.strip() else []
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a list nor a JSON-encoded list: {exc}") from exc
        return v

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if v.count("/") != 1:
            raise ValueError("repo must be owner/name")
        return v

    def image_name(self, prefix: str = DEFAULT_IMAGE_PREFIX) -> str:
        if self.image:
            return self.image
        return f"{prefix}{self.instance_id.replace('__', '_s_')}".lower()


def _runtime(row: SweGymRow, kind: RuntimeKind, image_prefix: str) -> dict[str, Any]:
    image = row.image_name(image_prefix)
    if kind == "apptainer" and "://" not in image:
        image = f"docker://{image}"
    return {"kind": kind, "isolation": "sandbox", "image": image}


def gym_row(
    row: SweGymRow,
    *,
    runtime: RuntimeKind = "docker",
    image_prefix: str = DEFAULT_IMAGE_PREFIX,
    agent: str = DEFAULT_AGENT,
) -> dict[str, Any]:
    """The `polar_swe` Gym row for one instance (schema: `polar_swe/task_data.py`)."""
    out: dict[str, Any] = {
        "responses_create_params": {"input": [{"role": "user", "content": row.problem_statement}]},
        # NeMo RL's Gym rollout dispatches each row to the agent server named here (`row["agent_ref"]["name"]`)
        "agent_ref": {"name": agent},
        "instance_id": row.instance_id,
        "repo": row.repo,
        "base_commit": row.base_commit,
        "image": row.image_name(image_prefix),
        "FAIL_TO_PASS": list(row.FAIL_TO_PASS),
        "PASS_TO_PASS": list(row.PASS_TO_PASS),
        "runtime": _runtime(row, runtime, image_prefix),
        "workdir": SWE_GYM_WORKDIR,
    }
    if row.version is not None:
        out["version"] = row.version
    return out


def task_spec(
    row: SweGymRow,
    *,
    runtime: RuntimeKind = "docker",
    harness: str = "qwen_code",
    builder: str = "prefix_merging",
    num_samples: int = 1,
    timeout_s: float = 1800.0,
    image_prefix: str = DEFAULT_IMAGE_PREFIX,
) -> TaskSpec:
    """The Polar TaskSpec for one instance: `swe_tests` on a fresh runtime, grouped by instance id."""
    return TaskSpec.model_validate(
        {
            "task_id": row.instance_id,
            "instruction": row.problem_statement,
            "num_samples": num_samples,
            "runtime": _runtime(row, runtime, image_prefix),
            "agent": {"harness": harness},
            "builder": builder,
            "evaluator": {
                "name": "swe_tests",
                # SWE-bench's protocol: base_commit checked out, test files reset, test_patch applied, then the tests
                "options": {
                    "FAIL_TO_PASS": list(row.FAIL_TO_PASS),
                    "PASS_TO_PASS": list(row.PASS_TO_PASS),
                    "base_commit": row.base_commit,
                    **({"test_patch": row.test_patch} if row.test_patch else {}),
                },
            },
            "timeout_s": timeout_s,
            "metadata": {
                "group_id": row.instance_id,
                "instance_id": row.instance_id,
                "repo": row.repo,
                "base_commit": row.base_commit,
                "workdir": SWE_GYM_WORKDIR,
                **({"version": row.version} if row.version is not None else {}),
            },
            "session": {"refresh_runtime": True},
        }
    )


def convert_row(data: Mapping[str, Any], **options: Any) -> tuple[dict[str, Any], TaskSpec]:
    """(Gym row, TaskSpec) for one raw SWE-Gym row; `ValidationError` when the row is invalid."""
    row = SweGymRow.model_validate(data)
    gym_opts = {k: v for k, v in options.items() if k in ("runtime", "image_prefix", "agent")}
    task_opts = {k: v for k, v in options.items() if k != "agent"}
    return gym_row(row, **gym_opts), task_spec(row, **task_opts)


def convert_file(path: str | Path, out_dir: str | Path, **options: Any) -> tuple[list[dict[str, Any]], list[TaskSpec]]:
    """Convert a JSONL file; write `<out_dir>/gym.jsonl` and `<out_dir>/tasks.jsonl`. Reports every bad row."""
    gym_rows: list[dict[str, Any]] = []
    tasks: list[TaskSpec] = []
    errors: list[str] = []
    seen: set[str] = set()
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = orjson.loads(line)
            if not isinstance(data, dict):
                raise ValueError("a row must be a JSON object")
            g, t = convert_row(data, **options)
        except orjson.JSONDecodeError as exc:
            errors.append(f"line {n}: invalid JSON ({exc})")
            continue
        except ValidationError as exc:
            errors.extend(f"line {n}: {'.'.join(map(str, e['loc'])) or '<row>'}: {e['msg']}" for e in exc.errors())
            continue
        except ValueError as exc:
            errors.append(f"line {n}: {exc}")
            continue
        if t.task_id in seen:
            errors.append(f"line {n}: duplicate instance_id {t.task_id!r}")
            continue
        seen.add(t.task_id)
        gym_rows.append(g)
        tasks.append(t)
    if errors:
        raise SweGymError(errors)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gym.jsonl").write_bytes(b"".join(orjson.dumps(g) + b"\n" for g in gym_rows))
    RunDir(out).tasks.write_bytes(b"".join(t.to_json() + b"\n" for t in tasks))
    return gym_rows, tasks


# ---------------------------------------------------------------------------------------------------------------
# Gym row → TaskSpec (the polar_agent's direction)


def instruction_of(responses_create_params: Mapping[str, Any]) -> str:
    """The task prompt in a Responses-API `input`: a string, or the text of its user messages, in order."""
    inp = responses_create_params.get("input")
    if isinstance(inp, str):
        return inp
    parts: list[str] = []
    for item in inp if isinstance(inp, list) else []:
        if not isinstance(item, Mapping) or item.get("role", "user") != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                str(c.get("text", "")) for c in content if isinstance(c, Mapping) and c.get("type") == "input_text"
            )
    return "\n\n".join(p for p in parts if p)


def task_from_gym_row(
    row: Mapping[str, Any],
    *,
    task_id: str,
    harness: str,
    builder: str = "prefix_merging",
    model: str | None = None,
    sampling: Mapping[str, Any] | None = None,
    agent_options: Mapping[str, Any] | None = None,
    agent_timeout_s: float | None = None,
    timeout_s: float = 1800.0,
    builder_options: Mapping[str, Any] | None = None,
    evaluator_timeout_s: float = 600.0,
    metadata: Mapping[str, Any] | None = None,
) -> TaskSpec:
    """The one-sample TaskSpec for a `polar_swe` Gym row. `row["plan"]` (optional) drives the harness (tests)."""
    instruction = instruction_of(row.get("responses_create_params") or {})
    if not instruction:
        raise ValueError("the row has no user prompt in responses_create_params.input")
    instance_id = str(row.get("instance_id") or task_id)
    plan = row.get("plan")
    extra_meta = {k: row[k] for k in ("repo", "base_commit", "workdir") if row.get(k) is not None}
    return TaskSpec.model_validate(
        {
            "task_id": task_id,
            "instruction": instruction,
            "num_samples": 1,
            "runtime": dict(row.get("runtime") or {}),
            "agent": {
                "harness": harness,
                "model": model,
                "sampling": dict(sampling or {}),
                "timeout_s": agent_timeout_s,
                "options": dict(agent_options or {}),
            },
            "builder": {"name": builder, "options": dict(builder_options or {})},
            "evaluator": {
                "name": "swe_tests",
                "timeout_s": evaluator_timeout_s,
                "options": {
                    "FAIL_TO_PASS": list(row.get("FAIL_TO_PASS") or []),
                    "PASS_TO_PASS": list(row.get("PASS_TO_PASS") or []),
                },
            },
            "plans": [dict(plan)] if isinstance(plan, Mapping) else None,
            "timeout_s": timeout_s,
            "metadata": {"group_id": instance_id, "instance_id": instance_id, **extra_meta, **dict(metadata or {})},
            "session": {"refresh_runtime": True},
        }
    )
