# SPDX-License-Identifier: Apache-2.0
"""The NeMo RL environment's pytest session, run as a subprocess that starts as soon as collection ends.

`test_in_nemo_rl_env.py` runs this folder's other modules in the NeMo RL venv as one pytest session (~6 minutes,
most of it the two-step GRPO smoke: vLLM starts, Ray, Gym's servers, a real CLI). Started when the project
session's collection ends (`conftest.py`), it runs alongside the tests before it instead of after them: the
bridge test then only waits for its result. A suite that does not select the bridge test never starts it, and a
session that ends first kills it with everything it started (its own process group).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BRIDGE = "test_in_nemo_rl_env.py"
BRIDGE_TEST = f"{BRIDGE}::test_nemo_rl_tests_pass_in_the_nemo_rl_env"
VENV_TIMEOUT_S = 3600
SESSION_TIMEOUT_S = 3000
# set in the env session's environment: its pytest leaves by `os._exit` once its report is out (conftest.py)
QUICK_EXIT_ENV = "POLAR_NEMO_RL_QUICK_EXIT"


def clean_env() -> dict[str, str]:
    """This process's environment without the project venv's markers (the NeMo RL venv has its own)."""
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    return env


def modules() -> list[str]:
    """This folder's test modules that run inside the NeMo RL venv (every one but the bridge)."""
    return sorted(str(p.relative_to(REPO)) for p in HERE.glob("test_*.py") if p.name != BRIDGE)


class EnvSession:
    """The venv (built or reused by `scripts/nemo_rl_venv.sh`) and the pytest session running in it."""

    def __init__(self) -> None:
        self.python: Path | None = None
        self.setup_error: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None
        self.started = 0.0

    def prepare(self) -> None:
        """Build or reuse the venv once; `setup_error` says why when it could not be."""
        if self.python is not None or self.setup_error is not None:
            return
        script = REPO / "scripts" / "nemo_rl_venv.sh"
        try:
            proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=VENV_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            self.setup_error = f"scripts/nemo_rl_venv.sh did not finish: {exc}"
            return
        if proc.returncode != 0:
            self.setup_error = (
                f"the NeMo RL environment could not be built (scripts/nemo_rl_venv.sh): {proc.stderr[-2000:]}"
            )
            return
        self.python = Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python"

    def start(self) -> None:
        """Start the session in the background (once); its output goes to a log file, not a pipe nobody reads."""
        self.prepare()
        if self.proc is not None or self.python is None:
            return
        fd, name = tempfile.mkstemp(prefix="polar-nemo-rl-env-", suffix=".log")
        self.log = Path(name)
        # faulthandler: a crash during the session prints every thread's stack in the output. Two clean-clone runs
        # (5a9f16e, 723b0b3) ended with SIGSEGV *after* all 81 passed and with no stack: a crash in the interpreter's
        # teardown of what the session loaded (Ray, torch, vLLM), after faulthandler is off. The session therefore
        # leaves by `os._exit` with pytest's own exit status once its report is printed (conftest.py,
        # QUICK_EXIT_ENV); `close()` kills whatever it left running.
        cmd = [str(self.python), "-X", "faulthandler", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs"]
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(
                [*cmd, *modules()], cwd=REPO, env={**clean_env(), QUICK_EXIT_ENV: "1"}, stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.started = time.monotonic()

    def result(self) -> tuple[int | None, str]:
        """Wait for the session (at most SESSION_TIMEOUT_S from its start): its exit status (None: killed at that
        limit) and its whole output."""
        self.start()
        assert self.proc is not None and self.log is not None
        try:
            rc: int | None = self.proc.wait(timeout=max(1.0, SESSION_TIMEOUT_S - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.stop()
            rc = None
        return rc, self.log.read_text(errors="replace")

    def stop(self) -> None:
        """Kill the session and everything it started (its process group: what a quick exit left, too)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def close(self) -> None:
        """`stop()`, then remove the log."""
        self.stop()
        if self.log is not None:
            self.log.unlink(missing_ok=True)


SESSION = EnvSession()
