# SPDX-License-Identifier: Apache-2.0
"""Run one harness CLI, configured by its adapter, inside the local sandbox against a proxy on loopback.

`run_harness` writes the adapter's files into the private HOME, builds the environment (a minimal base plus the
adapter's variables, with `env_unset` removed), and runs the adapter's argv in a `Sandbox` whose only route out
is the proxy's port. It returns the `SandboxResult` (exit code, output tails, connect trace). It knows the proxy
only as a port and a key; it does not create proxy sessions or build trajectories.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from nemo_polar.errors import PolarError
from nemo_polar.harness_adapters import HarnessAdapter, HarnessContext
from nemo_polar.harness_adapters.install import status as install_status
from nemo_polar.runtime.sandbox import DEFAULT_PATH, Sandbox, SandboxResult, SandboxSpec

__all__ = ["HarnessNotInstalled", "base_env", "make_context", "run_harness", "write_home"]


class HarnessNotInstalled(PolarError, RuntimeError):
    """The adapter's pinned CLI is not in the cache (`polar harness install NAME`)."""


def base_env() -> dict[str, str]:
    """What every harness gets before its adapter's variables: PATH (with node), a UTF-8 locale, a dumb terminal."""
    return {"PATH": os.environ.get("PATH", DEFAULT_PATH), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb"}


def make_context(
    adapter: HarnessAdapter,
    *,
    base_url: str,
    api_key: str,
    model: str,
    workdir: Path,
    home: Path,
    **extra: object,
) -> HarnessContext:
    """A `HarnessContext` with the install dir of the adapter's pinned package filled in (checked installed)."""
    st = install_status(adapter)
    if not st.installed:
        raise HarnessNotInstalled(f"{adapter.name} is not installed: run `polar harness install {adapter.name}`")
    return HarnessContext(
        base_url=base_url,
        api_key=api_key,
        model=model,
        workdir=str(workdir),
        home=str(home),
        install_dir=str(st.path) if st.path else None,
        **extra,  # type: ignore[arg-type]
    )


def write_home(adapter: HarnessAdapter, ctx: HarnessContext, host_home: Path | None = None) -> list[Path]:
    """Write the adapter's files under `host_home` (default `ctx.home`: the sandbox shows it at the same path);
    returns their paths."""
    home = host_home or Path(ctx.home)
    written = []
    for rel, text in adapter.prepare(ctx).items():
        path = (home / rel).resolve()
        if not path.is_relative_to(home.resolve()):
            raise ValueError(f"{adapter.name}: {rel!r} escapes the session HOME")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def harness_env(
    adapter: HarnessAdapter, ctx: HarnessContext, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    env = {**base_env(), **adapter.env(ctx), **(extra or {})}
    for var in adapter.env_unset:
        env.pop(var, None)
    return env


def _log_paths(out_dir: Path | None) -> tuple[Path | None, Path | None]:
    if out_dir is None:
        return None, None
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir / "harness.stdout", out_dir / "harness.stderr"


async def run_harness(
    adapter: HarnessAdapter,
    ctx: HarnessContext,
    instruction: str,
    *,
    timeout_s: float,
    out_dir: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    host_workdir: Path | None = None,
    host_home: Path | None = None,
) -> SandboxResult:
    """Run the adapter's CLI on `instruction` in a fresh sandbox; the proxy is `ctx.base_url`'s loopback port.

    `ctx.workdir` / `ctx.home` are the paths the CLI sees. With `host_workdir` / `host_home` they are in-sandbox
    paths (e.g. `AGENT_WORKDIR` / `AGENT_HOME`) at which those host directories are mounted; without, the host
    directories are shown at their own paths."""
    url = urlsplit(ctx.base_url)
    if url.hostname != "127.0.0.1" or url.port is None:
        raise ValueError(f"the proxy must be on 127.0.0.1 with an explicit port, got {ctx.base_url!r}")
    write_home(adapter, ctx, host_home)
    spec = SandboxSpec(
        workdir=host_workdir or Path(ctx.workdir),
        home=host_home or Path(ctx.home),
        proxy_port=url.port,
        workdir_at=ctx.workdir if host_workdir else None,
        home_at=ctx.home if host_home else None,
    )
    stdout_path, stderr_path = _log_paths(out_dir)
    async with Sandbox(spec) as sandbox:
        return await sandbox.run(
            adapter.command(ctx, instruction),
            env=harness_env(adapter, ctx, extra_env),
            timeout_s=timeout_s,
            stdout_path=stdout_path,
            stderr_path=stderr_path,
        )
