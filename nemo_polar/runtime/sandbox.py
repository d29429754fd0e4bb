# SPDX-License-Identifier: Apache-2.0
"""The local sandbox: run one command under bubblewrap in a network namespace where only the proxy is reachable.

Layout inside the sandbox: the host's `/` read-only; a fresh `/tmp`; the host user's home hidden behind a tmpfs
(the nemo-polar cache and the Python installation stay visible read-only, so installed CLIs and venvs run); the
`hidden` directories (the gateway's run directory: other sessions' workdirs, the record store) behind empty
read-only tmpfs mounts; the session's private HOME and workdir bind-mounted read-write at their host paths, on
top; a read-only control directory holding the relay's unix socket, with only the connect trace writable. So
nothing the sandbox writes outside its workdir and HOME reaches the host (`/tmp` and the hidden host home are
sandbox-private memory). The environment is cleared and replaced by the caller's.

Network: `--unshare-net` gives the sandbox a namespace with only `lo`. The in-sandbox relay (`relay.py`) listens
on `127.0.0.1:<proxy port>` there and forwards each connection over the unix socket to `Sandbox`'s host-side
forwarder, which connects to the proxy. Every connection is logged on both sides (`SandboxResult.connections`,
`.forwarded`), so a test can prove that the proxy was the only destination: there is no other route out.

Timeouts and cancellation kill the whole sandbox (bubblewrap's process group; `--die-with-parent` and the pid
namespace take everything inside with it). This module knows nothing of harnesses or the proxy's protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_polar.errors import PolarError

__all__ = [
    "AGENT_HOME",
    "AGENT_WORKDIR",
    "RelayForwarder",
    "Sandbox",
    "SandboxError",
    "SandboxResult",
    "SandboxSpec",
    "bwrap_available",
    "host_cache_root",
]

# where a rollout session's HOME and workdir appear inside its sandbox: the same for every session and machine
AGENT_HOME = "/home/agent"
AGENT_WORKDIR = "/home/agent/workspace"
_INNER_ROOTS = ("/home", "/tmp")  # tmpfs mounts made here, so mount points for the paths above can be created

RELAY_SCRIPT = Path(__file__).with_name("relay.py")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_CHUNK = 64 * 1024
_TAIL = 64 * 1024
_CONNECT_TIMEOUT_S = 10.0
_TERM_GRACE_S = 3.0


class SandboxError(PolarError, RuntimeError):
    """The sandbox could not be set up (bubblewrap missing, bad paths)."""


def bwrap_available() -> str | None:
    """Path of the `bwrap` executable, or None (Debian package `bubblewrap`)."""
    return shutil.which("bwrap")


def host_cache_root() -> Path:
    override = os.environ.get("POLAR_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "nemo-polar"


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What one sandboxed run may see.

    workdir / home: host directories, bind-mounted read-write (at the same paths unless `workdir_at` / `home_at`).
    workdir_at / home_at: where they appear inside instead, e.g. `AGENT_WORKDIR` / `AGENT_HOME` (fixed paths, so
        prompts that name the working directory are the same for every session of a task; no host path leaks into
        training data). Must be under `/home` (then all of `/home` is replaced by an empty tmpfs) or `/tmp`.
    proxy_port: the host-side proxy's port on `proxy_host`; inside, the relay listens on 127.0.0.1:proxy_port.
    ro_binds / rw_binds: extra host paths to expose (same path inside), e.g. a harness install dir elsewhere.
    hide_host_home: put a tmpfs over the host user's home (the cache and Python stay visible read-only).
    hidden: host directories shown as empty and read-only inside (what is bound under them is mounted back on top):
        the gateway's run directory, so one session can read neither another's workdir nor the record store.
    """

    workdir: Path
    home: Path
    proxy_port: int
    proxy_host: str = "127.0.0.1"
    ro_binds: tuple[Path, ...] = ()
    rw_binds: tuple[Path, ...] = ()
    hide_host_home: bool = True
    hidden: tuple[Path, ...] = ()
    workdir_at: str | None = None
    home_at: str | None = None

    @property
    def inner_workdir(self) -> str:
        return self.workdir_at or str(self.workdir)

    @property
    def inner_home(self) -> str:
        return self.home_at or str(self.home)


@dataclass(frozen=True, slots=True)
class SandboxResult:
    exit_code: int | None
    timed_out: bool
    duration_s: float
    stdout: str
    stderr: str
    connections: list[dict[str, Any]] = field(default_factory=list)  # the in-sandbox relay's trace
    forwarded: int = 0  # connections the host-side forwarder passed on to the proxy

    @property
    def destinations(self) -> set[str]:
        return {str(e["dest"]) for e in self.connections if e.get("event") == "connect"}

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


