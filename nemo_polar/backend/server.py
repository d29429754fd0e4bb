# SPDX-License-Identifier: Apache-2.0
"""Start, watch and stop vLLM OpenAI-compatible servers for the prepared backend models.

`LocalVLLM` owns one server for the life of a `with` block (used by the pytest fixtures and the demo);
`launch_detached` / `stop_servers` / `list_servers` back the `polar backend start|stop|status` commands. Each
server runs from the vllm venv in its own process group (stopping it stops its engine and worker processes)
and records `<run dir>/<port>.json` and its log beside it. Servers bind 127.0.0.1 only.
This module does not build anything (see `prepare.py`) and sends no inference requests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

from nemo_polar.backend import config
from nemo_polar.backend.build import is_prepared, read_manifest
from nemo_polar.errors import PolarError

HOST = "127.0.0.1"
NOT_PREPARED = "backend not prepared: run `polar backend prepare`"
# vLLM streams the first token at once, then one chunk per STREAM_INTERVAL tokens (and the rest at the end): 8× fewer
# SSE chunks for the proxy to parse on a long answer, the same time to first token (docs/performance.md)
STREAM_INTERVAL = 8


class BackendError(PolarError, RuntimeError):
    """A server could not be started or did not become healthy; the message ends with its log tail."""


class BackendNotPrepared(BackendError):
    def __init__(self, model: str) -> None:
        super().__init__(f"{NOT_PREPARED} (model {model!r} missing under {config.cache_dir()})")
        self.model = model


@dataclass(frozen=True)
class ServerInfo:
    """What `<run dir>/<port>.json` records about one running server."""

    model: str
    port: int
    pid: int
    pgid: int
    log_path: str
    started_at: float
    owner: str  # "cli" (detached, outlives the command) or "local" (a LocalVLLM in some process)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"


# ---------------------------------------------------------------- command line and environment


def server_command(model: str, port: int, extra_args: Sequence[str] = ()) -> list[str]:
    spec = config.get_spec(model)
    cmd = [
        str(config.vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(config.model_dir(model)),
        "--served-model-name",
        spec.name,
        "--max-model-len",
        str(config.MAX_MODEL_LEN),
        "--dtype",
        spec.dtype,
        "--host",
        HOST,
        "--port",
        str(port),
        # Compiled start takes 80-90 s here and its cache does not reload; eager serves in ~25 s.
        "--enforce-eager",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--disable-uvicorn-access-log",
        "--stream-interval",
        str(STREAM_INTERVAL),
        "--kv-cache-memory-bytes",
        str(spec.kv_cache_bytes),
    ]
    if spec.chat_template_path is not None:
        cmd += ["--chat-template", str(spec.chat_template_path)]
    return cmd + list(spec.server_args) + list(extra_args)


def server_env(model: str) -> dict[str, str]:
    spec = config.get_spec(model)
    # VLLM_CPU_KVCACHE_SPACE would override --kv-cache-memory-bytes (in whole GiB).
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "VLLM_CPU_KVCACHE_SPACE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        {
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_CACHE_ROOT": str(config.vllm_cache_root()),
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(spec.env)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- state files


def _state_path(port: int) -> Path:
    return config.run_dir() / f"{port}.json"


def _write_state(info: ServerInfo) -> None:
    path = _state_path(info.port)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(asdict(info), indent=2) + "\n")
    tmp.replace(path)


def _read_state(path: Path) -> ServerInfo | None:
    try:
        return ServerInfo(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _group_members(pgid: int) -> list[tuple[str, int]]:
    """(state, resident pages) of every process in the group, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            statm = (entry / "statm").read_text().split()
        except OSError:
            continue
        # After the parenthesised command name: state ppid pgrp ...
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            members.append((fields[0], int(statm[1])))
    return members


def group_alive(pgid: int) -> bool:
    """True while some process of the group runs (zombies waiting to be reaped do not count). A process whose main
    thread has exited shows "Z" in its own stat while its other threads run (a SIGKILLed multithreaded server is in
    that state while it tears down): its threads decide."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields((entry / "stat").read_text())
            if int(fields[2]) != pgid:
                continue
            if fields[0] != "Z":
                return True
            tasks = list((entry / "task").iterdir())
            if any(_stat_fields((t / "stat").read_text())[0] != "Z" for t in tasks):
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def _stat_fields(stat: str) -> list[str]:
    """The fields of a /proc stat line after the parenthesised command name: state ppid pgrp ..."""
    return stat[stat.rindex(")") + 2 :].split()


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in the group (the API server, engine core and worker)."""
    return sum(pages for _, pages in _group_members(pgid)) * os.sysconf("SC_PAGE_SIZE")


def list_servers() -> list[ServerInfo]:
    """Servers recorded in the run dir whose process group still exists; stale records are removed."""
    out: list[ServerInfo] = []
    run = config.run_dir()
    if not run.is_dir():
        return out
    for path in sorted(run.glob("*.json")):
        info = _read_state(path)
        if info is None or not group_alive(info.pgid):
            path.unlink(missing_ok=True)
            continue
        out.append(info)
    return out


