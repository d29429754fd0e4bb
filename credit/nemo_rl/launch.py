# SPDX-License-Identifier: Apache-2.0
"""`python -m nemo_polar.credit.nemo_rl.launch --config RECIPE [--dry-run] [overrides...]`

Runs NeMo RL's NeMo Gym GRPO entry script (`examples/nemo_gym/run_grpo_nemo_gym.py`, found next to the
installed `nemo_rl` package) unmodified, after preparing the process:

1. loads the recipe as NeMo RL does (`defaults:`, `_override_`, Hydra-style overrides incl. `+key=val`) and
   validates it against the pinned schema (`schema.py`), all errors at once;
2. sets `NEMO_GYM_EXTRA_ROOTS` to this repository's `environments/` (kept in front of any existing value) and
   resolves every `env.nemo_gym.config_paths` entry and every data file;
3. `install()`s the CALL-CREDIT estimator into NeMo RL's factory, builds the estimator once from the recipe,
   prints the class actually chosen and stops (exit 3) if it is not the one the recipe asks for — the guard
   against plain GRPO running silently;
4. wraps the refit with pause / policy_version / resume on the Polar stacks: those `polar.gateways` lists, and
   in a Gym launch (`env.should_use_nemo_gym`) every `polar_swe` server NeMo Gym hosts, found at each refit
   through the head server of the `NemoGym` actor NeMo RL spins up (`hosted.py`);
   when `polar.polar_calls_patch` is true: copies `polar_calls` into the batch (driver, and the async
   collector through a Ray worker setup hook);
5. without `--dry-run`: `runpy` the entry script with `--config RECIPE overrides...`.

`--grpo-module` / `--rollouts-module` / `--entry-script` point at other modules (a stand-in in tests, a fork);
`--no-plugin` skips step 3's install (the guard then shows what NeMo RL alone would run).
Exit codes: 0 ok, 2 bad recipe / missing files / NeMo RL not importable, 3 estimator guard failed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import runpy
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from nemo_polar.errors import PolarError

from .pinned import ENTRY_SCRIPT, GRPO_MODULE, NEMO_RL_COMMIT, ROLLOUTS_MODULE
from .recipe import OverrideError, load_with_overrides
from .schema import MasterConfigSchema, validate_recipe
from .wrapping import Wrapper, wrap

REPO_ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENTS_ROOT = REPO_ROOT / "environments"
EXTRA_ROOTS_ENV = "NEMO_GYM_EXTRA_ROOTS"
RAY_SETUP_HOOK = "nemo_polar.credit.nemo_rl.patches.ray_worker_setup"
# Gym server directories that nemo-polar ships under environments/: a config path into one of them must resolve
OUR_GYM_DIRS = ("resources_servers/polar_swe", "responses_api_agents/polar_agent")


class LaunchError(PolarError, RuntimeError):
    def __init__(self, message: str, code: int = 2):
        self.code = code
        super().__init__(message)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nemo_polar.credit.nemo_rl.launch",
        description="Run NeMo RL's NeMo Gym GRPO with the CALL-CREDIT estimator installed.",
    )
    p.add_argument("--config", required=True, help="recipe YAML (recipes/*.yaml)")
    p.add_argument("--dry-run", action="store_true", help="resolve and check everything, print, do not train")
    p.add_argument("--grpo-module", default=GRPO_MODULE, help="module holding the estimator factory and refit")
    p.add_argument("--rollouts-module", default=ROLLOUTS_MODULE, help="module holding the Gym group postprocess")
    p.add_argument("--entry-script", default=None, help=f"default: <nemo_rl checkout>/{ENTRY_SCRIPT}")
    p.add_argument("--no-plugin", action="store_true", help="do not install the estimator (shows the guard)")
    return p


def set_extra_roots(root: Path = ENVIRONMENTS_ROOT) -> str:
    """Put our Gym extra root first in `NEMO_GYM_EXTRA_ROOTS`; returns the new value."""
    current = [p for p in os.environ.get(EXTRA_ROOTS_ENV, "").split(os.pathsep) if p]
    value = os.pathsep.join([str(root), *[p for p in current if Path(p) != root]])
    os.environ[EXTRA_ROOTS_ENV] = value
    return value


def _nemo_gym_root() -> Path | None:
    spec = importlib.util.find_spec("nemo_gym")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def resolve_gym_config_paths(paths: list[str], roots: list[Path]) -> list[tuple[str, str]]:
    """(path, where) per Gym config path. Ours must exist; NeMo Gym's own are checked where nemo_gym is installed.

    Raises:
        LaunchError: a path that belongs to one of our roots (or an absolute one) does not exist.
    """
    gym_root = _nemo_gym_root()
    out: list[tuple[str, str]] = []
    errors: list[str] = []
    for path in paths:
        p = Path(path)
        if p.is_absolute():
            (out.append((path, str(p))) if p.is_file() else errors.append(f"{path}: no such file"))
            continue
        found = next((root / p for root in roots if (root / p).is_file()), None)
        if found is not None:
            out.append((path, str(found)))
            continue
        ours = len(p.parts) > 1 and "/".join(p.parts[:2]) in OUR_GYM_DIRS
        if ours:
            errors.append(f"{path}: not found under {', '.join(map(str, roots))}")
        elif gym_root is not None:
            candidate = gym_root / p
            (
                out.append((path, str(candidate)))
                if candidate.is_file()
                else errors.append(f"{path}: not in {gym_root}")
            )
        else:
            out.append((path, "NeMo Gym's own config (nemo_gym is not installed here; checked at launch)"))
    if errors:
        raise LaunchError("Gym config paths do not resolve:\n  " + "\n  ".join(errors))
    return out


def resolve_data_files(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(split, absolute path) for every `data.train` / `data.validation` data_path; missing files are errors."""
    out: list[tuple[str, str]] = []
    errors: list[str] = []
    for split in ("train", "validation"):
        entries = data.get(split)
        for entry in entries if isinstance(entries, list) else [entries]:
            path = (entry or {}).get("data_path")
            if not path:
                continue
            p = Path(path).expanduser()
            (
                out.append((split, str(p.resolve())))
                if p.is_file()
                else errors.append(f"data.{split}: {path} not found")
            )
    if errors:
        raise LaunchError("data files do not resolve:\n  " + "\n  ".join(errors))
    return out


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise LaunchError(
            f"cannot import {name} ({exc}); nemo_rl must be installed (NeMo RL @ {NEMO_RL_COMMIT[:12]}), "
            "or pass --grpo-module"
        ) from exc


