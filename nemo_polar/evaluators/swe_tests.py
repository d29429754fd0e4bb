# SPDX-License-Identifier: Apache-2.0
"""`swe_tests`: SWE-Gym / SWE-bench style verification of an agent's diff.

Options: `FAIL_TO_PASS`, `PASS_TO_PASS` (pytest node ids), `test_command` (default `python -m pytest`),
`timeout_s` (default 600), `restore_tests` (default true: the test files named by the node ids are put back to
their original content after the diff is applied, so an agent cannot pass by editing the tests).

Steps: take a FRESH runtime (a clean copy of the task repo), apply the agent's diff (`git apply`, then
`patch --fuzz`), run exactly the named tests with `-rA`, parse each test's outcome from the short summary, and
score SWE-bench's way: resolved iff every FAIL_TO_PASS and every PASS_TO_PASS test passes (PASSED or XFAIL; a
test that did not run counts as failed); reward = 1.0 if resolved else 0.0.

Failure kinds: `patch_apply_failed` and `test_timeout` are the agent's doing (reward 0, kept for training);
`runtime_unavailable`, `test_runner_error` (pytest internal error / could not start) are infrastructure
(`mask_sample`). An empty diff is a plain 0.0 with `details.empty_patch`.
"""

from __future__ import annotations

import re
import shlex

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nemo_polar.evaluators.base import EvalContext, failure, register_evaluator
from nemo_polar.evaluators.patching import apply_diff
from nemo_polar.types import EvalResult

__all__ = ["PASSING", "SweTestsOptions", "parse_pytest_summary", "swe_tests"]

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

    @model_validator(mode="after")
    def _some_tests(self) -> SweTestsOptions:
        if not self.FAIL_TO_PASS and not self.PASS_TO_PASS:
            raise ValueError("swe_tests needs FAIL_TO_PASS and/or PASS_TO_PASS")
        return self


@register_evaluator("swe_tests", options=SweTestsOptions)
async def swe_tests(ctx: EvalContext) -> EvalResult:
    try:
        opts = SweTestsOptions.model_validate(dict(ctx.options))
    except ValidationError as exc:  # checked at submit; reached only by a task that bypassed the rollout server
        return failure("evaluator_config", f"swe_tests options: {exc}", mask_sample=True)
    f2p, p2p = opts.FAIL_TO_PASS, opts.PASS_TO_PASS
    if not ctx.diff.strip():
        return EvalResult(reward=0.0, resolved=False, details={"empty_patch": True})
    if ctx.fresh_runtime is None:
        return failure("runtime_unavailable", "swe_tests needs a fresh runtime", mask_sample=True)
    rt = await ctx.fresh_runtime()

    test_files = sorted({t.split("::", 1)[0] for t in f2p + p2p})
    originals = {}
    if opts.restore_tests:
        originals = {f: (rt.workdir / f).read_bytes() for f in test_files if (rt.workdir / f).is_file()}
    err = await apply_diff(rt, ctx.diff)
    if err is not None:
        return failure("patch_apply_failed", err, mask_sample=False)
    for rel, data in originals.items():
        await rt.write_file(rel, data)

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
        },
    )