def health_ok(base_url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _log_tail(path: Path, n_chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n_chars:]
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------- start / stop


def _spawn(
    model: str, port: int, extra_args: Sequence[str], die_with_parent: bool
) -> tuple[subprocess.Popen[bytes], Path]:
    if not is_prepared(model):
        raise BackendNotPrepared(model)
    log_path = config.run_dir() / f"{model}-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = server_command(model, port, extra_args)
    if die_with_parent:
        # Set PR_SET_PDEATHSIG in the child, then exec vLLM: if the owning process dies without cleaning up
        # (SIGKILL, a crashed pytest), the server gets SIGTERM instead of lingering. No preexec_fn (threads).
        shim = "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 15); os.execv(sys.argv[1], sys.argv[1:])"
        cmd = [cmd[0], "-c", shim, *cmd]
    with log_path.open("ab") as log_fh:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            env=server_env(model),
            cwd=str(config.cache_dir()),
            start_new_session=True,  # its own process group: stopping it stops engine and workers too
        )
    return proc, log_path


def _wait_healthy(proc: subprocess.Popen[bytes], base_url: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BackendError(f"vLLM exited with {proc.returncode} before it was healthy:\n{_log_tail(log_path)}")
        if health_ok(base_url):
            return
        time.sleep(0.5)
    raise BackendError(f"vLLM not healthy after {timeout_s:.0f} s:\n{_log_tail(log_path)}")


def stop_group(pgid: int, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 30.0) -> None:
    """SIGTERM the group, wait up to `timeout_s` for every member to exit, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 10.0)
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()  # reap the leader, or it stays a zombie member of the group
            if not group_alive(pgid):
                return
            time.sleep(0.2)
    if proc is not None:
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass


def launch_detached(model: str, port: int | None = None, timeout_s: float = 600.0) -> ServerInfo:
    """Start a server that outlives this process (`polar backend start`); return once `/health` answers."""
    port = port or free_port()
    proc, log_path = _spawn(model, port, (), die_with_parent=False)
    info = ServerInfo(model, port, proc.pid, proc.pid, str(log_path), time.time(), owner="cli")
    try:
        _wait_healthy(proc, info.base_url, log_path, timeout_s)
    except BaseException:
        stop_group(proc.pid, proc)
        raise
    _write_state(info)
    return info


def stop_servers(port: int | None = None, model: str | None = None) -> list[ServerInfo]:
    """Stop recorded servers: the one on `port`, else those `polar backend start` left running (of `model`).

    A server owned by a live `LocalVLLM` (another process's test session, say) is stopped only when named by
    its port: its owner stops it when done.
    """
    stopped = []
    for info in list_servers():
        if port is not None and info.port != port:
            continue
        if port is None and (info.owner != "cli" or (model is not None and info.model != model)):
            continue
        stop_group(info.pgid)
        _state_path(info.port).unlink(missing_ok=True)
        stopped.append(info)
    return stopped


class LocalVLLM:
    """One vLLM server for one prepared model, for the life of a `with` block.

    >>> with LocalVLLM("tiny-qwen3") as llm:
    ...     llm.base_url, llm.model, llm.model_dir, llm.eot_token_ids

    Starts the server from the vllm venv on `port` (a free loopback port when None), waits for `/health` up to
    `startup_timeout_s`, and stops its whole process group on exit, also when the body raises. If the owning
    process dies abruptly the server receives SIGTERM (PR_SET_PDEATHSIG).
    """

    def __init__(
        self,
        model: str = "tiny-qwen3",
        port: int | None = None,
        *,
        startup_timeout_s: float = 600.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.spec = config.get_spec(model)
        self.model = self.spec.name
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = tuple(extra_args)
        self.startup_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._stop_reason = "not started"

    @property
    def base_url(self) -> str:
        if self._proc is None or self.port is None:
            raise BackendError(f"{self.model} server is not running ({self._stop_reason})")
        return f"http://{HOST}:{self.port}"

    @property
    def model_dir(self) -> Path:
        return config.model_dir(self.model)

    @property
    def dtype(self) -> str:
        return self.spec.dtype

    @property
    def eot_token_ids(self) -> list[int]:
        manifest = read_manifest(self.model)
        if manifest is None:
            raise BackendNotPrepared(self.model)
        ids = manifest["eot_token_ids"]
        assert isinstance(ids, list)
        return [int(i) for i in ids]

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def rss_bytes(self) -> int:
        return group_rss_bytes(self._proc.pid) if self._proc is not None else 0

    def start(self) -> LocalVLLM:
        if self._proc is not None:
            return self
        self.port = self.port or free_port()
        t0 = time.monotonic()
        self._proc, self._log_path = _spawn(self.model, self.port, self.extra_args, die_with_parent=True)
        try:
            _wait_healthy(self._proc, self.base_url, self._log_path, self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        _write_state(
            ServerInfo(
                self.model, self.port, self._proc.pid, self._proc.pid, str(self._log_path), time.time(), "local"
            )
        )
        return self

    def stop(self, reason: str = "stopped") -> None:
        """Stop the server's process group; safe to call twice. `reason` is told to later users of `base_url`."""
        proc, self._proc = self._proc, None
        self._stop_reason = reason
        if proc is None:
            return
        stop_group(proc.pid, proc)
        if self.port is not None:
            _state_path(self.port).unlink(missing_ok=True)

    def __enter__(self) -> LocalVLLM:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.base_url}" if self.running else self._stop_reason
        return f"LocalVLLM(model={self.model!r}, dtype={self.dtype!r}, {state})"


def _main() -> None:  # pragma: no cover - debugging aid: `python -m nemo_polar.backend.server MODEL`
    with LocalVLLM(sys.argv[1] if len(sys.argv) > 1 else "tiny-qwen3") as llm:
        print(llm, f"started in {llm.startup_s:.1f} s, RSS {llm.rss_bytes() / 2**30:.2f} GiB", flush=True)


if __name__ == "__main__":  # pragma: no cover
    _main()