def build_estimator(grpo: ModuleType, config: dict[str, Any]) -> tuple[Any, str]:
    """Call the (wrapped) factory the way the trainer will; returns the estimator and its checked class path."""
    from .factory import PluginNotLoadedError, check_chosen

    master_cls = getattr(grpo, "MasterConfig", None)
    master = master_cls(**config) if master_cls is not None else config
    estimator = grpo._create_advantage_estimator(master)
    try:
        chosen = check_chosen(estimator, config["grpo"].get("adv_estimator"))
    except PluginNotLoadedError as exc:
        raise LaunchError(str(exc), code=3) from exc
    return estimator, chosen


def _uses_gym(config: dict[str, Any]) -> bool:
    return bool((config.get("env") or {}).get("should_use_nemo_gym"))


def install_refit_hooks(
    grpo: ModuleType, gateways: list[str], timeout_s: float, *, gym: bool
) -> Any:  # HostedStacks | None
    """Wrap the refit of `grpo` with pause / policy_version / resume on `gateways` and, when `gym`, on the hosted
    `polar_swe` stacks of every `NemoGym` actor `grpo.spinup_nemo_gym_actor` spins up. Returns the `HostedStacks`
    (None without `gym`)."""
    if not gateways and not gym:
        return None
    from .gateways import GatewayAdmin, wrap_refit

    hosted = None
    if gym:
        from .hosted import HostedStacks, capture_gym_actors

        hosted = HostedStacks(timeout_s=timeout_s)
        if capture_gym_actors(grpo, hosted) is None:
            raise LaunchError(f"{grpo.__name__} has no spinup_nemo_gym_actor: the hosted Polar stacks cannot be found")
    wrap_refit(grpo, GatewayAdmin(gateways, timeout_s=timeout_s, discover=hosted))
    return hosted


