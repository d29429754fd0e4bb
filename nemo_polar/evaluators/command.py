# SPDX-License-Identifier: Apache-2.0
"""`command`: run a command in the session's runtime (or a fresh one) and score it.

Options: `command` (str or argv, required), `reward_file` (workdir-relative; when it exists after the command its
content is the reward, a float), `fresh` (bool: run on a fresh runtime with the agent's diff applied instead of
the agent's own), `timeout_s` (default 300). Without a reward file the reward is 1.0 for exit status 0, else 0.0.
A command that cannot run at all is an infrastructure failure (masked); a wrong reward file is not.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from nemo_polar.evaluators.base import EvalContext, failure, read_options, register_evaluator
from nemo_polar.evaluators.patching import apply_diff
from nemo_polar.types import EvalResult


class CommandOptions(BaseModel):
    """`command` options (the keys above), checked when a task is submitted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | list[str] = Field(min_length=1)
    reward_file: str | None = None
    fresh: bool = False
    timeout_s: float = Field(default=300.0, gt=0)


@register_evaluator("command", options=CommandOptions)
async def command(ctx: EvalContext) -> EvalResult:
    opts = read_options(CommandOptions, ctx, "command evaluator options")
    if isinstance(opts, EvalResult):
        return opts
    cmd, timeout_s = opts.command, opts.timeout_s
    if opts.fresh:
        if ctx.fresh_runtime is None:
            return failure("runtime_unavailable", "no fresh runtime factory", mask_sample=True)
        rt = await ctx.fresh_runtime()
        applied = await apply_diff(rt, ctx.diff)
        if applied is not None:
            return failure("patch_apply_failed", applied, mask_sample=False)
    else:
        if ctx.runtime is None:
            return failure("runtime_unavailable", "the session runtime is gone", mask_sample=True)
        rt = ctx.runtime
    res = await rt.exec(cmd, timeout_s=timeout_s)
    details = {
        "exit_code": res.exit_code,
        "timed_out": res.timed_out,
        "output_tail": (res.stdout + res.stderr)[-4000:],
    }
    if res.exit_code is None and not res.timed_out:
        return failure("command_not_runnable", res.stderr, mask_sample=True, **details)
    if res.timed_out:
        return failure("command_timeout", f"command exceeded {timeout_s}s", mask_sample=False, **details)
    reward_file = opts.reward_file
    if reward_file:
        path = rt.workdir / str(reward_file)
        if path.is_file():
            try:
                reward = float(path.read_text().strip())
            except ValueError:
                return failure(
                    "bad_reward_file", f"{reward_file} does not hold a number", mask_sample=False, **details
                )
            return EvalResult(reward=reward, resolved=reward > 0, details=details)
    ok = res.exit_code == 0
    return EvalResult(reward=1.0 if ok else 0.0, resolved=ok, details=details)
