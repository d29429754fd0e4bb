# SPDX-License-Identifier: Apache-2.0
"""The five shipped example tasks: tiny SWE-style Python repos, each with a real bug.

Each task is one JSON file next to this module (package data): `problem_statement`, `files` (the repo:
relative path -> text), `FAIL_TO_PASS` / `PASS_TO_PASS` (pytest node ids, SWE-bench semantics) and two plans
in the plan format of docs/contracts.md — `fix_plan` (harness-neutral `shell` / `edit` / `write` steps, then a text answer) and
`noop_plan` (a text answer only). The repos use only the standard library (pytest runs their tests); each has a
`pytest.ini`, so pytest's rootdir is the repo even when the run directory lies inside another project.

`tiny_agent.py` beside them is a minimal agent of one's own for the `shell` harness; `tiny_agent_command()` is its
command line.

This module loads and materialises the data; it runs nothing.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["TINY_AGENT", "ExampleTask", "load", "materialize", "names", "tiny_agent_command"]

# the shipped agent of one's own (a script, not imported here: it needs the `openai` package)
TINY_AGENT = Path(__file__).with_name("tiny_agent.py")


@dataclass(frozen=True, slots=True)
class ExampleTask:
    name: str
    problem_statement: str
    files: dict[str, str]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    fix_plan: dict[str, Any]
    noop_plan: dict[str, Any]

    @property
    def instance_id(self) -> str:
        return f"polar-example__{self.name}"


def names() -> list[str]:
    """The example task names, sorted."""
    root = resources.files(__name__)
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


@cache
def load(name: str) -> ExampleTask:
    """One example task by name; `KeyError` for an unknown name."""
    if name not in names():
        raise KeyError(f"unknown example task {name!r}; known: {names()}")
    data = json.loads(resources.files(__name__).joinpath(f"{name}.json").read_text())
    return ExampleTask(
        name=data["name"],
        problem_statement=data["problem_statement"],
        files=dict(data["files"]),
        fail_to_pass=tuple(data["FAIL_TO_PASS"]),
        pass_to_pass=tuple(data["PASS_TO_PASS"]),
        fix_plan=data["fix_plan"],
        noop_plan=data["noop_plan"],
    )


def materialize(name: str, dest: str | Path) -> Path:
    """Write the task's repo into `dest` (created if needed) and return it."""
    dest = Path(dest)
    for rel, text in load(name).files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return dest


def tiny_agent_command(python: str | None = None) -> str:
    """The `shell` harness's `command_line` that runs `tiny_agent.py` with `python` (default: this interpreter,
    which the bubblewrap and container runtimes show inside at its host path)."""
    return f"{shlex.quote(python or sys.executable)} {shlex.quote(str(TINY_AGENT))} {{instruction}}"
