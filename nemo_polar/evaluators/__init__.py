# SPDX-License-Identifier: Apache-2.0
"""Evaluators: `swe_tests`, `command`, `session_completed`, plus any dotted-path callable (see `base`).

Importing this package registers the built-in evaluators.
"""

from nemo_polar.evaluators import command, session_completed, swe_tests
from nemo_polar.evaluators.base import (
    EvalContext,
    Evaluator,
    evaluator_options_model,
    get_evaluator,
    register_evaluator,
    run_evaluator,
)

__all__ = [
    "EvalContext",
    "Evaluator",
    "command",
    "evaluator_options_model",
    "get_evaluator",
    "register_evaluator",
    "run_evaluator",
    "session_completed",
    "swe_tests",
]
