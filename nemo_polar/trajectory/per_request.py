# SPDX-License-Identifier: Apache-2.0
"""The `per_request` builder: one trace per successful call (lossless, fragmented).

Each trace's `prompt_ids` is the call's prompt exactly as the model saw it and `response_ids` its sampled tokens,
with the loss mask on the sampled tokens only (0 where a policy masks the call). Dropped side calls make no
trace. No chains, no merging; this module does not classify subagents beyond the call kind.
"""

from __future__ import annotations

from collections.abc import Iterable

from nemo_polar.types import CompletionRecord, Trace, Trajectory

from .common import DROP, TRAIN, Tally, call_policy, finish_trajectory, trace_reward, usable_records
from .options import BuildOptions

__all__ = ["build_per_request"]


def build_per_request(records: Iterable[CompletionRecord], options: BuildOptions) -> Trajectory:
    ok, failed = usable_records(records)
    tally = Tally(records=len(ok))
    traces: list[Trace] = []
    for rec in ok:
        kind = options.call_kind(rec)
        gen = rec.generation_token_ids
        tally.sampled_tokens += len(gen)
        policy = call_policy(rec, kind, options, tally)
        if policy == DROP:
            continue
        n = len(gen)
        if policy == TRAIN:
            mask = [1] * n
            lps = list(rec.generation_log_probs)
        else:
            mask = [0] * n
            lps = [0.0] * n
        traces.append(
            Trace(
                prompt_ids=list(rec.prompt_token_ids),
                response_ids=list(gen),
                loss_mask=mask,
                response_logprobs=lps,
                call_spans=[(rec.id, 0, n)],
                chain_kind=kind,
                reward=trace_reward(kind, options),
                metadata={
                    "builder": "per_request",
                    "session_id": rec.session_id,
                    "records": [rec.id],
                    "policies": [policy],
                },
            )
        )
    return finish_trajectory(traces, tally, failed=failed)
