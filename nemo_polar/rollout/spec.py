# SPDX-License-Identifier: Apache-2.0
"""`TaskSpec`: one rollout task (docs/contracts.md), its session spec, and JSONL load/dump that reports every error.

A task asks for `num_samples` sessions of one agent on one runtime; each session runs INIT (runtime + ordered
prepare actions), RUN (the agent, optionally driven by a per-sample plan), POSTRUN (trajectory builder, evaluator,
post-run hooks). The option blocks of the agent, builder and evaluator are free-form here and checked against what
they name by `task_options` (at submit and in `parse_tasks`). This module only validates and serialises; it runs
nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nemo_polar.errors import InputProblems

__all__ = [
    "AgentSpec",
    "BuilderSpec",
    "EvaluatorSpec",
    "ExecAction",
    "PostRunHook",
    "PrepareAction",
    "RuntimeSpec",
    "SessionSpec",
    "TaskMetadata",
    "TaskSpec",
    "TaskSpecError",
    "UploadDirAction",
    "UploadFileAction",
    "dump_jsonl",
    "load_jsonl",
    "parse_tasks",
]

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,199}$")


class TaskSpecError(InputProblems):
    """One or more tasks are invalid; `errors` lists every problem (with its line number when loading JSONL)."""

    noun = "task spec error(s)"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------------------------------------
# session spec: prepare actions and post-run hooks


class _Retrying(_Model):
    retries: int = Field(default=0, ge=0, le=10, description="extra attempts after a failure")
    timeout_s: float = Field(default=120.0, gt=0)


class UploadFileAction(_Retrying):
    """Write a file into the session workdir, from inline `content` or a host path `src`."""

    kind: Literal["upload_file"]
    dest: str
    content: str | None = None
    src: str | None = None
    mode: int = 0o644

    @model_validator(mode="after")
    def _one_source(self) -> UploadFileAction:
        if (self.content is None) == (self.src is None):
            raise ValueError("upload_file needs exactly one of content / src")
        return self


class UploadDirAction(_Retrying):
    """Copy a host directory `src` into the session workdir at `dest`."""

    kind: Literal["upload_dir"]
    src: str
    dest: str = "."


class ExecAction(_Retrying):
    """Run a command in the session workdir; a non-zero exit status is a failure (retried, then fatal)."""

    kind: Literal["exec"]
    command: str | list[str]
    env: dict[str, str] = Field(default_factory=dict)


PrepareAction = Annotated[UploadFileAction | UploadDirAction | ExecAction, Field(discriminator="kind")]


class PostRunHook(_Model):
    """Runs in POSTRUN after evaluation: a command in the session runtime, or a dotted-path Python callable
    `hook(session_dir: Path, result: dict) -> None`. A failing hook is logged into the result, never fatal."""

    kind: Literal["exec", "python"] = "exec"
    command: str | list[str] | None = None
    target: str | None = None
    timeout_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _fields(self) -> PostRunHook:
        if self.kind == "exec" and self.command is None:
            raise ValueError("an exec hook needs command")
        if self.kind == "python" and not self.target:
            raise ValueError("a python hook needs target (a dotted path)")
        return self


class SessionSpec(_Model):
    """How each session of a task is staged: ordered prepare actions (INIT), refresh_runtime, post-run hooks."""

    prepare: list[PrepareAction] = Field(default_factory=list)
    refresh_runtime: bool = Field(
        default=False,
        description="evaluate on a fresh runtime, prewarmed while the agent runs (instead of the agent's)",
    )
    post_run: list[PostRunHook] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------
# runtime, agent, builder, evaluator


class RuntimeSpec(_Model):
    """Where a session runs. `source` is the task repo: a host directory or `example:<name>`."""

    kind: str = "local"
    isolation: Literal["sandbox", "none"] = "sandbox"
    source: str | None = None
    image: str | None = None
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class AgentSpec(_Model):
    """The agent: a harness adapter name (or dotted path), or `simulation` (a timed process, no model)."""

    harness: str
    model: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = Field(default=None, gt=0, description="agent budget, counted from RUN start")
    options: dict[str, Any] = Field(default_factory=dict)


class _Named(_Model):
    name: str
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class BuilderSpec(_Named):
    name: str = "prefix_merging"


class EvaluatorSpec(_Named):
    name: str = "session_completed"
    timeout_s: float = Field(default=600.0, gt=0)


class TaskMetadata(BaseModel):
    """Trainer bookkeeping carried through to every `SessionResult.metadata`; extra keys are kept."""

    model_config = ConfigDict(extra="allow", frozen=True)

    group_id: str | None = None
    policy_version: int | str | None = None
    rollout_step: int | None = None
    repo: str | None = None
    instance_id: str | None = None


# ---------------------------------------------------------------------------------------------------------------
# TaskSpec


class TaskSpec(_Model):
    task_id: str
    instruction: str
    num_samples: int = Field(default=1, ge=1, le=4096)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    agent: AgentSpec
    builder: BuilderSpec = Field(default_factory=BuilderSpec)
    evaluator: EvaluatorSpec = Field(default_factory=EvaluatorSpec)
    plans: list[dict[str, Any]] | None = None
    timeout_s: float = Field(default=1800.0, gt=0, description="session budget, counted from INIT start")
    priority: int = 0
    metadata: TaskMetadata = Field(default_factory=TaskMetadata)
    session: SessionSpec = Field(default_factory=SessionSpec)
    callback_url: str | None = None
    early_stop_after: int | None = Field(
        default=None, ge=1, description="stop the task after this many usable samples"
    )

    @field_validator("task_id")
    @classmethod
    def _task_id(cls, v: str) -> str:
        if not _ID_RE.match(v):
            raise ValueError("task_id must be 1-200 characters of [A-Za-z0-9._:@+-], starting alphanumeric")
        return v

    @field_validator("callback_url")
    @classmethod
    def _callback(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("callback_url must be an http(s) URL")
        return v

    @model_validator(mode="after")
    def _plans(self) -> TaskSpec:
        if self.plans is not None:
            if len(self.plans) != self.num_samples:
                raise ValueError(f"plans has {len(self.plans)} entries for num_samples={self.num_samples}")
            for i, p in enumerate(self.plans):
                if not isinstance(p.get("steps", []), list):
                    raise ValueError(f"plans[{i}].steps must be a list")
        if self.early_stop_after is not None and self.early_stop_after > self.num_samples:
            raise ValueError("early_stop_after cannot exceed num_samples")
        return self

    def plan_for(self, sample_index: int) -> dict[str, Any] | None:
        return None if self.plans is None else self.plans[sample_index]

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json", exclude_none=True))


def _format(exc: ValidationError) -> list[str]:
    return [f"{'.'.join(str(p) for p in e['loc']) or '<task>'}: {e['msg']}" for e in exc.errors()]


def parse_tasks(items: Iterable[tuple[str, Any]]) -> list[TaskSpec]:
    """Validate `(where, data)` pairs, option blocks included (`task_options`); raise `TaskSpecError` with every
    error (and duplicate ids) at once."""
    from nemo_polar.rollout.task_options import option_errors

    tasks: list[TaskSpec] = []
    errors: list[str] = []
    seen: dict[str, str] = {}
    for where, data in items:
        try:
            task = TaskSpec.model_validate(data)
        except ValidationError as exc:
            errors.extend(f"{where}: {msg}" for msg in _format(exc))
            continue
        if bad_options := option_errors(task):
            errors.extend(f"{where}: {msg}" for msg in bad_options)
            continue
        if task.task_id in seen:
            errors.append(f"{where}: duplicate task_id {task.task_id!r} (first at {seen[task.task_id]})")
            continue
        seen[task.task_id] = where
        tasks.append(task)
    if errors:
        raise TaskSpecError(errors)
    return tasks


def load_jsonl(path: str | Path) -> list[TaskSpec]:
    """Load one task per non-blank line; report every malformed line and invalid field together."""
    items: list[tuple[str, Any]] = []
    bad: list[str] = []
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append((f"line {n}", orjson.loads(line)))
        except orjson.JSONDecodeError as exc:
            bad.append(f"line {n}: invalid JSON ({exc})")
    try:
        tasks = parse_tasks(items)
    except TaskSpecError as exc:
        raise TaskSpecError(bad + exc.errors) from None
    if bad:
        raise TaskSpecError(bad)
    return tasks


def dump_jsonl(tasks: Iterable[TaskSpec], path: str | Path) -> None:
    Path(path).write_bytes(b"".join(t.to_json() + b"\n" for t in tasks))
