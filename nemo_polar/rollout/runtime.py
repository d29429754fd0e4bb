# SPDX-License-Identifier: Apache-2.0
"""The `Runtime` base the gateway and the evaluators use, and the plain local runtime (`isolation: none`).

A runtime is one session's private copy of the task repo (`workdir`) with a private HOME and tmp: commands run
in it with a timeout, files are uploaded into it, `diff()` returns everything changed since it was created (a git
baseline taken at creation, so the agent's own commits are included), `destroy()` kills what still runs and
removes it. Every command runs in its own process group; a timeout or a cancellation kills the whole group.

`LocalRuntime` runs plain host processes: no sandbox, no network isolation; it is only chosen when a task says
`isolation: none`. `SandboxRuntime` (the default, `isolation: sandbox`) runs each command through the bubblewrap
sandbox of `nemo_polar.runtime`. This module knows nothing of agents or evaluators.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nemo_polar.errors import PolarError
from nemo_polar.rollout.spec import RuntimeSpec

__all__ = [
    "ExecResult",
    "LocalRuntime",
    "Runtime",
    "RuntimeSetupError",
    "SandboxRuntime",
    "create_runtime",
    "run_command",
]

_TAIL = 64 * 1024
_GIT_EXCLUDES = "__pycache__/\n*.pyc\n.pytest_cache/\n.polar/\n"


class RuntimeSetupError(PolarError, RuntimeError):
    """A runtime could not be created (bad source, unavailable isolation, setup command failed)."""


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Runtime(ABC):
    """One session's runtime. `workdir` / `home` are host paths (setup, git bookkeeping, evaluators' file reads);
    `agent_workdir` / `agent_home` are the same directories as the commands run by `exec` see them (a sandbox mounts
    them at fixed paths), which is what goes into a harness's configuration and command line.

    `exec` is written here once; a runtime says how a command runs (`_run`: a host process, a sandbox, a container)
    and which environment it gets (`base_env`, `exec_env`)."""

    session_id: str
    workdir: Path
    home: Path

    @property
    @abstractmethod
    def agent_workdir(self) -> str: ...

    @property
    @abstractmethod
    def agent_home(self) -> str: ...

    @abstractmethod
    def base_env(self) -> dict[str, str]:
        """The environment every command starts from (PATH, HOME, locale, the task's `env`)."""

    def exec_env(self) -> dict[str, str]:
        """What this runtime sets over `base_env()` for every `exec` (a sandbox's own /tmp); the caller's `env` goes
        over it. None on the host."""
        return {}

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        stdout_path: Path | None = None,
    ) -> ExecResult:
        """Run `command` (a string runs under `/bin/sh -c`) with `base_env()`, `exec_env()` and `env` over each other,
        through this runtime's `_run`."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        full_env = self.base_env()
        full_env.update(self.exec_env())
        full_env.update(env or {})
        return await self._run(argv, full_env, timeout_s, stdout_path)

    @abstractmethod
    async def _run(
        self, argv: list[str], env: dict[str, str], timeout_s: float, stdout_path: Path | None
    ) -> ExecResult:
        """Run `argv` with exactly `env` in the workdir; a timeout or a cancellation kills the whole group."""

    @abstractmethod
    async def write_file(self, rel: str, data: str | bytes, mode: int = 0o644) -> None: ...

    @abstractmethod
    async def upload_dir(self, src: Path, rel: str) -> None: ...

    @abstractmethod
    async def diff(self) -> str: ...

    @abstractmethod
    async def destroy(self) -> None: ...


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _inside(root: Path, rel: str) -> Path:
    path = (root / rel).resolve()
    if path != root.resolve() and root.resolve() not in path.parents:
        raise RuntimeSetupError(f"path {rel!r} escapes the workdir")
    return path


class LocalRuntime(Runtime):
    """A per-session directory with plain host processes (`isolation: none`)."""

    def __init__(self, session_id: str, root: Path, spec: RuntimeSpec):
        self.session_id = session_id
        self.root = root = root.absolute()
        self.workdir = root / "workdir"
        self.home = root / "home"
        self.tmp = root / "tmp"
        self.spec = spec
        self._groups: set[int] = set()
        self._base_sha: str | None = None

    @property
    def agent_workdir(self) -> str:
        return str(self.workdir)

    @property
    def agent_home(self) -> str:
        return str(self.home)

    @classmethod
    async def create(cls, session_id: str, spec: RuntimeSpec, root: Path) -> LocalRuntime:
        rt = cls(session_id, root, spec)
        try:
            await asyncio.to_thread(rt._populate)
            await rt._baseline()
        except BaseException:
            await rt.destroy()
            raise
        return rt

    def _populate(self) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
        for d in (self.workdir, self.home, self.tmp):
            d.mkdir(parents=True)
        source = self.spec.source
        if source is None:
            return
        if source.startswith("example:"):
            from nemo_polar import examples

            try:
                examples.materialize(source.split(":", 1)[1], self.workdir)
            except KeyError as exc:
                raise RuntimeSetupError(str(exc)) from exc
            return
        src = Path(source)
        if not src.is_dir():
            raise RuntimeSetupError(f"runtime source {source!r} is not a directory")
        shutil.copytree(src, self.workdir, dirs_exist_ok=True, symlinks=True, ignore=shutil.ignore_patterns(".git"))

    def base_env(self) -> dict[str, str]:
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
        env = {
            "PATH": path,
            "HOME": self.agent_home,
            "TMPDIR": str(self.tmp),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "POLAR_SESSION_ID": self.session_id,
        }
        env.update(self.spec.env)
        return env

    async def _git(self, *args: str, timeout_s: float = 60.0) -> ExecResult:
        argv = ["git", "-c", "user.name=polar", "-c", "user.email=polar@localhost", "-c", "commit.gpgsign=false"]
        return await self._host_run([*argv, *args], self.base_env(), timeout_s, None)  # bookkeeping: never sandboxed

    async def _baseline(self) -> None:
        for step in (("init", "-q"), ("add", "-A"), ("commit", "-q", "--allow-empty", "-m", "polar baseline")):
            res = await self._git(*step)
            if not res.ok:
                raise RuntimeSetupError(f"git {step[0]} failed: {res.stderr.strip()[-500:]}")
            if step[0] == "init":  # build debris never counts as the agent's change
                (self.workdir / ".git" / "info").mkdir(exist_ok=True)
                (self.workdir / ".git" / "info" / "exclude").write_text(_GIT_EXCLUDES)
        head = await self._git("rev-parse", "HEAD")
        self._base_sha = head.stdout.strip()

    async def _run(
        self, argv: list[str], env: dict[str, str], timeout_s: float, stdout_path: Path | None
    ) -> ExecResult:
        return await self._host_run(argv, env, timeout_s, stdout_path)

    async def _host_run(
        self, argv: list[str], env: dict[str, str], timeout_s: float, stdout_path: Path | None
    ) -> ExecResult:
        async def kill(proc: asyncio.subprocess.Process) -> None:
            _kill_group(proc.pid)

        return await run_command(
            argv,
            env=env,
            cwd=self.workdir,
            timeout_s=timeout_s,
            stdout_path=stdout_path,
            on_timeout=kill,
            on_cancel=kill,
            groups=self._groups,
        )

    async def write_file(self, rel: str, data: str | bytes, mode: int = 0o644) -> None:
        await asyncio.to_thread(_write, _inside(self.workdir, rel), data, mode)

    async def upload_dir(self, src: Path, rel: str) -> None:
        await asyncio.to_thread(_copy_dir, src, _inside(self.workdir, rel))

    async def diff(self) -> str:
        if self._base_sha is None:
            return ""
        add = await self._git("add", "-A")
        if not add.ok:
            raise RuntimeSetupError(f"git add failed: {add.stderr.strip()[-500:]}")
        res = await self._git("diff", "--cached", "--binary", self._base_sha)
        if not res.ok:
            raise RuntimeSetupError(f"git diff failed: {res.stderr.strip()[-500:]}")
        return res.stdout

    async def destroy(self) -> None:
        for pgid in list(self._groups):
            _kill_group(pgid)
        self._groups.clear()
        await asyncio.to_thread(shutil.rmtree, self.root, True)


async def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout_s: float,
    stdout_path: Path | None,
    on_timeout: Callable[[asyncio.subprocess.Process], Awaitable[None]],
    on_cancel: Callable[[asyncio.subprocess.Process], Awaitable[None]],
    cwd: Path | None = None,
    groups: set[int] | None = None,
) -> ExecResult:
    """Run `argv` in a new session (its own process group) with stdin closed, and wait at most `timeout_s`.

    stdout and stderr are captured (their last 64 KiB kept), or, with `stdout_path`, both written to that file and
    its tail returned as stdout. `on_timeout` stops the command when the time is up (its output so far is still
    collected); `on_cancel` when the caller is cancelled (shielded, then the cancellation goes on). With `groups`,
    the process group is registered there while it runs (the runtime's `destroy()` kills what is registered) and
    killed when the command ends (what it backgrounded). A command that cannot start is an `ExecResult` with no exit
    code, never an exception. Shared by the local, sandbox-free path and the container runtime's engine CLI."""
    out_file = await asyncio.to_thread(_open_log, stdout_path) if stdout_path is not None else None
    t0 = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out_file if out_file is not None else asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if out_file is not None else asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        if out_file is not None:
            out_file.close()
        return ExecResult(None, "", f"cannot start {argv[0]!r}: {exc}", False, time.monotonic() - t0)
    if groups is not None:
        groups.add(proc.pid)
    timed_out = False
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    except TimeoutError:
        timed_out = True
        await on_timeout(proc)
        out, err = await proc.communicate()
    except BaseException:  # cancellation: stop the command, then re-raise
        await asyncio.shield(on_cancel(proc))
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    finally:
        if out_file is not None:
            out_file.close()
        if groups is not None:
            _kill_group(proc.pid)  # leftovers the command backgrounded
            groups.discard(proc.pid)
    if stdout_path is not None:
        out = _tail_bytes(stdout_path)
    return ExecResult(
        proc.returncode,
        (out or b"").decode(errors="replace")[-_TAIL:],
        (err or b"").decode(errors="replace")[-_TAIL:],
        timed_out,
        time.monotonic() - t0,
    )


def _open_log(path: Path) -> IO[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")


def _write(path: Path, data: str | bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)


def _copy_dir(src: Path, dest: Path) -> None:
    if not src.is_dir():
        raise RuntimeSetupError(f"upload_dir source {str(src)!r} is not a directory")
    shutil.copytree(src, dest, dirs_exist_ok=True, symlinks=True)


def _tail_bytes(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - _TAIL))
        return f.read()


class SandboxRuntime(LocalRuntime):
    """The same per-session directory, but every command runs under bubblewrap (`nemo_polar.runtime.Sandbox`):
    read-only system, private HOME / tmp, writable workdir, and a network namespace whose only route out is the
    proxy's loopback port. The directory holding `root` (with the session's other runtimes) and `hidden` (the
    gateway's run directory: other sessions, the record store) are empty inside. The git bookkeeping (baseline,
    diff) stays on the host. Inside, the HOME and workdir are at the fixed `AGENT_HOME` / `AGENT_WORKDIR`
    (`/home/agent`, `/home/agent/workspace`), so prompts naming the working directory are identical across sessions,
    samples and machines (prefix-cache sharing within a GRPO group, token-exact counterfactual replays)."""

    def __init__(self, session_id: str, root: Path, spec: RuntimeSpec, proxy_port: int, hidden: Sequence[Path] = ()):
        super().__init__(session_id, root, spec)
        self.proxy_port = proxy_port
        parent = self.root.parent
        self.hidden = tuple(dict.fromkeys([*([parent] if parent != parent.parent else []), *hidden]))
        self._sandbox: Any = None

    @property
    def agent_workdir(self) -> str:
        from nemo_polar.runtime.sandbox import AGENT_WORKDIR

        return AGENT_WORKDIR

    @property
    def agent_home(self) -> str:
        from nemo_polar.runtime.sandbox import AGENT_HOME

        return AGENT_HOME

    @classmethod
    async def create_sandboxed(
        cls, session_id: str, spec: RuntimeSpec, root: Path, proxy_port: int, hidden: Sequence[Path] = ()
    ) -> SandboxRuntime:
        from nemo_polar.runtime.sandbox import Sandbox, SandboxError, SandboxSpec

        rt = cls(session_id, root, spec, proxy_port, hidden)
        try:
            await asyncio.to_thread(rt._populate)
            await rt._baseline()
            sb_spec = SandboxSpec(
                workdir=rt.workdir,
                home=rt.home,
                proxy_port=proxy_port,
                hidden=rt.hidden,
                workdir_at=rt.agent_workdir,
                home_at=rt.agent_home,
            )
            rt._sandbox = Sandbox(sb_spec)
            await rt._sandbox.__aenter__()
        except SandboxError as exc:
            await rt.destroy()
            raise RuntimeSetupError(str(exc)) from exc
        except BaseException:
            await rt.destroy()
            raise
        return rt

    def exec_env(self) -> dict[str, str]:
        return {"TMPDIR": "/tmp"}  # the sandbox has its own /tmp

    async def _run(
        self, argv: list[str], env: dict[str, str], timeout_s: float, stdout_path: Path | None
    ) -> ExecResult:
        stderr_path = stdout_path.with_name(stdout_path.stem + ".stderr.log") if stdout_path is not None else None
        res = await self._sandbox.run(
            argv, env=env, timeout_s=timeout_s, stdout_path=stdout_path, stderr_path=stderr_path
        )
        return ExecResult(res.exit_code, res.stdout, res.stderr, res.timed_out, res.duration_s)

    async def destroy(self) -> None:
        if self._sandbox is not None:
            sandbox, self._sandbox = self._sandbox, None
            await sandbox.__aexit__(None, None, None)
        await super().destroy()


async def create_runtime(
    session_id: str,
    spec: RuntimeSpec,
    root: Path,
    *,
    proxy_port: int | None = None,
    hidden: Sequence[Path] = (),
    owner: str | None = None,
) -> Runtime:
    """A runtime for `spec`: `local` + `isolation: none` is a plain directory with host processes; `local` +
    `isolation: sandbox` runs every command under bubblewrap with only `proxy_port` reachable and the `hidden`
    directories (the gateway's run directory) empty; `docker` / `podman` run a long-lived container from
    `spec.image` (`nemo_polar.runtime.container`), labelled with `owner` (default: derived from the first `hidden`
    directory, the gateway's work dir) so a restarted gateway reaps what a killed one left. Other
    kinds (apptainer) fail explicitly — never silently unsandboxed."""
    if spec.kind == "local" and spec.isolation == "none":
        return await LocalRuntime.create(session_id, spec, root)
    if spec.kind == "local":
        # with no proxy the relay's port leads nowhere: the sandbox then has no route out at all
        return await SandboxRuntime.create_sandboxed(session_id, spec, root, proxy_port or 9, hidden)
    if spec.kind in ("docker", "podman"):
        from nemo_polar.runtime.container import ContainerRuntime, gateway_owner

        if owner is None:
            owner = gateway_owner(hidden[0] if hidden else root)
        return await ContainerRuntime.create_container(session_id, spec, root, proxy_port=proxy_port or 9, owner=owner)
    raise RuntimeSetupError(f"runtime kind {spec.kind!r} is not available on this gateway (local, docker, podman)")
