# SPDX-License-Identifier: Apache-2.0
"""The optional `polar_calls` patch: carry Polar's per-call annotations from the Gym result into the batch.

NeMo RL drops `full_result` (the Gym verify JSON, where `polar_calls` lives) before the estimator runs. At the
pinned commit the last place both are in reach is `nemo_rl.experience.rollouts._postprocess_single_nemo_gym_group
(nemo_gym_rows, results, ...)`, which builds one prompt group's `final_batch`; it is called through the module
global by the rollout loop, so wrapping the attribute takes effect. The wrapper adds a list column
`final_batch["polar_calls"]` (one entry per row: the row's `polar_calls` list, or None), which NeMo RL's
`BatchedDataDict` carries through repeat/slice/concatenate like its other list columns.

Sync GRPO runs this function in the driver: `install_polar_calls_patch()` there is enough. Async GRPO runs it
inside the trajectory-collector Ray actor: the launcher adds `ray_worker_setup` as Ray's
`worker_process_setup_hook` (NeMo RL passes the driver's environment to every actor, so
`POLAR_CALLS_PATCH=1` reaches it); nemo-polar must then be installed in that actor's Python environment.

Does not: import `nemo_rl` at module level.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .pinned import GYM_GROUP_POSTPROCESS_NAME, ROLLOUTS_MODULE
from .wrapping import resolve_module, wrap

PATCH_ENV = "POLAR_CALLS_PATCH"
_WRAPPED_FLAG = "__polar_calls_wrapped__"


def install_polar_calls_patch(rollouts_module: ModuleType | str | None = None) -> Callable[..., Any]:
    """Wrap `_postprocess_single_nemo_gym_group` so each group's batch gets a `polar_calls` column (idempotent)."""
    module = resolve_module(rollouts_module, ROLLOUTS_MODULE)
    return wrap(module, GYM_GROUP_POSTPROCESS_NAME, _postprocess_wrapper, _WRAPPED_FLAG)


def _postprocess_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def postprocess(nemo_gym_rows: Any, results: Any, *args: Any, **kwargs: Any) -> Any:
        calls = [(result.get("full_result") or {}).get("polar_calls") for result in results]
        out = original(nemo_gym_rows, results, *args, **kwargs)
        out.final_batch["polar_calls"] = calls
        return out

    return postprocess


def ray_worker_setup() -> None:
    """Ray `worker_process_setup_hook`: apply the patch in actors when the driver asked for it."""
    if os.environ.get(PATCH_ENV) == "1":
        try:
            install_polar_calls_patch()
        except ImportError:
            pass  # a worker without NeMo RL's rollouts module (e.g. a Gym server's env) has nothing to patch
