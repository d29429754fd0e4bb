# SPDX-License-Identifier: Apache-2.0
"""The container runtime (`runtime.kind: docker | podman`): one long-lived container per session from the task's
image, driven through the engine's CLI (`nemo_polar.runtime.engines`).

Layout: the session's workdir is a host directory (filled from `RuntimeSpec.source`, or copied out of the image's
working directory, cached per image id) bind-mounted read-write at the image's working directory (`/testbed` for
SWE-bench images); the private HOME at `/home/agent`; the installed harness CLIs (`<cache>/harnesses`), the Node
runtime and the Python running this process read-only at their host paths (so every adapter's command line works
unchanged); a read-only control directory at `/polar-ctl` with the relay's unix socket. The git bookkeeping
(baseline, `diff()`) stays on the host, as for the bubblewrap runtime, so both grade alike.

Network: `--network none` (only `lo`); the container's first process is `relay.py` (run by the image's
`python3`), listening on `127.0.0.1:<proxy port>` and forwarding each connection over the bind-mounted unix
socket to a host-side forwarder that connects to the proxy. No other route exists. Limits: `--cpus`,
`--memory` from `RuntimeSpec`, `--pids-limit`, no new privileges.

Cleanup: `destroy()` removes the container on every exit path; each container carries the label
`polar.owner=<gateway owner>` so `reap(owner)` (called when a gateway starts) removes what a killed gateway left.
Commands get the image's own PATH (plus SWE-bench's `testbed` conda env when the image has one, as SWE-bench's
eval scripts activate it), so `polar data swe-gym` rows run unmodified when their image is present.
Image requirements: `/bin/sh`, `python3` (>= 3.8) on PATH, glibc (for the mounted Node and harness binaries).
A missing image is a per-task setup error naming `polar image build`; nothing is pulled implicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import shutil
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_polar.rollout.runtime import ExecResult, LocalRuntime, RuntimeSetupError, run_command
from nemo_polar.rollout.spec import RuntimeSpec
from nemo_polar.runtime.engines import Engine, EngineError, get_engine
from nemo_polar.runtime.sandbox import AGENT_HOME, RELAY_SCRIPT, RelayForwarder, host_cache_root

__all__ = ["CTL_DIR", "ContainerRuntime", "gateway_owner", "image_workdir", "reap"]

log = logging.getLogger(__name__)

CTL_DIR = "/polar-ctl"
DEFAULT_WORKDIR = "/testbed"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# SWE-bench / SWE-Gym images keep the task's Python in this conda env (activated by their eval scripts)
SWEBENCH_ENV_BIN = "/opt/miniconda3/envs/testbed/bin"
PIDS_LIMIT = 4096
_LABEL = "polar.owner"
_PY_FIND = (  # the relay runs on the image's own Python
    "for p in python3 /opt/miniconda3/bin/python3 /usr/bin/python3; do "
    'command -v $p >/dev/null && exec $p "$@"; done; echo "no python3 in the image" >&2; exit 127'
)


def gateway_owner(work_dir: Path | str) -> str:
    """The owner label of a gateway's containers: a digest of its work directory (a gateway restarted on the same
    work dir is the same owner; two live gateways never share one)."""
    return "gw-" + hashlib.sha256(str(Path(work_dir).resolve()).encode()).hexdigest()[:16]


def reap(owner: str, kinds: Sequence[str] = ("docker", "podman")) -> int:
    """Remove every container labelled `polar.owner=<owner>` (left by a gateway that was killed); returns the number
    removed. A Docker daemon that is not running is not started for this (it can hold no live containers)."""
    removed = 0
    for kind in kinds:
        try:
            engine = _engine_if_running(kind)
        except EngineError:
            continue
        if engine is None:
            continue
        res = engine.run_sync("ps", "-a", "-q", "--filter", f"label={_LABEL}={owner}", timeout_s=60)
        ids = res.stdout.split() if res.ok else []
        if ids:
            engine.run_sync("rm", "-f", *ids, timeout_s=120)
            removed += len(ids)
    return removed


def _engine_if_running(kind: str) -> Engine | None:
    from nemo_polar.runtime import engines

    if engines.engine_available(kind) is not None:
        return None
    if kind == "docker" and not os.environ.get("POLAR_DOCKER_HOST"):
        if engines._pid_of(engines._docker_paths()["pid"]) is None:
            return None
    if kind == "podman" and not (host_cache_root() / "engines" / "podman" / "storage").exists():
        return None  # never used here: nothing to reap
    return get_engine(kind)


async def image_workdir(engine: Engine, image: str) -> tuple[str, str, str]:
    """(image id, working directory, PATH) of a present image; `RuntimeSetupError` naming `polar image build` when
    it is absent (nothing is pulled implicitly)."""
    res = await engine.run("image", "inspect", image, timeout_s=60)
    if not res.ok:
        raise RuntimeSetupError(
            f"image {image} not present in {engine.kind}: pull it or run `polar image build` "
            f"({res.stderr.strip()[-300:]})"
        )
    info = json.loads(res.stdout)[0]  # the same keys on Docker and Podman
    config = info.get("Config") or {}
    env = config.get("Env") or []
    path = next((e.split("=", 1)[1] for e in env if e.startswith("PATH=")), DEFAULT_PATH)
    return str(info["Id"]), (config.get("WorkingDir") or DEFAULT_WORKDIR), path


def _host_mounts() -> list[str]:
    """Read-only host paths every container sees at the same path: the harness CLIs, Node, this Python."""
    paths: list[Path] = [host_cache_root() / "harnesses", Path(sys.prefix), Path(sys.base_prefix)]
    paths.append(Path(sys.executable).parent)
    paths.append(RELAY_SCRIPT.parents[2])  # the checkout or site-packages holding nemo_polar (simulation agent)
    node = shutil.which("node")
    out: dict[str, None] = {}
    for p in paths:
        if p.exists():
            real = os.path.realpath(p)
            out[real] = None
            if os.path.abspath(p) != real:
                out[os.path.abspath(p)] = None  # a venv link: shown at the path it is used by too
    mounts = [f"{p}:{p}:ro" for p in out if p not in ("/", "/usr", "/bin", "/lib")]
    if node is not None:
        mounts.append(f"{os.path.realpath(node)}:/usr/local/bin/node:ro")
    return mounts


class ContainerRuntime(LocalRuntime):
    """A session runtime in a long-lived container (see the module docstring)."""

    def __init__(self, session_id: str, root: Path, spec: RuntimeSpec, proxy_port: int, owner: str):
        super().__init__(session_id, root, spec)
        self.proxy_port = proxy_port
        self.owner = owner
        self.engine: Engine | None = None
        self.container: str | None = None
        self.image_id = ""
        self.container_workdir = DEFAULT_WORKDIR
        self.path = DEFAULT_PATH
        self.start_s = 0.0
        self._ctl: Path | None = None
        self._relay = RelayForwarder("127.0.0.1", proxy_port)

    @property
    def agent_workdir(self) -> str:
        return self.container_workdir

    @property
    def agent_home(self) -> str:
        return AGENT_HOME

    @classmethod
    async def create_container(
        cls, session_id: str, spec: RuntimeSpec, root: Path, *, proxy_port: int, owner: str
    ) -> ContainerRuntime:
        if not spec.image:
            raise RuntimeSetupError(f"runtime kind {spec.kind!r} needs runtime.image")
        rt = cls(session_id, root, spec, proxy_port, owner)
        try:
            try:
                rt.engine = await asyncio.to_thread(get_engine, spec.kind)
            except EngineError as exc:
                raise RuntimeSetupError(str(exc)) from exc
            rt.image_id, rt.container_workdir, rt.path = await image_workdir(rt.engine, spec.image)
            await asyncio.to_thread(rt._populate)
            if spec.source is None:
                await rt._copy_from_image()
            await rt._baseline()
            await rt._start()
        except BaseException:
            await rt.destroy()
            raise
        return rt

    # -- set-up ----------------------------------------------------------------------------------------------------

    async def _copy_from_image(self) -> None:
        """Fill the host workdir with the image's working directory (extracted once per image id, then copied)."""
        assert self.engine is not None
        cache = host_cache_root() / "images" / "workdirs" / self.image_id.replace("sha256:", "")[:24]
        if not (cache / ".polar-complete").exists():
            await self._extract_image_workdir(cache)
        await asyncio.to_thread(shutil.copytree, cache / "tree", self.workdir, dirs_exist_ok=True, symlinks=True)

    async def _extract_image_workdir(self, cache: Path) -> None:
        assert self.engine is not None
        engine = self.engine
        created = engine.check(await engine.run("create", self.spec.image or "", "true", timeout_s=120), "create")
        cid = created.stdout.strip()
        tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=_mkdir(cache.parent)))
        try:
            proc = await asyncio.create_subprocess_exec(
                *engine.argv("cp", f"{cid}:{self.container_workdir}/.", "-"),
                env=engine.environ(),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            data, err = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeSetupError(f"cannot copy {self.container_workdir} out of {self.spec.image}: {err!r}")
            await asyncio.to_thread(_untar, data, tmp / "tree", Path(self.container_workdir).name)
            await asyncio.to_thread(_publish, tmp, cache)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            await engine.run("rm", "-f", cid, timeout_s=60)

    async def _start(self) -> None:
        assert self.engine is not None
        self._ctl = Path(tempfile.mkdtemp(prefix="polar-ctr-"))
        shutil.copy2(RELAY_SCRIPT, self._ctl / "relay.py")
        (self._ctl / "connect.jsonl").touch()
        await self._relay.start(self._ctl / "relay.sock")
        os.chmod(self._ctl / "relay.sock", 0o777)
        name = f"polar-{hashlib.sha256(self.session_id.encode()).hexdigest()[:10]}-{uuid.uuid4().hex[:6]}"
        spec = self.spec
        args = ["run", "-d", "--name", name, "--network", "none", "--label", f"{_LABEL}={self.owner}"]
        args += ["--label", f"polar.session={self.session_id}", "--pids-limit", str(PIDS_LIMIT)]
        args += ["--security-opt", "no-new-privileges", "--hostname", "polar"]
        if spec.cpus is not None:
            args += ["--cpus", str(spec.cpus)]
        if spec.memory_mb is not None:
            args += ["--memory", f"{spec.memory_mb}m"]
        args += ["-v", f"{self.home}:{AGENT_HOME}", "-v", f"{self.workdir}:{self.container_workdir}"]
        args += ["-v", f"{self._ctl}:{CTL_DIR}:ro", "-v", f"{self._ctl / 'connect.jsonl'}:{CTL_DIR}/connect.jsonl"]
        for m in _host_mounts():
            args += ["-v", m]
        init = _tini()
        args += ["-v", f"{init}:{CTL_DIR}-init:ro"]  # pid 1 reaps what commands leave behind
        args += ["-w", self.container_workdir, "--entrypoint", f"{CTL_DIR}-init", spec.image or "", "-g", "--"]
        args += ["/bin/sh"]
        relay = [f"{CTL_DIR}/relay.py", "--port", str(self.proxy_port), "--unix", f"{CTL_DIR}/relay.sock"]
        relay += ["--trace", f"{CTL_DIR}/connect.jsonl", "--", "sleep", "infinity"]
        args += ["-c", _PY_FIND, "sh", "-I", *relay]
        t0 = time.monotonic()
        res = await self.engine.run(*args, timeout_s=300)
        if not res.ok:
            await self.engine.run("rm", "-f", name, timeout_s=60)
            raise RuntimeSetupError(f"{self.engine.kind} run failed: {res.stderr.strip()[-1500:]}")
        self.container = res.stdout.strip() or name
        # ready when the relay listens (its first trace line), so the agent never races it
        trace = self._ctl / "connect.jsonl"
        for _ in range(600):
            if trace.stat().st_size > 0:
                break
            if not await self._running():
                logs = await self.engine.run("logs", self.container, timeout_s=30)
                raise RuntimeSetupError(f"the container exited at start: {(logs.stdout + logs.stderr)[-1500:]}")
            await asyncio.sleep(0.05)
        self.start_s = time.monotonic() - t0
        probe = await self.engine.run("exec", self.container, "test", "-d", SWEBENCH_ENV_BIN, timeout_s=30)
        if probe.ok and SWEBENCH_ENV_BIN not in self.path.split(":"):
            self.path = f"{SWEBENCH_ENV_BIN}:{self.path}"

    async def _running(self) -> bool:
        assert self.engine is not None and self.container is not None
        res = await self.engine.run("inspect", "--format", "{{.State.Running}}", self.container, timeout_s=30)
        return res.ok and res.stdout.strip() == "true"

    @property
    def forwarded(self) -> int:
        """Connections the host side passed on to the proxy."""
        return self._relay.forwarded

    def connections(self) -> list[dict[str, Any]]:
        """The in-container relay's connect trace (the host-side `forwarded` count is the one it cannot touch)."""
        if self._ctl is None:
            return []
        events = []
        for line in (self._ctl / "connect.jsonl").read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events

    # -- commands --------------------------------------------------------------------------------------------------

    def exec_env(self) -> dict[str, str]:
        return {"TMPDIR": "/tmp", "PATH": self.spec.env.get("PATH", self.path)}

    async def _run(
        self, argv: list[str], env: dict[str, str], timeout_s: float, stdout_path: Path | None
    ) -> ExecResult:
        if self.engine is None or self.container is None:
            return ExecResult(None, "", "the container is gone", False, 0.0)
        full_env = dict(env)
        marker = uuid.uuid4().hex
        full_env["POLAR_EXEC"] = marker  # every process of this command carries it: a timeout kills them all
        env_args: list[str] = []
        for k, v in full_env.items():
            env_args += ["-e", f"{k}={v}"]
        cli = self.engine.argv("exec", "-i", *env_args, "-w", self.container_workdir, self.container, *argv)

        async def on_timeout(proc: asyncio.subprocess.Process) -> None:
            await self._kill_marked(marker)

        async def on_cancel(proc: asyncio.subprocess.Process) -> None:
            await self._kill_marked(marker)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

        res = await run_command(
            cli,
            env=self.engine.environ(),
            timeout_s=timeout_s,
            stdout_path=stdout_path,
            on_timeout=on_timeout,
            on_cancel=on_cancel,
        )
        code = res.exit_code
        if code in (126, 127) and not res.timed_out and stdout_path is None:
            # the engine could not start the command in the container (not the command's own status)
            text = res.stdout + res.stderr
            if "executable file not found" in text or "OCI runtime exec failed" in text:
                code = None
        return dataclasses.replace(res, exit_code=None if res.timed_out else code)

    async def _kill_marked(self, marker: str) -> None:
        """Kill every process in the container started by one `exec` (they all carry its POLAR_EXEC marker)."""
        if self.engine is None or self.container is None:
            return
        script = (
            "for d in /proc/[0-9]*; do "
            f'grep -qz "^POLAR_EXEC={marker}$" "$d/environ" 2>/dev/null && kill -9 "${{d#/proc/}}" 2>/dev/null; '
            "done; true"
        )
        with contextlib.suppress(Exception):
            await self.engine.run("exec", self.container, "/bin/sh", "-c", script, timeout_s=60)

    async def destroy(self) -> None:
        engine, container = self.engine, self.container
        self.container = None
        if engine is not None and container is not None:
            with contextlib.suppress(Exception):
                res = await asyncio.shield(engine.run("rm", "-f", "-v", container, timeout_s=120))
                if not res.ok:
                    log.warning("removing container %s: %s", container, res.stderr.strip()[-500:])
        await self._relay.close()
        if self._ctl is not None:
            shutil.rmtree(self._ctl, ignore_errors=True)
            self._ctl = None
        await super().destroy()


def _tini() -> str:
    init = shutil.which("tini-static")
    if init is None:
        raise RuntimeSetupError("tini-static is not installed (apt-get install tini, or `make deps`)")
    return os.path.realpath(init)


def _publish(tmp: Path, cache: Path) -> None:
    (tmp / ".polar-complete").touch()
    with contextlib.suppress(OSError):
        tmp.rename(cache)  # another session may have won the race: theirs is identical


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _untar(data: bytes, dest: Path, top: str) -> None:
    """Extract the engine's `cp` archive of a directory into `dest`, whether its entries are rooted at `./` or at
    the directory's own name (`top`): engines differ."""
    raw = dest.with_name(dest.name + ".raw")
    raw.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(raw, filter="tar")
    entries = list(raw.iterdir())
    if len(entries) == 1 and entries[0].name == top and entries[0].is_dir():
        entries[0].rename(dest)
        raw.rmdir()
    else:
        raw.rename(dest)
