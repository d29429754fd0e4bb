# SPDX-License-Identifier: Apache-2.0
"""Trajectory builders (docs/contracts.md): turn a session's `CompletionRecord`s into trainer-facing traces.

`build(records, builder="per_request"|"prefix_merging"|"pkg.mod.fn", **options) -> Trajectory`. Pure functions
of data: no HTTP, no clock, no tokenizer (end-of-turn ids, the call classifier and policies arrive as options).
Exports to NeMo Gym output items, a NeMo RL `message_log` and plain JSONL live in `export`. Imports only
`nemo_polar.types`.
"""

from .export import to_gym_output_items, to_gym_records, to_message_log, traces_to_jsonl
from .options import BuildOptions
from .per_request import build_per_request
from .prefix_merging import FidelityError, build_prefix_merging, check_exact
from .registry import OptionsError, available_builders, build, get_builder, register_builder

__all__ = [
    "BuildOptions",
    "FidelityError",
    "OptionsError",
    "available_builders",
    "build",
    "build_per_request",
    "build_prefix_merging",
    "check_exact",
    "get_builder",
    "register_builder",
    "to_gym_output_items",
    "to_gym_records",
    "to_message_log",
    "traces_to_jsonl",
]
