# SPDX-License-Identifier: Apache-2.0
"""The container engines (Docker, Podman): where their CLI is, how it is started and configured, and one helper to
run it. Nothing in `/etc` is changed and no system service is assumed.

Docker: unless `POLAR_DOCKER_HOST` names a daemon the user runs, a private `dockerd` is started on first use with
its own `--data-root` (under the cache dir), `--exec-root`, `--pidfile` and `-H unix://<socket>`, and with no
bridge and no iptables rules (every container of this project runs with `--network none`: no bridge is ever
needed). It keeps running for later sessions; `stop_docker()` stops it by its pid. Podman: every call gets
`CONTAINERS_CONF=<cache>/engines/podman/containers.conf` (runtime `runc`, cgroupfs, file events, ulimits within
what root may set here) and its own `--root` / `--runroot`, so its images and containers live under the cache too.

`Engine.run(*args)` runs one CLI command and returns its `CmdResult`; `Engine.argv(*args)` is the full argv for
callers that stream. This module knows nothing of images or sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from nemo_polar.errors import PolarError
from nemo_polar.runtime.sandbox import host_cache_root

__all__ = [
    "ENGINES",
    "CmdResult",
    "Engine",
    "EngineError",
    "engine_available",
    "get_engine",
    "stop_docker",
]

ENGINES = ("docker", "podman")
_DOCKER_READY_S = 60.0


class EngineError(PolarError, RuntimeError):
    """A container engine is not installed, could not be started, or a CLI call failed."""


@dataclass(frozen=True, slots=True)
class CmdResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass(frozen=True, slots=True)
class Engine:
    """One engine's CLI with the global flags and environment every call needs."""

    kind: str
    cli: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        return [*self.cli, *args]

    def environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def run_sync(self, *args: str, timeout_s: float = 600.0, input: bytes | None = None) -> CmdResult:
        try:
            proc = subprocess.run(
                self.argv(*args), env=self.environ(), capture_output=True, timeout=timeout_s, input=input
            )
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"{self.kind} {' '.join(args[:2])} timed out after {timeout_s}s") from exc
        return CmdResult(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))

    async def run(self, *args: str, timeout_s: float = 600.0) -> CmdResult:
        proc = await asyncio.create_subprocess_exec(
            *self.argv(*args),
            env=self.environ(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
            raise
        return CmdResult(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))

    def check(self, res: CmdResult, what: str) -> CmdResult:
        if not res.ok:
            raise EngineError(f"{self.kind} {what} failed (exit {res.returncode}): {res.stderr.strip()[-1500:]}")
        return res


def engine_available(kind: str) -> str | None:
    """Why `kind` cannot be used here (a sentence), or None when its programs are installed."""
    if kind == "docker":
        if os.environ.get("POLAR_DOCKER_HOST"):
            return None if _docker_cli() else "the docker CLI is not installed (apt-get install docker.io)"
        if shutil.which("dockerd") is None:
            return "dockerd is not installed (apt-get install docker.io, or `make deps`)"
        return None
    if kind == "podman":
        if shutil.which("podman") is None or shutil.which("runc") is None:
            return "podman / runc are not installed (apt-get install podman runc, or `make deps`)"
        return None
    return f"unknown container engine {kind!r} (known: {', '.join(ENGINES)})"


def get_engine(kind: str) -> Engine:
    """The engine `kind`, ready to use (a private dockerd is started when none answers)."""
    why = engine_available(kind)
    if why is not None:
        raise EngineError(why)
    if kind == "docker":
        return _docker()
    return _podman()


# ---------------------------------------------------------------------------------------------------------------
# docker


def _engines_dir() -> Path:
    return host_cache_root() / "engines"


def _docker_cli() -> str | None:
    """The docker CLI shipped next to dockerd (the same release) when there is one, else the one on PATH."""
    daemon = shutil.which("dockerd")
    if daemon is not None:
        for d in (Path(daemon).parent, Path("/usr/bin")):
            if (d / "docker").is_file():
                return str(d / "docker")
    return shutil.which("docker")


def _docker_paths() -> dict[str, Path]:
    root = _engines_dir() / "docker"
    # the exec root holds containerd's sockets: a short path (unix socket paths are limited to 108 bytes)
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:10]
    return {
        "root": root,
        "data": root / "data",
        "exec": Path(f"/tmp/polar-dockerd-{tag}"),
        "pid": root / "dockerd.pid",
        "sock": Path(f"/tmp/polar-dockerd-{tag}.sock"),
        "log": root / "dockerd.log",
    }


