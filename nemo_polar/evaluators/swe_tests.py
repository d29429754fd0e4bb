# SPDX-License-Identifier: Apache-2.0
"""`swe_tests`: SWE-bench's evaluation protocol for an agent's diff, on any runtime (bubblewrap or container).

Options: `FAIL_TO_PASS`, `PASS_TO_PASS` (pytest node ids), `test_command` (default `python -m pytest`),
`timeout_s` (default 600), `restore_tests` (default true), `test_patch` (optional unified diff adding or changing
tests, as SWE-bench ships it), `base_commit` (optional: checked out first when the repository has it).

Steps, on a FRESH runtime (a clean copy of the task repo; the gateway prewarms it while the agent runs): check out
`base_commit` (when given and present), apply the agent's diff (`git apply`, then `patch --fuzz`), reset the test
files (those named by the node ids and those `test_patch` touches) to their original content, so an agent cannot
pass by editing tests, apply `test_patch`, run exactly the named tests with `-rA`, parse each test's outcome and
grade SWE-bench's way: resolved iff every FAIL_TO_PASS and every PASS_TO_PASS test passes (PASSED or XFAIL; a test
that did not run counts as failed); reward = 1.0 if resolved else 0.0. Per-test outcomes are kept in `details`.

Failure kinds: `patch_apply_failed` and `test_timeout` are the agent's doing (reward 0, kept for training);
`runtime_unavailable`, `test_patch_failed`, `test_runner_error` (pytest internal error / could not start) are
infrastructure (`mask_sample`). An empty diff is a plain 0.0 with `details.empty_patch` (`run_protocol(...,
run_empty=True)` still runs the tests: build-time validation of a task).
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_polar.evaluators.base import EvalContext, failure, read_options, register_evaluator
from nemo_polar.evaluators.patching import apply_diff
from nemo_polar.types import EvalResult

if TYPE_CHECKING:
    from nemo_polar.rollout.runtime import Runtime

__all__ = ["PASSING", "SweTestsOptions", "parse_pytest_summary", "patch_files", "run_protocol", "swe_tests"]

TEST_PATCH_PATH = ".polar/test.patch"

PASSING = frozenset({"PASSED", "XFAIL"})
_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(.*)$")


def parse_pytest_summary(output: str) -> dict[str, str]:
    """Per-test outcome from pytest `-rA` output: `{node_id: "PASSED"|"FAILED"|"ERROR"|...}`.

    A test reported twice (e.g. PASSED then ERROR in teardown) keeps the worse outcome."""
    out: dict[str, str] = {}
    for raw in output.splitlines():
        m = _LINE.match(raw.strip())
        if not m:
            continue
        status, rest = m.groups()
        if status == "SKIPPED":  # "SKIPPED [1] path:line: reason" names no node id
            continue
        node = rest.split(" - ", 1)[0].strip()
        if "::" not in node and not node.endswith(".py"):
            continue
        if out.get(node) in ("FAILED", "ERROR") and status in PASSING:
            continue
        out[node] = status
    return out


def _outcome(node: str, results: dict[str, str]) -> str:
    if node in results:
        return results[node]
    file = node.split("::", 1)[0]
    if results.get(file) == "ERROR":  # a collection error in the test file
        return "ERROR"
    return "MISSING"


class SweTestsOptions(BaseModel):
    """`swe_tests` options (the keys above), checked when a task is submitted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    test_command: str = "python -m pytest"
    timeout_s: float = Field(default=600.0, gt=0)
    restore_tests: bool = True
    test_patch: str = ""
    base_commit: str | None = None

    @model_validator(mode="after")
    def _some_tests(self) -> SweTestsOptions:
        if not self.FAIL_TO_PASS and not self.PASS_TO_PASS:
            raise ValueError("swe_tests needs FAIL_TO_PASS and/or PASS_TO_PASS")
        return self


