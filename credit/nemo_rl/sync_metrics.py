# SPDX-License-Identifier: Apache-2.0
"""CALL-CREDIT metrics on NeMo RL's synchronous GRPO paths (the asynchronous one logs them by itself).

At the pinned commit, async GRPO merges `adv_estimator.last_metrics` into its rollout metrics. The synchronous
trainers (`grpo_train` in `nemo_rl.algorithms.grpo`, and `nemo_rl.algorithms.grpo_sync`) do not: right after
`compute_advantage` they call `_log_mixed_rewards_and_advantages_information(logger, total_steps, metrics, baseline,
advantages)` through their module globals, and the `metrics` dict it fills is carried into the step's logged
metrics (`metrics = {**metrics, ...}`). `install_sync_metrics()` wraps that function in both modules so it also
merges the `last_metrics` of the CALL-CREDIT estimator the factory built last (`track()`, called by `install()`'s
factory wrapper). Idempotent; `uninstall_sync_metrics()` puts the originals back.

Does not: import `nemo_rl` at module level.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .pinned import GRPO_MODULE, GRPO_SYNC_MODULE, SYNC_METRICS_LOG_NAME
from .wrapping import resolve_module, unwrap, wrap_if_present

_WRAPPED_FLAG = "__call_credit_metrics_wrapped__"
_last: list[weakref.ref[Any]] = []


def track(estimator: Any) -> None:
    """Remember `estimator` as the one whose `last_metrics` the synchronous trainers log (a weak reference)."""
    _last[:] = [weakref.ref(estimator)]


def tracked() -> Any | None:
    """The estimator `track()` remembers, if it is still alive."""
    return _last[0]() if _last else None


def _metrics_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def log_with_call_credit(logger: Any, total_steps: int, metrics: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        out = original(logger, total_steps, metrics, *args, **kwargs)
        estimator = tracked()
        extra = getattr(estimator, "last_metrics", None)
        if extra:
            metrics.update(extra)
        return out

    return log_with_call_credit


def _modules(grpo_module: ModuleType | None) -> list[ModuleType]:
    modules = [resolve_module(grpo_module, GRPO_MODULE)]
    if grpo_module is None or grpo_module.__name__ == GRPO_MODULE:
        try:
            modules.append(importlib.import_module(GRPO_SYNC_MODULE))
        except ImportError:
            pass  # an older NeMo RL without the separate synchronous trainer
    return modules


def install_sync_metrics(grpo_module: ModuleType | None = None) -> list[str]:
    """Wrap the synchronous trainers' advantage-logging function; returns the modules wrapped."""
    return [
        m.__name__
        for m in _modules(grpo_module)
        if wrap_if_present(m, SYNC_METRICS_LOG_NAME, _metrics_wrapper, _WRAPPED_FLAG) is not None
    ]


def uninstall_sync_metrics(grpo_module: ModuleType | None = None) -> None:
    for module in _modules(grpo_module):
        unwrap(module, SYNC_METRICS_LOG_NAME, _WRAPPED_FLAG, missing_ok=True)
