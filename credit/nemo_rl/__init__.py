# SPDX-License-Identifier: Apache-2.0
"""NeMo RL integration for CALL-CREDIT: the advantage estimator, `install()` and the launcher.

`CallCreditAdvantageEstimator` (selected in YAML by `grpo.adv_estimator.name: grpo` plus
`_target_: nemo_polar.credit.nemo_rl.CallCreditAdvantageEstimator`), `install()` (wraps NeMo RL's estimator
factory), `python -m nemo_polar.credit.nemo_rl.launch --config RECIPE [overrides...]`. Facts about NeMo RL are
pinned to `NEMO_RL_COMMIT`.

The only package of nemo-polar that imports `nemo_rl`, and only lazily (inside functions): this package's
own import needs neither `nemo_rl` nor `torch` (the estimator and `install()` load on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .pinned import NEMO_RL_COMMIT

if TYPE_CHECKING:
    from .estimator import CallCreditAdvantageEstimator
    from .factory import install, uninstall

__all__ = ["NEMO_RL_COMMIT", "CallCreditAdvantageEstimator", "install", "uninstall"]


def __getattr__(name: str) -> Any:
    # lazy: `_target_` resolution and `install()` pull in torch only when they are used
    if name == "CallCreditAdvantageEstimator":
        from .estimator import CallCreditAdvantageEstimator

        return CallCreditAdvantageEstimator
    if name in ("install", "uninstall"):
        from . import factory

        return getattr(factory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
