# SPDX-License-Identifier: Apache-2.0
"""Evaluators on the shipped example tasks: the fix plan scores 1.0, no diff 0.0, a broken diff 0.0 with a
failure kind, and a crashing / hanging / missing evaluator is contained as a masked `EvalResult`.

The agent's diff is produced by applying the example's `fix_plan` steps directly (the simulation's plan
applier) to a real local runtime; the evaluator then runs the real pytest on a fresh runtime.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nemo_polar import examples
from nemo_polar.evaluators import EvalContext, run_evaluator
from nemo_polar.evaluators.swe_tests import parse_pytest_summary
from nemo_polar.rollout.runtime import LocalRuntime, Runtime
from nemo_polar.rollout.simulation import apply_steps
from nemo_polar.rollout.spec import RuntimeSpec
from nemo_polar.types import EvalResult

ALL = examples.names()


def test_exactly_five_examples_each_with_a_real_bug() -> None:
    assert len(ALL) == 5
    for name in ALL:
        t = examples.load(name)
        assert t.fail_to_pass and t.pass_to_pass and t.problem_statement
        assert t.fix_plan["steps"][-1] == {"text": "done"}
        assert [s for s in t.noop_plan["steps"] if "text" not in s] == []


async def _session_diff(name: str, plan: dict[str, Any], root: Path) -> str:
    spec = RuntimeSpec(isolation="none", source=f"example:{name}")
    rt = await LocalRuntime.create("agent", spec, root / "agent")
    try:
        # text answers change nothing; the plans' own test runs only cost time here
        steps = [s for s in plan["steps"] if "text" not in s and "pytest" not in s.get("shell", "")]
        await asyncio.to_thread(apply_steps, steps, rt.workdir)
        return await rt.diff()
    finally:
        await rt.destroy()


async def _evaluate(name: str, diff: str, root: Path, evaluator: str = "swe_tests", **opts: Any) -> EvalResult:
    task = examples.load(name)
    made: list[Runtime] = []

    async def fresh() -> Runtime:
        rt = await LocalRuntime.create(
            f"fresh{len(made)}", RuntimeSpec(isolation="none", source=f"example:{name}"), root / f"fresh{len(made)}"
        )
        made.append(rt)
        return rt

    options = {"FAIL_TO_PASS": list(task.fail_to_pass), "PASS_TO_PASS": list(task.pass_to_pass), **opts}
    ctx = EvalContext(
        task_id=name,
        sample_index=0,
        instruction=task.problem_statement,
        options=options,
        status="COMPLETED",
        diff=diff,
        session_dir=root,
        fresh_runtime=fresh,
    )
    try:
        return await run_evaluator(evaluator, ctx, timeout_s=120)
    finally:
        for rt in made:
            await rt.destroy()


@pytest.mark.parametrize("name", ALL)
def test_fix_plan_resolves_and_noop_does_not(name: str, tmp_path: Path) -> None:
    async def main() -> tuple[EvalResult, EvalResult]:
        fix = await _session_diff(name, examples.load(name).fix_plan, tmp_path)
        noop = await _session_diff(name, examples.load(name).noop_plan, tmp_path)
        assert noop == ""
        assert fix.startswith("diff --git")
        return await _evaluate(name, fix, tmp_path), await _evaluate(name, noop, tmp_path)

    fixed, nothing = asyncio.run(main())
    assert fixed.reward == 1.0 and fixed.resolved, fixed.details
    assert set(fixed.details["FAIL_TO_PASS"].values()) == {"PASSED"}
    assert nothing.reward == 0.0 and nothing.details == {"empty_patch": True}
    assert not nothing.mask_sample


def test_unfixed_repo_fails_its_fail_to_pass_tests(tmp_path: Path) -> None:
    """The bug is real: a diff that touches only a comment leaves FAIL_TO_PASS failing, PASS_TO_PASS passing."""
    plan = {"steps": [{"write": {"path": "NOTES.md", "content": "looked at it\n"}}]}

    async def main() -> EvalResult:
        return await _evaluate("median", await _session_diff("median", plan, tmp_path), tmp_path)

    res = asyncio.run(main())
    assert res.reward == 0.0 and res.resolved is False and res.failure_kind is None
    assert set(res.details["FAIL_TO_PASS"].values()) == {"FAILED"}
    assert set(res.details["PASS_TO_PASS"].values()) == {"PASSED"}


def test_editing_the_tests_does_not_pass(tmp_path: Path) -> None:
    """restore_tests: a diff that rewrites the failing test is undone before the tests run."""
    old = "    assert median([1, 2, 3, 4]) == 2.5\n    assert median([4, 1]) == 2.5\n"
    plan = {"steps": [{"edit": {"path": "tests/test_stats.py", "old": old, "new": "    pass\n"}}]}

    async def main() -> tuple[EvalResult, EvalResult]:
        diff = await _session_diff("median", plan, tmp_path)
        return (
            await _evaluate("median", diff, tmp_path),
            await _evaluate("median", diff, tmp_path, restore_tests=False),
        )

    guarded, unguarded = asyncio.run(main())
    assert guarded.reward == 0.0
    assert unguarded.reward == 1.0  # the guard is what makes the difference


def test_broken_diff_scores_zero_with_failure_kind(tmp_path: Path) -> None:
    broken = "diff --git a/stats.py b/stats.py\n--- a/stats.py\n+++ b/stats.py\n@@ -40,3 +40,3 @@\n-nope\n+yes\n"
    res = asyncio.run(_evaluate("median", broken, tmp_path))
    assert res.reward == 0.0 and res.failure_kind == "patch_apply_failed" and not res.mask_sample


async def _crash(ctx: EvalContext) -> EvalResult:
    raise RuntimeError("verifier bug")


async def _hang(ctx: EvalContext) -> EvalResult:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def _garbage(ctx: EvalContext) -> Any:
    return {"reward": 1}


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        (f"{__name__}:_crash", "evaluator_error"),
        (f"{__name__}:_garbage", "evaluator_bad_result"),
        ("no.such.module:evaluate", "evaluator_not_found"),
        ("not_registered", "evaluator_not_found"),
    ],
)
def test_failing_evaluators_are_contained(target: str, kind: str, tmp_path: Path) -> None:
    res = asyncio.run(_evaluate("median", "", tmp_path, evaluator=target))
    assert (res.reward, res.failure_kind, res.mask_sample) == (0.0, kind, True)


def test_hanging_evaluator_times_out(tmp_path: Path) -> None:
    ctx = EvalContext(
        task_id="t", sample_index=0, instruction="", options={}, status="COMPLETED", diff="", session_dir=tmp_path
    )
    res = asyncio.run(run_evaluator(f"{__name__}:_hang", ctx, timeout_s=0.2))
    assert (res.failure_kind, res.mask_sample) == ("evaluator_timeout", True)


def test_command_and_session_completed(tmp_path: Path) -> None:
    async def main() -> list[EvalResult]:
        rt = await LocalRuntime.create("s", RuntimeSpec(isolation="none", source="example:slugify"), tmp_path / "s")
        try:
            base = dict(task_id="t", sample_index=0, instruction="", diff="", session_dir=tmp_path, runtime=rt)
            out = []
            for status, opts in [
                ("COMPLETED", {"command": "python -m pytest -q tests/test_slug.py::test_simple"}),
                ("COMPLETED", {"command": "python -m pytest -q tests"}),
                ("COMPLETED", {"command": "echo 0.25 > r.txt", "reward_file": "r.txt"}),
            ]:
                out.append(
                    await run_evaluator("command", EvalContext(status=status, options=opts, **base), timeout_s=60)
                )
            out.append(
                await run_evaluator(
                    "session_completed", EvalContext(status="TIMEOUT", options={}, **base), timeout_s=5
                )
            )
            out.append(
                await run_evaluator(
                    "session_completed",
                    EvalContext(status="COMPLETED", options={}, agent_exit_code=0, **base),
                    timeout_s=5,
                )
            )
            return out
        finally:
            await rt.destroy()

    rewards = [r.reward for r in asyncio.run(main())]
    assert rewards == [1.0, 0.0, 0.25, 0.0, 1.0]


def test_parse_pytest_summary() -> None:
    out = """
=========================== short test summary info ============================
PASSED tests/test_a.py::test_ok
FAILED tests/test_a.py::test_bad - AssertionError: assert 1 == 2
ERROR tests/test_b.py - SyntaxError: invalid syntax
XFAIL tests/test_a.py::test_x - reason
SKIPPED [1] tests/test_a.py:9: no
PASSED tests/test_a.py::test_teardown
ERROR tests/test_a.py::test_teardown - RuntimeError
"""
    assert parse_pytest_summary(out) == {
        "tests/test_a.py::test_ok": "PASSED",
        "tests/test_a.py::test_bad": "FAILED",
        "tests/test_b.py": "ERROR",
        "tests/test_a.py::test_x": "XFAIL",
        "tests/test_a.py::test_teardown": "ERROR",
    }
