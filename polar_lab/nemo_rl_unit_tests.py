# SPDX-License-Identifier: Apache-2.0
"""Run NeMo RL's own unit tests (advantage estimators, GRPO helpers, losses, the Gym environment, rollouts) with the
CALL-CREDIT plug-in installed in the same process, and report the counts.

Usage, with the NeMo RL environment's Python (`scripts/nemo_rl_venv.sh` prints its path):

    <nemo-rl-venv>/bin/python polar_lab/nemo_rl_unit_tests.py [--json OUT] [PYTEST_ARGS...]

Before pytest imports anything of NeMo RL's tests, `install()` wraps NeMo RL's estimator factory and
`install_polar_calls_patch()` wraps its Gym group post-processing, exactly as `launch` does; the script checks that
both wrappers are in place, runs the selected test files from the NeMo RL source tree the venv was built from, and
prints one line `nemo_rl unit tests: N passed, N failed, N skipped, N errors`. Exit status: pytest's.

Run it by path (not `-m`): NeMo RL's tests import their helpers as the top-level package `tests`, which the
repository root on `sys.path` would shadow with this project's own `tests` package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

# NeMo RL's test files that run on a CPU-only machine with this environment. Left out: the other files of these
# folders need a GPU, vLLM, Megatron, or test modules the vendored archive does not carry (test_nemo_gym.py,
# test_rollouts.py and test_rollout_manager.py import tests.unit.models, which is not in it).
SELECTED = (
    "tests/unit/algorithms/test_advantage_estimator.py",
    "tests/unit/algorithms/test_utils.py",
    "tests/unit/algorithms/test_loss_functions.py",
    "tests/unit/environments/test_nemo_gym_utils.py",
    "tests/unit/environments/test_nemo_gym_health.py",
    "tests/unit/experience/test_failures.py",
    "tests/unit/experience/test_reward_penalties.py",
)
# test_utils.py's get_tokenizer tests download a tokenizer from the Hugging Face hub, which this machine cannot reach
DESELECT_EXPRESSION = "not test_get_tokenizer"


class Counter:
    """A pytest plug-in object counting outcomes of the call phase (setup/teardown errors counted as errors)."""

    def __init__(self) -> None:
        self.counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
        self.failed: list[str] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call":
            if report.passed:
                self.counts["passed"] += 1
            elif report.failed:
                self.counts["failed"] += 1
                self.failed.append(report.nodeid)
            elif report.skipped:
                self.counts["skipped"] += 1
        elif report.failed:
            self.counts["errors"] += 1
            self.failed.append(report.nodeid)
        elif report.when == "setup" and report.skipped:
            self.counts["skipped"] += 1

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.counts["errors"] += 1
            self.failed.append(report.nodeid)


def nemo_rl_source() -> Path:
    """The NeMo RL source tree this environment imports (`nemo_rl` is installed editable from it)."""
    import nemo_rl

    return Path(str(nemo_rl.__file__)).resolve().parents[1]


def install_plugin() -> None:
    from nemo_polar.credit.nemo_rl import install
    from nemo_polar.credit.nemo_rl.patches import install_polar_calls_patch
    from nemo_rl.algorithms import grpo
    from nemo_rl.experience import rollouts

    install(grpo)
    install_polar_calls_patch(rollouts)
    if not getattr(grpo._create_advantage_estimator, "__call_credit_wrapped__", False):
        raise SystemExit("the CALL-CREDIT factory wrapper is not installed")
    if not getattr(rollouts._postprocess_single_nemo_gym_group, "__polar_calls_wrapped__", False):
        raise SystemExit("the polar_calls patch is not installed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, help="write the counts and failed node ids here")
    args, pytest_args = parser.parse_known_args(argv)
    import pytest

    source = nemo_rl_source()
    install_plugin()
    counter = Counter()
    os.chdir(source)
    sys.path.insert(0, str(source))
    files = [a for a in pytest_args if not a.startswith("-")]
    options = [a for a in pytest_args if a.startswith("-")]
    if not files:
        files, options = list(SELECTED), ["-k", DESELECT_EXPRESSION, *options]
    rc = pytest.main(
        ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "-W", "ignore::DeprecationWarning", *options, *files],
        plugins=[counter],
    )
    c = counter.counts
    print(
        f"nemo_rl unit tests: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, {c['errors']} errors"
    )
    if args.json:
        args.json.write_text(json.dumps({"counts": c, "failed": counter.failed, "files": files, "rc": int(rc)}))
    return int(rc)


if __name__ == "__main__":
    raise SystemExit(main())
