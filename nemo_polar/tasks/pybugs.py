# SPDX-License-Identifier: Apache-2.0
"""`pybugs`: SWE-style tasks from real open-source Python projects, with a bug injected in the SWE-smith manner.

Each entry of `pybugs.json` (package data) pins one project release on PyPI (sdist URL and sha256: the released
sources with their own tests) and one mutation of one function (`bug`: exact `old` → `new` text in one file, so
some of the project's own tests fail). `FAIL_TO_PASS` are the project tests the bug breaks, `PASS_TO_PASS` a
sample of the ones it leaves passing (both measured on the pristine and mutated release); `problem_statement` is
written like an issue report: the symptom, never the fix. `test_command` runs the project's suite with only
pytest (some need `PYTHONPATH=src`).

`build_tree` downloads (cached in `<cache>/downloads/sdists`, sha256 checked), extracts, injects the bug and
commits it with fixed author and dates (a deterministic `base_commit`) into `<cache>/tasks/pybugs/`; that tree is
the task's repository for the bubblewrap runtime (`source`) and is what a task image copies to `/testbed`.
`gold_patch` is the bug reversed; `task_specs` makes the TaskSpecs (the `swe_tests` evaluator on a fresh runtime,
fix / noop plans for tests and the demo). Validation lives in `nemo_polar.tasks.validate`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from nemo_polar.errors import PolarError
from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.runtime.sandbox import host_cache_root

__all__ = [
    "PyBug",
    "PyBugError",
    "build_tree",
    "fetch_sdist",
    "fix_plan",
    "gold_patch",
    "image_tag",
    "load_catalog",
    "task_specs",
]

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "polar",
    "GIT_AUTHOR_EMAIL": "polar@localhost",
    "GIT_COMMITTER_NAME": "polar",
    "GIT_COMMITTER_EMAIL": "polar@localhost",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
}


class PyBugError(PolarError, RuntimeError):
    """A task could not be built (download failed, checksum mismatch, the bug does not apply)."""


@dataclass(frozen=True, slots=True)
class PyBug:
    name: str
    project: str
    version: str
    url: str
    sha256: str
    root: str  # the sdist's top-level directory
    path: str  # the file the bug is injected into
    old: str  # the released text
    new: str  # the injected bug
    test_command: str
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]

    @property
    def instance_id(self) -> str:
        return f"pybugs__{self.name}"

    def recipe_hash(self) -> str:
        return hashlib.sha256(json.dumps([self.sha256, self.path, self.old, self.new]).encode()).hexdigest()[:12]


@cache
def load_catalog() -> tuple[PyBug, ...]:
    """Every shipped task, in catalog order."""
    rows = json.loads(resources.files(__name__.rsplit(".", 1)[0]).joinpath("pybugs.json").read_text())
    return tuple(
        PyBug(
            name=r["name"],
            project=r["project"],
            version=r["version"],
            url=r["url"],
            sha256=r["sha256"],
            root=r["root"],
            path=r["bug"]["path"],
            old=r["bug"]["old"],
            new=r["bug"]["new"],
            test_command=r["test_command"],
            problem_statement=r["problem_statement"],
            fail_to_pass=tuple(r["FAIL_TO_PASS"]),
            pass_to_pass=tuple(r["PASS_TO_PASS"]),
        )
        for r in rows
    )


def select(names: Sequence[str] | None = None) -> list[PyBug]:
    """The named tasks (all when `names` is empty); `KeyError` naming the unknown ones."""
    catalog = {b.name: b for b in load_catalog()}
    if not names:
        return list(catalog.values())
    unknown = [n for n in names if n not in catalog]
    if unknown:
        raise KeyError(f"unknown pybugs task(s) {unknown}; known: {sorted(catalog)}")
    return [catalog[n] for n in names]


def fetch_sdist(bug: PyBug) -> Path:
    """The release's sdist, downloaded once into the cache and checked against the pinned sha256."""
    dest = host_cache_root() / "downloads" / "sdists" / bug.url.rsplit("/", 1)[-1]
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(f".tmp{os.getpid()}")
        try:
            with urllib.request.urlopen(bug.url, timeout=120) as resp, open(tmp, "wb") as out:
                shutil.copyfileobj(resp, out)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise PyBugError(f"cannot download {bug.url}: {exc}") from exc
        tmp.replace(dest)
    digest = hashlib.sha256(dest.read_bytes()).hexdigest()
    if digest != bug.sha256:
        dest.unlink()
        raise PyBugError(f"{dest.name}: sha256 {digest} does not match the pinned {bug.sha256} (removed)")
    return dest


