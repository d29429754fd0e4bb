# SPDX-License-Identifier: Apache-2.0
"""A SIMULATED agent: a timed process that applies a plan's harness-neutral steps itself, with no model.

`python -m nemo_polar.rollout.simulation --plan plan.json --run-s 2.5` runs in a session workdir: it sleeps
`run_s` seconds in total (standing in for model time, spread over the steps) and applies `{"shell": cmd}`,
`{"edit": {"path", "old", "new"}}` and `{"write": {"path", "content"}}` steps directly; `{"text": ...}` is
printed. Tests and `benchmarks/staging.py` use it where a real harness + proxy + model is not the point; it is
never a stand-in for a result that claims a real harness ran. `apply_steps` is also usable in-process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nemo_polar.errors import PolarError

__all__ = ["PlanStepError", "apply_step", "apply_steps", "main"]


class PlanStepError(PolarError, RuntimeError):
    """A harness-neutral step could not be applied (edit target not found, path escapes the workdir)."""


def _path(workdir: Path, rel: str) -> Path:
    path = (workdir / rel).resolve()
    if workdir.resolve() not in path.parents:
        raise PlanStepError(f"path {rel!r} escapes the workdir")
    return path


def apply_step(step: dict[str, Any], workdir: Path, *, shell_timeout_s: float = 120.0) -> str:
    """Apply one step in `workdir`; returns what an agent would have observed."""
    if "shell" in step:
        res = subprocess.run(
            step["shell"], shell=True, cwd=workdir, capture_output=True, text=True, timeout=shell_timeout_s
        )
        return f"exit={res.returncode}\n{res.stdout}{res.stderr}"
    if "edit" in step:
        e = step["edit"]
        path = _path(workdir, e["path"])
        text = path.read_text()
        if text.count(e["old"]) != 1:
            raise PlanStepError(f"edit {e['path']}: old text found {text.count(e['old'])} times, expected once")
        path.write_text(text.replace(e["old"], e["new"]))
        return f"edited {e['path']}"
    if "write" in step:
        w = step["write"]
        path = _path(workdir, w["path"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(w["content"])
        return f"wrote {w['path']}"
    if "text" in step:
        return str(step["text"])
    raise PlanStepError(f"the simulation cannot apply step {sorted(step)}")


def apply_steps(steps: list[dict[str, Any]], workdir: Path, *, run_s: float = 0.0) -> list[str]:
    """Apply every step in order, sleeping `run_s / (len(steps) + 1)` before each and once at the end."""
    pause = run_s / (len(steps) + 1) if run_s > 0 else 0.0
    out = []
    for step in steps:
        if pause:
            time.sleep(pause)
        out.append(apply_step(step, workdir))
    if pause:
        time.sleep(pause)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A simulated agent (no model): applies a plan, sleeps run_s.")
    parser.add_argument("--plan", type=Path, help="plan JSON (docs/contracts.md format)")
    parser.add_argument("--run-s", type=float, default=0.0)
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args(argv)
    steps = json.loads(args.plan.read_text()).get("steps", []) if args.plan else []
    try:
        for line in apply_steps(steps, Path.cwd(), run_s=args.run_s):
            print(line, flush=True)
    except PlanStepError as exc:
        print(f"simulation: {exc}", file=sys.stderr)
        return 3
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
