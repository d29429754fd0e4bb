# SPDX-License-Identifier: Apache-2.0
"""Which sessions of a run count: `usable` (not ERROR, not masked), `is_accepted` (usable with reward at or above
the threshold) and `repo_of` (the repository a session is grouped under). The summary, the SFT export and the
viewer all judge sessions with these three, so they agree; this module reads nothing and imports only `types`.
"""

from __future__ import annotations

from nemo_polar.types import SessionResult, TrajectoryStatus

__all__ = ["is_accepted", "repo_of", "usable"]


def repo_of(s: SessionResult) -> str:
    """`metadata.repo`, else `metadata.group_id`, else the task id."""
    md = s.metadata
    return str(md.get("repo") or md.get("group_id") or s.task_id)


def usable(s: SessionResult) -> bool:
    return s.status != TrajectoryStatus.ERROR.value and s.eval is not None and not s.eval.mask_sample


def is_accepted(s: SessionResult, accept_threshold: float = 1.0) -> bool:
    return usable(s) and s.reward >= accept_threshold
