# SPDX-License-Identifier: Apache-2.0
"""The shipped `pybugs` task set: a sound catalog (pinned PyPI releases, issue-style statements that do not give
the fix away), and build-time validation on the real runtimes — gold patch resolves, empty patch does not,
PASS_TO_PASS passes on gold — in the bubblewrap sandbox and in containers, through the evaluator's own protocol.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_polar.rollout.spec import load_jsonl
from nemo_polar.runtime.engines import Engine
from nemo_polar.runtime.images import ensure_task_image
from nemo_polar.runtime.sandbox import bwrap_available
from nemo_polar.tasks.pybugs import build_tree, gold_patch, load_catalog, select
from nemo_polar.tasks.validate import validate

REPO = Path(__file__).resolve().parents[2]


def test_catalog_is_real_pinned_and_honest() -> None:
    bugs = load_catalog()
    assert len(bugs) >= 10
    assert len({b.project for b in bugs}) == len(bugs), "one task per project"
    for b in bugs:
        assert b.url.startswith("https://files.pythonhosted.org/") and b.url.endswith(".tar.gz")
        assert len(b.sha256) == 64
        assert b.fail_to_pass and b.pass_to_pass and not set(b.fail_to_pass) & set(b.pass_to_pass)
        assert b.old != b.new and b.old.strip() not in b.problem_statement  # the symptom, not the fix


def test_tree_is_deterministic_and_gold_patch_reverses_the_bug() -> None:
    (bug,) = select(["cachetools-lru-order"])
    tree, base = build_tree(bug)
    assert (tree / ".git").is_dir() and len(base) == 40
    assert bug.new in (tree / bug.path).read_text()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    assert head == base
    patch = gold_patch(bug, tree)
    assert patch.startswith(f"diff --git a/{bug.path} b/{bug.path}\n")
    check = subprocess.run(["git", "apply", "--check", "-"], cwd=tree, input=patch, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.skipif(bwrap_available() is None, reason="bubblewrap is not installed (make test installs it)")
@pytest.mark.parametrize("name", ["inflection-ordinal", "semver-prerelease-numeric", "isodate-leap-year"])
def test_validates_in_the_bubblewrap_runtime(name: str) -> None:
    (bug,) = select([name])
    v = asyncio.run(validate(bug, "local"))
    assert v.ok, v
    assert v.f2p_failing_before == len(bug.fail_to_pass) and v.f2p_failing_after == 0


@pytest.mark.parametrize("name", ["toolz-partition-all-tail", "webcolors-short-hex"])
def test_validates_in_a_container(container_engine: Engine, base_image: str, name: str) -> None:
    (bug,) = select([name])
    ensure_task_image(container_engine, bug.name, build_tree(bug)[0], base_image)
    v = asyncio.run(validate(bug, container_engine.kind))
    assert v.ok, v


def test_polar_data_pybugs_lists_and_writes_tasks(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "nemo_polar.cli", "data", "pybugs"]
    listed = subprocess.run([*cli, "list"], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert all(b.name in listed for b in load_catalog())
    out = subprocess.run(
        [*cli, "tasks", "--runtime", "docker", "--only", "six-add-metaclass-slots", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    (task,) = load_jsonl(tmp_path / "tasks.jsonl")
    assert task.runtime.kind == "docker" and (task.runtime.image or "").startswith("polar-task-six-add-metaclass")
    assert task.evaluator.options["base_commit"] == task.metadata.model_dump()["base_commit"]
    bad = subprocess.run([*cli, "tasks", "--only", "no-such-task", "--out", str(tmp_path)], capture_output=True)
    assert bad.returncode == 2 and b"unknown pybugs task" in bad.stderr
    assert json.loads((tmp_path / "tasks.jsonl").read_text().splitlines()[0])["task_id"].startswith("pybugs__")