def _docker() -> Engine:
    cli = _docker_cli()
    if cli is None:
        raise EngineError("the docker CLI is not installed (apt-get install docker.io)")
    host = os.environ.get("POLAR_DOCKER_HOST")
    if host:
        return Engine("docker", (cli, "-H", host))
    p = _docker_paths()
    engine = Engine("docker", (cli, "-H", f"unix://{p['sock']}"))
    if _docker_ready(engine):
        return engine
    p["root"].mkdir(parents=True, exist_ok=True)
    lock = p["root"] / "start.lock"
    with open(lock, "w") as fh:
        import fcntl

        fcntl.flock(fh, fcntl.LOCK_EX)  # one starter at a time; the others find it ready
        if _docker_ready(engine):
            return engine
        _start_dockerd(p)
        deadline = time.monotonic() + _DOCKER_READY_S
        while time.monotonic() < deadline:
            if _docker_ready(engine):
                return engine
            if _pid_of(p["pid"]) is None and time.monotonic() > deadline - _DOCKER_READY_S + 5:
                break
            time.sleep(0.2)
    tail = p["log"].read_text(errors="replace")[-2000:] if p["log"].exists() else ""
    raise EngineError(f"dockerd did not become ready within {_DOCKER_READY_S}s; log {p['log']}:\n{tail}")


def _docker_ready(engine: Engine) -> bool:
    try:
        return engine.run_sync("version", "--format", "{{.Server.Version}}", timeout_s=10).ok
    except EngineError:
        return False


def _pid_of(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def _start_dockerd(p: dict[str, Path]) -> None:
    old = _pid_of(p["pid"])
    if old is not None:  # alive but not answering: stop it first
        _stop_pid(old)
    for key in ("data", "exec"):
        p[key].mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        p["sock"].unlink()
    argv = [
        str(shutil.which("dockerd")),
        "--data-root",
        str(p["data"]),
        "--exec-root",
        str(p["exec"]),
        "--pidfile",
        str(p["pid"]),
        "-H",
        f"unix://{p['sock']}",
        "--bridge",
        "none",  # containers run with --network none: no bridge (and no private-range addresses) at all
        "--iptables=false",
        "--ip-masq=false",
        "--ip-forward=false",
        "--containerd-namespace",
        "polar",
        "--containerd-plugins-namespace",
        "polar-plugins",
    ]
    with open(p["log"], "ab") as log:
        subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)


def _stop_pid(pid: int, grace_s: float = 15.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def stop_docker() -> bool:
    """Stop the private dockerd (by its pidfile); True when one was running."""
    p = _docker_paths()
    pid = _pid_of(p["pid"])
    if pid is None:
        return False
    _stop_pid(pid)
    return True


# ---------------------------------------------------------------------------------------------------------------
# podman


def _podman_conf() -> Path:
    """The project's containers.conf (rewritten when its content changes)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nofile = hard if hard != resource.RLIM_INFINITY else 1048576
    text = (
        "# written by nemo_polar.runtime.engines; selected with CONTAINERS_CONF, nothing in /etc is used or changed\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=32768:32768"]\n'
        'netns = "none"\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )
    path = _engines_dir() / "podman" / "containers.conf"
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def _podman() -> Engine:
    root = _engines_dir() / "podman"
    conf = _podman_conf()
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:10]
    cli = (
        str(shutil.which("podman")),
        "--root",
        str(root / "storage"),
        "--runroot",
        f"/tmp/polar-podman-{tag}",
        "--runtime",
        str(shutil.which("runc")),
    )
    return Engine("podman", cli, {"CONTAINERS_CONF": str(conf)})