class RelayForwarder:
    """The host side of the relay (used by the sandbox and by the container runtime): a unix socket whose every
    connection is piped to the proxy at `host:port`. `forwarded` counts the connections passed on, the number a
    sandboxed command cannot touch; `close()` stops listening and cancels the connections still open."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.forwarded = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self, path: Path) -> None:
        self._server = await asyncio.start_unix_server(self._forward, path=str(path))

    async def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), _CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            writer.close()
            return
        self.forwarded += 1
        try:
            await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
        finally:
            up_w.close()
            writer.close()


def _tail(path: Path) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - _TAIL))
        return fh.read().decode("utf-8", "replace")


def _read_trace(path: Path) -> list[dict[str, Any]]:
    """The relay's connect trace. The sandbox can write that file too: a line that is not an event is skipped,
    never fatal (the host-side `forwarded` count is the number the sandbox cannot touch)."""
    events = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    return events


def _read_child_pid(fd: int) -> int | None:
    """Read bwrap's `--info-fd` JSON (blocks until bwrap writes it or exits) and close the fd."""
    try:
        data = b""
        while chunk := os.read(fd, 4096):
            data += chunk
            if b"}" in data:
                break
    finally:
        os.close(fd)
    try:
        pid = json.loads(data.decode()).get("child-pid")
    except ValueError:
        return None
    return pid if isinstance(pid, int) else None


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class Sandbox:
    """One sandbox: `async with Sandbox(spec) as sb: result = await sb.run(argv, env=…, timeout_s=…)`."""

    def __init__(self, spec: SandboxSpec):
        if any(os.path.realpath(p) == "/" for p in spec.hidden):
            raise SandboxError("the root directory cannot be hidden")
        for inner in (spec.workdir_at, spec.home_at):
            if inner is not None and (
                not any(inner.startswith(r + "/") for r in _INNER_ROOTS) or os.path.normpath(inner) != inner
            ):
                raise SandboxError(f"in-sandbox path {inner!r} must be a normalised path under /home or /tmp")
        self.spec = spec
        if "/home" in self._inner_roots() and not os.path.isdir("/home"):
            raise SandboxError("this host has no /home to mount the agent's home under: use a path under /tmp")
        self._bwrap = bwrap_available()
        self._ctl: Path | None = None
        self._relay = RelayForwarder(spec.proxy_host, spec.proxy_port)

    async def __aenter__(self) -> Sandbox:
        if self._bwrap is None:
            raise SandboxError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
        for p in (self.spec.workdir, self.spec.home):
            if not p.is_absolute() or not p.is_dir():
                raise SandboxError(f"{p} must be an existing absolute directory")
        self._ctl = Path(tempfile.mkdtemp(prefix="polar-sandbox-"))
        (self._ctl / "connect.jsonl").touch()  # bound writable into the read-only control directory
        await self._relay.start(self._ctl / "relay.sock")
        return self

    @property
    def forwarded(self) -> int:
        """Connections the host side passed on to the proxy."""
        return self._relay.forwarded

    async def __aexit__(self, *exc: object) -> None:
        await self._relay.close()
        if self._ctl is not None:
            shutil.rmtree(self._ctl, ignore_errors=True)

    def _inner_roots(self) -> list[str]:
        inner = [p for p in (self.spec.workdir_at, self.spec.home_at) if p]
        return [r for r in _INNER_ROOTS if any(p.startswith(r + "/") for p in inner)]

    def bwrap_argv(self, argv: Sequence[str], env: Mapping[str, str], info_fd: int | None = None) -> list[str]:
        """The full bubblewrap command line for `argv` (exposed for inspection and tests)."""
        assert self._ctl is not None and self._bwrap is not None
        spec = self.spec
        out = [self._bwrap, "--die-with-parent", "--new-session"]
        if info_fd is not None:  # bwrap writes {"child-pid": …} there: the sandbox's init, seen from the host
            out += ["--info-fd", str(info_fd)]
        out += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        out += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        masks = [str(Path.home())] if spec.hide_host_home else []
        masks += [r for r in self._inner_roots() if r != "/tmp"]  # /home: other users' homes go too
        masks = list(dict.fromkeys(masks))
        # hidden dirs at their real paths (a mount follows links); one that does not exist hides nothing
        hidden_dirs = [os.path.realpath(h) for h in dict.fromkeys(spec.hidden) if os.path.isdir(h)]
        # keep what runs the harness visible even where it lives under the hidden home or the fresh /tmp (a checkout
        # or cache under /tmp): installed CLIs and venvs, the Python they point at, and the relay script
        ro: list[Path] = [*spec.ro_binds, host_cache_root(), Path(sys.prefix), Path(sys.base_prefix)]
        ro += [Path(sys.executable).parent, RELAY_SCRIPT.parent, RELAY_SCRIPT.parents[2]]
        # each at its real path, and also at the path it is used by when that goes through a symlink (a checkout's
        # `.venv` link into the cache), so `sys.executable` and the venv it belongs to work inside
        # (only where the alias is hidden: under the fresh /tmp or the hidden home; elsewhere the read-only root
        # already shows the link, and a mount point cannot be made over it)
        hidden = ["/tmp", *masks, *hidden_dirs]
        reals = {os.path.realpath(r) for r in ro}
        pairs: dict[tuple[str, str], None] = {}
        for r in ro:
            real, alias = os.path.realpath(r), os.path.abspath(r)
            pairs[(real, real)] = None
            visible = any(alias.startswith(x.rstrip("/") + "/") for x in reals)  # inside a bound tree: a link there
            if alias != real and not visible and any(alias.startswith(h.rstrip("/") + "/") for h in hidden):
                pairs[(real, alias)] = None
        # masks and read-only binds from the shallowest path down, so each shows through the ones above it (the
        # cache under the hidden home, the checkout's relay under a hidden run directory); at equal depth a mask
        # comes last, so a hidden directory is never shown again by a bind of the same path
        mounts = [(d, 0, ["--ro-bind-try", src, d]) for src, d in pairs]
        mounts += [(m, 1, ["--tmpfs", m]) for m in masks]
        mounts += [(h, 2, ["--tmpfs", h]) for h in hidden_dirs]
        for _, _, args in sorted(mounts, key=lambda m: (len(Path(m[0]).parts), m[1])):
            out += args
        for p in dict.fromkeys(spec.rw_binds):
            out += ["--bind", str(p), str(p)]
        out += ["--bind", str(spec.home), spec.inner_home]  # the home first: the workdir may be mounted inside it
        out += ["--bind", str(spec.workdir), spec.inner_workdir]
        trace = str(self._ctl / "connect.jsonl")
        out += ["--ro-bind", str(self._ctl), str(self._ctl), "--bind", trace, trace]
        for h in hidden_dirs:  # only the tmpfs itself: what was bound under it keeps its own mode
            out += ["--remount-ro", h]
        out += ["--clearenv"]
        merged = {"PATH": DEFAULT_PATH, **env}
        for k, v in merged.items():
            out += ["--setenv", k, v]
        out += ["--chdir", spec.inner_workdir, "--"]
        relay = [sys.executable, "-I", str(RELAY_SCRIPT), "--port", str(spec.proxy_port)]
        relay += ["--unix", str(self._ctl / "relay.sock"), "--trace", str(self._ctl / "connect.jsonl"), "--"]
        return out + relay + list(argv)

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
        stdout_path: Path | None = None,
        stderr_path: Path | None = None,
    ) -> SandboxResult:
        """Run `argv` in the sandbox; a timeout is data (`timed_out=True`), a cancellation kills and re-raises."""
        assert self._ctl is not None, "use `async with Sandbox(spec)`"
        out_path = stdout_path or self._ctl / "stdout.log"
        err_path = stderr_path or self._ctl / "stderr.log"
        trace = self._ctl / "connect.jsonl"
        trace.write_bytes(b"")  # emptied, not removed: it is bound into the sandbox by path
        start = time.monotonic()
        timed_out = False
        info_r, info_w = os.pipe()
        with out_path.open("wb") as out, err_path.open("wb") as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.bwrap_argv(argv, env, info_w),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    pass_fds=(info_w,),
                )
            finally:
                os.close(info_w)
            init_pid = asyncio.get_running_loop().run_in_executor(None, _read_child_pid, info_r)
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                timed_out = True
                await self._stop(proc, await init_pid)
            except asyncio.CancelledError:
                await asyncio.shield(self._stop_after_cancel(proc, init_pid))
                raise
            await init_pid
        events = _read_trace(trace)
        return SandboxResult(
            exit_code=None if timed_out else proc.returncode,
            timed_out=timed_out,
            duration_s=time.monotonic() - start,
            stdout=_tail(out_path),
            stderr=_tail(err_path),
            connections=events,
            forwarded=self.forwarded,
        )

    @staticmethod
    async def _stop(proc: asyncio.subprocess.Process, init_pid: int | None) -> None:
        """Kill bubblewrap's group, then wait until the sandbox's init (and with it the pid namespace) is gone."""
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), _TERM_GRACE_S)
        except TimeoutError:
            _kill_group(proc.pid, signal.SIGKILL)
            await proc.wait()
        if init_pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(init_pid, signal.SIGKILL)  # --die-with-parent does this too; do not rely on timing
        for _ in range(200):
            if not _alive(init_pid):
                return
            await asyncio.sleep(0.025)

    async def _stop_after_cancel(self, proc: asyncio.subprocess.Process, init_pid: asyncio.Future[int | None]) -> None:
        await self._stop(proc, await init_pid)
