# SPDX-License-Identifier: Apache-2.0
"""Apply an agent's unified diff to a runtime's workdir: `git apply`, then `patch --fuzz` as SWE-bench does.

Returns None on success or the tools' error text. It never raises for a bad patch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nemo_polar.rollout.runtime import Runtime

__all__ = ["PATCH_PATH", "apply_diff"]

PATCH_PATH = ".polar/agent.patch"


async def apply_diff(rt: Runtime, diff: str, *, timeout_s: float = 120.0, path: str = PATCH_PATH) -> str | None:
    if not diff.strip():
        return None
    await rt.write_file(path, diff if diff.endswith("\n") else diff + "\n")
    errors = []
    for cmd in (
        ["git", "apply", "--whitespace=nowarn", path],
        ["patch", "--batch", "--fuzz=5", "-p1", "-i", path],
    ):
        res = await rt.exec(cmd, timeout_s=timeout_s)
        if res.ok:
            return None
        errors.append(f"{cmd[0]}: exit {res.exit_code}: {(res.stdout + res.stderr).strip()[-1500:]}")
    return "\n".join(errors)