@register_evaluator("swe_tests", options=SweTestsOptions)
async def swe_tests(ctx: EvalContext) -> EvalResult:
    opts = read_options(SweTestsOptions, ctx, "swe_tests options")
    if isinstance(opts, EvalResult):
        return opts
    if not ctx.diff.strip():
        return EvalResult(reward=0.0, resolved=False, details={"empty_patch": True})
    if ctx.fresh_runtime is None:
        return failure("runtime_unavailable", "swe_tests needs a fresh runtime", mask_sample=True)
    return await run_protocol(await ctx.fresh_runtime(), ctx.diff, opts)


def patch_files(diff: str) -> list[str]:
    """The repository-relative paths a unified diff touches (both sides, `/dev/null` excluded)."""
    out: dict[str, None] = {}
    for line in diff.splitlines():
        if line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t", 1)[0].strip()
            if name != "/dev/null":
                out[name[2:] if name[:2] in ("a/", "b/") else name] = None
    return list(out)


async def run_protocol(rt: Runtime, diff: str, opts: SweTestsOptions, *, run_empty: bool = False) -> EvalResult:
    """SWE-bench's protocol on `rt` (a fresh runtime) for `diff`; see the module docstring."""
    f2p, p2p = opts.FAIL_TO_PASS, opts.PASS_TO_PASS
    if not diff.strip() and not run_empty:
        return EvalResult(reward=0.0, resolved=False, details={"empty_patch": True})
    if opts.base_commit:
        has = await rt.exec(["git", "cat-file", "-e", f"{opts.base_commit}^{{commit}}"], timeout_s=60)
        if has.ok:
            res = await rt.exec(["git", "checkout", "-q", "-f", opts.base_commit, "--", "."], timeout_s=120)
            if not res.ok:
                reason = f"cannot check out {opts.base_commit}: {res.stderr}"
                return failure("runtime_unavailable", reason, mask_sample=True)
    test_files = sorted({t.split("::", 1)[0] for t in f2p + p2p} | set(patch_files(opts.test_patch)))
    originals: dict[str, bytes | None] = {}
    if opts.restore_tests:
        originals = {f: (rt.workdir / f).read_bytes() if (rt.workdir / f).is_file() else None for f in test_files}
    err = await apply_diff(rt, diff)
    if err is not None:
        return failure("patch_apply_failed", err, mask_sample=False)
    for rel, data in originals.items():
        if data is not None:
            await rt.write_file(rel, data)
        elif (rt.workdir / rel).is_file():  # created by the agent where the test patch creates a file
            (rt.workdir / rel).unlink()
    if opts.test_patch.strip():
        err = await apply_diff(rt, opts.test_patch, path=TEST_PATCH_PATH)
        if err is not None:
            return failure("test_patch_failed", err, mask_sample=True)

    timeout_s, base = opts.timeout_s, opts.test_command
    cmd = f"{base} -rA --tb=short -p no:cacheprovider -o addopts= " + " ".join(shlex.quote(t) for t in f2p + p2p)
    res = await rt.exec(cmd, timeout_s=timeout_s)
    output = res.stdout + res.stderr
    if res.timed_out:
        return failure("test_timeout", f"tests exceeded {timeout_s}s", mask_sample=False, output_tail=output[-4000:])
    results = parse_pytest_summary(output)
    if res.exit_code is None or (res.exit_code == 3 and not results):
        return failure("test_runner_error", output, mask_sample=True, exit_code=res.exit_code)

    f2p_out = {t: _outcome(t, results) for t in f2p}
    p2p_out = {t: _outcome(t, results) for t in p2p}
    f2p_ok = sum(v in PASSING for v in f2p_out.values())
    p2p_ok = sum(v in PASSING for v in p2p_out.values())
    resolved = f2p_ok == len(f2p) and p2p_ok == len(p2p)
    return EvalResult(
        reward=1.0 if resolved else 0.0,
        resolved=resolved,
        metrics={
            "fail_to_pass_rate": f2p_ok / len(f2p) if f2p else 1.0,
            "pass_to_pass_rate": p2p_ok / len(p2p) if p2p else 1.0,
        },
        details={
            "FAIL_TO_PASS": f2p_out,
            "PASS_TO_PASS": p2p_out,
            "pytest_exit_code": res.exit_code,
            "output_tail": output[-4000:],
            **({"empty_patch": True} if not diff.strip() else {}),
        },
    )