def _git(tree: Path, *args: str) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tree), **_GIT_ENV}
    proc = subprocess.run(["git", *args], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PyBugError(f"git {args[0]} failed in {tree}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def build_tree(bug: PyBug) -> tuple[Path, str]:
    """(repository tree with the bug committed, base commit), built once per recipe and cached."""
    root = host_cache_root() / "tasks" / "pybugs" / f"{bug.name}-{bug.recipe_hash()}"
    done = root / "base_commit"
    if done.exists():
        return root / "repo", done.read_text().strip()
    sdist = fetch_sdist(bug)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{bug.name}-", dir=root.parent))
    try:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp / "x", filter="data")
        src = tmp / "x" / bug.root
        target = src / bug.path
        text = target.read_text(encoding="utf-8")
        if text.count(bug.old) != 1:
            raise PyBugError(f"{bug.name}: the bug's `old` text occurs {text.count(bug.old)} times in {bug.path}")
        target.write_text(text.replace(bug.old, bug.new), encoding="utf-8")
        (src / ".gitignore").write_text("__pycache__/\n*.pyc\n.pytest_cache/\n")
        _git(src, "init", "-q", "-b", "main")
        _git(src, "add", "-A")
        _git(src, "commit", "-q", "-m", f"{bug.project} {bug.version}")
        base = _git(src, "rev-parse", "HEAD").strip()
        src.rename(tmp / "repo")
        (tmp / "base_commit").write_text(base + "\n")
        shutil.rmtree(tmp / "x")
        try:
            tmp.rename(root)
        except OSError:  # built concurrently: the other copy is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root / "repo", done.read_text().strip()


def gold_patch(bug: PyBug, tree: Path | None = None) -> str:
    """The fix: the injected bug reversed, as a git-style unified diff."""
    tree = tree or build_tree(bug)[0]
    buggy = (tree / bug.path).read_text(encoding="utf-8")
    fixed = buggy.replace(bug.new, bug.old, 1)
    lines = difflib.unified_diff(
        buggy.splitlines(keepends=True), fixed.splitlines(keepends=True), f"a/{bug.path}", f"b/{bug.path}"
    )
    return f"diff --git a/{bug.path} b/{bug.path}\n" + "".join(lines)


def image_tag(bug: PyBug) -> str:
    """The task image's tag (content-addressed: `polar image build --tasks pybugs` builds exactly this one)."""
    from nemo_polar.runtime.images import base_tag, task_tag

    return task_tag(bug.name, build_tree(bug)[0], base_tag())


def fix_plan(bug: PyBug) -> dict[str, Any]:
    """A harness-neutral plan (docs/contracts.md) that looks at the file, undoes the bug and runs the failing
    tests: the known-good agent of tests and the demo."""
    first = bug.fail_to_pass[0]
    return {
        "version": 1,
        "steps": [
            {"shell": f"grep -n '' {bug.path} | head -5"},
            {"edit": {"path": bug.path, "old": bug.new, "new": bug.old}},
            {"shell": f"{bug.test_command} -q {json.dumps(first)}"},
            {"text": "Fixed."},
        ],
        "side": "live",
    }


NOOP_PLAN: dict[str, Any] = {
    "version": 1,
    "steps": [{"text": "I read the report; I am not changing anything."}],
    "side": "live",
}


def task_specs(
    bugs: Sequence[PyBug],
    *,
    runtime: str = "local",
    images: Mapping[str, str] | None = None,
    harness: str = "qwen_code",
    num_samples: int = 1,
    plans: Sequence[str] = (),
    timeout_s: float = 1800.0,
) -> list[TaskSpec]:
    """TaskSpecs for `bugs`: `runtime` `local` (bubblewrap over the cached tree) or `docker` / `podman` (the task
    image `images[name]`, by default its content-addressed tag `image_tag(bug)`: a missing image is then a per-task
    setup error naming `polar image build`); `plans` per sample from `fix` / `noop`."""
    out = []
    for bug in bugs:
        tree, base = build_tree(bug)
        if runtime == "local":
            rt: dict[str, Any] = {"kind": "local", "isolation": "sandbox", "source": str(tree)}
        else:
            rt = {"kind": runtime, "image": (images or {}).get(bug.name) or image_tag(bug)}
        chosen = [fix_plan(bug) if p == "fix" else NOOP_PLAN for p in plans] or None
        out.append(
            TaskSpec.model_validate(
                {
                    "task_id": bug.instance_id,
                    "instruction": bug.problem_statement,
                    "num_samples": len(chosen) if chosen else num_samples,
                    "runtime": rt,
                    "agent": {"harness": harness},
                    "evaluator": {
                        "name": "swe_tests",
                        "options": {
                            "FAIL_TO_PASS": list(bug.fail_to_pass),
                            "PASS_TO_PASS": list(bug.pass_to_pass),
                            "test_command": bug.test_command,
                            "base_commit": base,
                        },
                    },
                    "plans": chosen,
                    "timeout_s": timeout_s,
                    "metadata": {
                        "group_id": bug.instance_id,
                        "instance_id": bug.instance_id,
                        "repo": f"pypi:{bug.project}=={bug.version}",
                        "base_commit": base,
                    },
                    "session": {"refresh_runtime": True},
                }
            )
        )
    return out
