# SPDX-License-Identifier: Apache-2.0
"""The rollout service: `TaskSpec`, the rollout server, gateway nodes with staged pools, and `PolarClient`.

Submodules: `spec` (TaskSpec and session spec), `task_options` (its option blocks checked at submit), `server` +
`journal` (scheduling, durable state, callbacks), `gateway` + `stages` (INIT / READY / RUNNING / POSTRUN), `runtime`
(the Runtime base, `isolation: none`), `proxylink` (the hosted proxy), `client` (`PolarClient`), `retry`,
`simulation` (a timed fake agent), `cli`.
"""

from nemo_polar.rollout.client import PolarClient, PolarClientError
from nemo_polar.rollout.spec import TaskSpec, TaskSpecError, dump_jsonl, load_jsonl

__all__ = ["PolarClient", "PolarClientError", "TaskSpec", "TaskSpecError", "dump_jsonl", "load_jsonl"]
