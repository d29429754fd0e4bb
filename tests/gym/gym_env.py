# SPDX-License-Identifier: Apache-2.0
"""Drive NeMo Gym 0.7's own CLI (`gym env start`, `ng_collect_rollouts`, `gym env test`) from the cached Gym venv
(`scripts/gym_venv.sh`) as subprocesses, with `environments/` as the extra root.

Gym launches every server from `<uv_venv_dir>/<type>/<name>/.venv`; with `skip_venv_if_present` and
`uv_venv_dir=<gym venv>/server-venvs` (links made by the script) every server runs from the prebuilt Gym venv, so no
per-server `uv` install happens. Every Gym server and the head
server bind 127.0.0.1 (`default_host`). `GymEnv.stop()` interrupts the whole process group, as Ctrl-C would, and
kills what is left after a grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from nemo_polar.backend.server import free_port

REPO = Path(__file__).resolve().parents[2]
ENVIRONMENTS = REPO / "environments"


class GymVenvUnavailable(RuntimeError):
    pass


def build_gym_venv(timeout_s: float = 3600) -> Path:
    """Path of the Gym venv (built on first use); `GymVenvUnavailable` when it cannot be built here."""
    try:
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "gym_venv.sh")], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GymVenvUnavailable(f"scripts/gym_venv.sh did not finish: {exc}") from exc
    if proc.returncode != 0 or not proc.stdout.strip():
        raise GymVenvUnavailable(f"scripts/gym_venv.sh failed ({proc.returncode}): {proc.stderr[-1500:]}")
    venv = Path(proc.stdout.strip().splitlines()[-1])
    if not (venv / "bin" / "gym").exists():
        raise GymVenvUnavailable(f"{venv} has no gym executable")
    return venv


def http_json(
    url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None, timeout_s: float = 10
) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        body, status = err.read(), err.code
    except (urllib.error.URLError, OSError) as err:  # not listening (yet): no HTTP status at all
        return 0, str(err)
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, body.decode(errors="replace")


def listening_pids(port: int) -> set[int]:
    """PIDs holding a LISTEN socket on 127.0.0.1:`port` (from /proc: no psutil needed)."""
    inodes: set[str] = set()
    want = f"0100007F:{port:04X}"
    for table in ("/proc/net/tcp",):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[1] == want and parts[3] == "0A":  # 0A = LISTEN
                    inodes.add(parts[9])
    pids: set[int] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        pids.add(int(pid))
    return pids


class GymEnv:
    """`gym env start` with our config and test overrides; ports fixed up front so the test can reach each server."""

    def __init__(self, venv: Path, work: Path, overrides: dict[str, Any]):
        self.venv = venv
        self.work = work
        self.head_port = free_port()
        self.ports = {"polar_swe": free_port(), "polar_agent": free_port()}
        self.overrides = overrides
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = work / "gym_env_start.log"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["NEMO_GYM_EXTRA_ROOTS"] = str(ENVIRONMENTS)
        env["PATH"] = f"{self.venv / 'bin'}:{env.get('PATH', '')}"
        env["RAY_TMPDIR"] = str(self.work / "ray")
        # single-node Ray on loopback: otherwise Ray advertises the machine's interface address, and tests only
        # ever talk to 127.0.0.1
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        env.pop("VIRTUAL_ENV", None)
        return env

    def global_overrides(self) -> dict[str, Any]:
        return {
            "default_host": "127.0.0.1",
            "head_server": {"host": "127.0.0.1", "port": self.head_port},
            "uv_venv_dir": str(self.venv / "server-venvs"),
            "skip_venv_if_present": True,
        }

    def write_config(self) -> Path:
        cfg: dict[str, Any] = {
            "config_paths": [
                "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",  # Gym's own, as in recipes/
                "resources_servers/polar_swe/configs/polar_swe.yaml",
                "resources_servers/polar_swe/configs/polar_swe_environment_server.yaml",  # Gym 0.7's collection
            ],
            **self.global_overrides(),
            **self.overrides,
        }
        cfg.setdefault("polar_swe", {}).setdefault("resources_servers", {}).setdefault("polar_swe", {})
        cfg["polar_swe"]["resources_servers"]["polar_swe"]["port"] = self.ports["polar_swe"]
        cfg.setdefault("polar_agent", {}).setdefault("responses_api_agents", {}).setdefault("polar_agent", {})
        cfg["polar_agent"]["responses_api_agents"]["polar_agent"]["port"] = self.ports["polar_agent"]
        path = self.work / "gym_test_config.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def start(self, timeout_s: float = 300) -> None:
        config = self.write_config()
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(self.venv / "bin" / "gym"), "env", "start", "--config", str(config)],
                cwd=self.work,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gym env start exited with {self.proc.returncode}:\n{self.tail()}")
            status, _ = http_json(f"http://127.0.0.1:{self.head_port}/readyz", timeout_s=5)
            if status == 200:
                return
            time.sleep(1.0)
        raise TimeoutError(f"Gym servers not ready after {timeout_s}s:\n{self.tail()}")

    def tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def run(self, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """A Gym CLI command from the venv (head server address and venv links passed as Hydra overrides)."""
        extra = [
            "++head_server.host=127.0.0.1",
            f"++head_server.port={self.head_port}",
        ]
        return subprocess.run(
            [str(self.venv / "bin" / argv[0]), *argv[1:], *extra],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def stop(self, grace_s: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGINT)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
