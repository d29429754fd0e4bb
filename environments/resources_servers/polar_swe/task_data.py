# SPDX-License-Identifier: Apache-2.0
"""Task-data schema of `polar_swe` rows (NeMo Gym 0.7 convention: a `TaskData` model, `extra="allow"`).

One row is one SWE task: the prompt in `responses_create_params` (framework-owned, not part of this model), the
runtime the agent's session runs in, and what `swe_tests` verifies. `polar data swe-gym` writes such rows from
SWE-Gym instances; `data/example.jsonl` holds the five example tasks shipped with nemo-polar. Standard library and
pydantic only, as Gym requires of `task_data.py`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class TaskData(BaseModel):
    model_config = ConfigDict(extra="allow")

    instance_id: str = Field(json_schema_extra={"consumed_by": ["verify", "metrics", "provenance"]})
    runtime: dict[str, Any] = Field(
        description="Polar RuntimeSpec: {kind, isolation, source | image, ...}",
        json_schema_extra={"consumed_by": ["verify", "prompt"]},
    )
    FAIL_TO_PASS: list[str] = Field(min_length=1, json_schema_extra={"consumed_by": ["verify"]})
    PASS_TO_PASS: list[str] = Field(default_factory=list, json_schema_extra={"consumed_by": ["verify"]})
    repo: str | None = Field(default=None, json_schema_extra={"consumed_by": ["provenance"]})
    base_commit: str | None = Field(default=None, json_schema_extra={"consumed_by": ["provenance"]})
    image: str | None = Field(default=None, json_schema_extra={"consumed_by": ["provenance"]})
    workdir: str | None = Field(default=None, json_schema_extra={"consumed_by": ["provenance"]})
    plan: dict[str, Any] | None = Field(
        default=None,
        description="optional plan (docs/contracts.md) that drives the harness (tests and demos; never in training data)",
    )