def _with_setup_hook(original: Wrapper) -> Wrapper:
    def init(*args: Any, **kwargs: Any) -> Any:
        runtime_env = dict(kwargs.get("runtime_env") or {})
        runtime_env.setdefault("worker_process_setup_hook", RAY_SETUP_HOOK)
        kwargs["runtime_env"] = runtime_env
        return original(*args, **kwargs)

    return init


def _inject_ray_setup_hook() -> None:
    """Wrap `ray.init` so every Ray worker runs `RAY_SETUP_HOOK` (its `runtime_env` hook unless one is set)."""
    import ray

    wrap(ray, "init", _with_setup_hook, "__polar_hooked__")


def _entry_script(args: argparse.Namespace) -> Path:
    if args.entry_script:
        return Path(args.entry_script)
    nemo_rl = _import("nemo_rl")
    return Path(str(nemo_rl.__file__)).resolve().parents[1] / ENTRY_SCRIPT


def run(argv: list[str]) -> int:
    args, overrides = _parser().parse_known_args(argv)
    try:
        if not Path(args.config).is_file():
            raise LaunchError(f"recipe not found: {args.config}")
        config = load_with_overrides(args.config, overrides)
        try:
            checked: MasterConfigSchema = validate_recipe(config)
        except ValidationError as exc:
            raise LaunchError(
                f"{args.config} does not validate against NeMo RL @ {NEMO_RL_COMMIT[:12]}:\n{exc}"
            ) from exc
        extra_roots = set_extra_roots()
        print(f"{EXTRA_ROOTS_ENV}={extra_roots}")
        roots = [Path(p) for p in extra_roots.split(os.pathsep) if p]
        for path, where in resolve_gym_config_paths(
            checked.env.nemo_gym.config_paths if checked.env.nemo_gym else [], roots
        ):
            print(f"gym config: {path} -> {where}")
        for split, path in resolve_data_files(config["data"]):
            print(f"data.{split}: {path}")

        grpo = _import(args.grpo_module)
        if not args.no_plugin:
            from .factory import install

            install(grpo)
        _, chosen = build_estimator(grpo, config)
        print(f"advantage estimator class: {chosen}")

        polar = checked.polar
        hosted = install_refit_hooks(grpo, polar.gateways, polar.admin_timeout_s, gym=_uses_gym(config))
        if polar.gateways:
            print(f"refit: pause/policy_version/resume on {len(polar.gateways)} Polar gateway(s)")
        if hosted is not None:
            print(
                "refit: pause/policy_version/resume on the polar_swe server(s) NeMo Gym hosts "
                "(found through the NemoGym actor's head server)"
            )
        if polar.polar_calls_patch:
            from .patches import PATCH_ENV, install_polar_calls_patch

            os.environ[PATCH_ENV] = "1"
            install_polar_calls_patch(_import(args.rollouts_module))
            is_async = bool(checked.grpo.async_grpo and checked.grpo.async_grpo.enabled)
            if is_async and not args.dry_run:
                _inject_ray_setup_hook()
            print("polar_calls patch: on" + (" (driver + async collector via Ray setup hook)" if is_async else ""))
        if args.dry_run:
            print("dry run: not training")
            return 0
        script = _entry_script(args)
        if not script.is_file():
            raise LaunchError(f"NeMo RL entry script not found: {script}")
        sys.argv = [str(script), "--config", str(args.config), *overrides]
        runpy.run_path(str(script), run_name="__main__")
        return 0
    except (LaunchError, OverrideError) as exc:
        print(f"launch: error: {exc}", file=sys.stderr)
        return exc.code if isinstance(exc, LaunchError) else 2


def main() -> None:
    raise SystemExit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
