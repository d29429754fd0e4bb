# SPDX-License-Identifier: Apache-2.0
"""The sandbox's isolation, attacked from inside: writing outside the workdir, reading another session's workdir,
and connecting to a listener in a network namespace the test creates all fail — and each has a positive control
that shows the same thing works outside the sandbox, so a pass proves the sandbox, not a broken probe.

The two sessions are created the way the gateway creates them (`SessionWork.make_runtime`: `<work_dir>/runtimes/
<session>/agent`, the run directory hidden). Their run directory lives under `/var/tmp`, outside `/tmp` and the
host home, which the sandbox replaces anyway: there only the sandbox's own hiding can protect a session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.rollout.runtime import Runtime, SandboxRuntime
from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.rollout.stages import Job, SessionWork
from nemo_polar.runtime.sandbox import AGENT_HOME, AGENT_WORKDIR, bwrap_available, host_cache_root

pytestmark = pytest.mark.skipif(
    bwrap_available() is None, reason="bubblewrap is not installed (make test installs Debian `bubblewrap`)"
)

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_root() -> Iterator[Path]:
    """A gateway run directory outside `/tmp` and the host home (both replaced inside the sandbox anyway)."""
    parent = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else REPO / "build"
    parent.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="polar-isolation-", dir=parent))
    assert not root.is_relative_to("/tmp") and not root.is_relative_to(Path.home())
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _task() -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "task_id": "isolation",
            "instruction": "nothing",
            "runtime": {"isolation": "sandbox", "source": "example:median"},
            "agent": {"harness": "simulation"},
        }
    )


async def _session(work: SessionWork, session_id: str) -> Runtime:
    job = Job(session_id, _task(), 0, 0, work.work_dir / "sessions" / session_id)
    rt = await work.make_runtime(job, "agent")
    assert isinstance(rt, SandboxRuntime)
    return rt


async def _two_sessions(run_root: Path) -> tuple[Runtime, Runtime]:
    work = SessionWork(
        node_id="n0",
        work_dir=run_root / "gw",
        proxy=None,
        model="m",
        builder_options={},
        keep_runtimes=False,
    )
    return await _session(work, "s1"), await _session(work, "s2")


def _probe(rt: Runtime, script: str, *args: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        res = await rt.exec([PY, "-c", script, *args], timeout_s=60)
        assert res.ok, res.stderr
        return dict(json.loads(res.stdout))

    return asyncio.run(go())


WRITE_PROBE = """
import errno, json, os, sys
targets = json.loads(sys.argv[1])
# the relay that started us names the control directory (its unix socket) on its command line
relay = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
targets["control_dir"] = os.path.dirname(relay[relay.index(b"--unix") + 1].decode())
os.symlink(targets["run_dir"], "escape-link")  # a link in the workdir does not lead out of it
targets["through_link"] = os.path.abspath("escape-link")
out = {}
for name, d in targets.items():
    try:
        with open(os.path.join(d, "polar-escaped"), "w") as f:
            f.write("x")
        out[name] = "written"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
for name, d in {"workdir": ".", "home": os.environ["HOME"], "tmp": "/tmp"}.items():
    with open(os.path.join(d, "polar-allowed"), "w") as f:
        f.write("ok")
    out[name] = "written"
out["control_dir_path"] = targets["control_dir"]
print(json.dumps(out))
"""


def test_writing_outside_the_workdir_fails(run_root: Path) -> None:
    async def make() -> tuple[Runtime, Runtime]:
        return await _two_sessions(run_root)

    rt1, rt2 = asyncio.run(make())
    try:
        # host directories the sandbox can name; each is writable on the host (the test writes there below)
        targets = {
            "session_root": str(rt1.workdir.parent),
            "run_dir": str(run_root / "gw"),
            "other_workdir": str(rt2.workdir),
            "var_tmp": str(run_root.parent),
            "checkout": str(REPO / "nemo_polar" / "runtime"),
            "cache": str(host_cache_root()),
            "host_home": str(Path.home()),
            "etc": "/etc",
            "dev_shm": "/dev/shm",
        }
        out = _probe(rt1, WRITE_PROBE, json.dumps(targets))
        targets["control_dir"] = out.pop("control_dir_path")
        targets["through_link"] = str(rt1.workdir / "escape-link")

        # positive control: the sandboxed process writes where it may (workdir, private HOME, private /tmp) ...
        assert (out["workdir"], out["home"], out["tmp"]) == ("written",) * 3
        assert (rt1.workdir / "polar-allowed").read_text() == "ok" and (rt1.home / "polar-allowed").read_text() == "ok"
        # ... and every other directory is read-only or absent in there (the hidden run directory: ENOENT) ...
        refused = {"EROFS", "ENOENT", "EACCES"}
        private = {"host_home", "dev_shm"}  # sandbox-private memory: a write there vanishes with the sandbox
        for name in targets:
            assert name in private or out[name] in refused, (name, out[name])
        # ... and nothing reached the host, although the host itself can write to each of those directories
        for name, d in targets.items():
            if name == "through_link":
                continue
            assert not (Path(d) / "polar-escaped").exists(), name
            if name not in ("etc", "checkout", "cache", "control_dir"):
                probe = Path(d) / f"polar-host-write-{secrets.token_hex(4)}"
                probe.write_text("host")
                probe.unlink()
        assert not Path("/tmp/polar-allowed").exists()  # the sandbox's /tmp is its own
    finally:
        asyncio.run(rt1.destroy())
        asyncio.run(rt2.destroy())


READ_PROBE = """
import json, os, sys
out = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        out[name] = open(path).read() if os.path.isfile(path) else sorted(os.listdir(path))
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""


WHERE_PROBE = """
import json, os
print(json.dumps({"cwd": os.getcwd(), "home": os.environ["HOME"], "homes": sorted(os.listdir("/home"))}))
"""


def test_reading_another_sessions_workdir_fails(run_root: Path) -> None:
    async def make() -> tuple[Runtime, Runtime]:
        return await _two_sessions(run_root)

    rt1, rt2 = asyncio.run(make())
    try:
        secret = f"secret-of-s2-{secrets.token_hex(8)}"
        asyncio.run(rt2.write_file("secret.txt", secret))
        (run_root / "gw" / "records.sqlite").write_text("stands in for the gateway's record store")
        # inside, each session's workdir and HOME are at the same fixed paths; on the host they are under the run dir
        assert (
            (rt1.agent_workdir, rt1.agent_home) == (rt2.agent_workdir, rt2.agent_home) == (AGENT_WORKDIR, AGENT_HOME)
        )
        paths = {
            "own_file": f"{rt1.agent_workdir}/stats.py",
            "own_host_workdir": str(rt1.workdir),
            "other_file": str(rt2.workdir / "secret.txt"),
            "other_workdir": str(rt2.workdir),
            "other_home": str(rt2.home),
            "runtimes": str(run_root / "gw" / "runtimes"),
            "record_store": str(run_root / "gw" / "records.sqlite"),
        }
        # positive control: the other session reads its own file through the same probe, and so does the host
        assert _probe(rt2, READ_PROBE, json.dumps({"file": f"{rt2.agent_workdir}/secret.txt"})) == {"file": secret}
        assert Path(paths["other_file"]).read_text() == secret
        assert (rt1.workdir / "stats.py").is_file()

        out = _probe(rt1, READ_PROBE, json.dumps(paths))
        assert out["own_file"] == (rt1.workdir / "stats.py").read_text()
        for name in ("other_file", "other_workdir", "other_home", "record_store", "own_host_workdir"):
            assert out[name] == "FileNotFoundError", (name, out[name])
        assert out["runtimes"] == ["s1"]  # only the (empty) mount point hiding its own runtime's directory
        assert secret not in json.dumps(out)
        where = _probe(rt1, WHERE_PROBE)
        assert where == {"cwd": AGENT_WORKDIR, "home": AGENT_HOME, "homes": ["agent"]}  # no other user's home either
    finally:
        asyncio.run(rt1.destroy())
        asyncio.run(rt2.destroy())


# -- network: a listener in a namespace the test creates -----------------------------------------------------------

LISTENER = """
import socket, sys
srv = socket.socket(); srv.bind((sys.argv[1], 0)); srv.listen(16)
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    print("accepted", flush=True)
    conn.sendall(b"polar-netns-listener\\n"); conn.close()
"""

# Runs inside the client namespace: connect once from this process (outside the sandbox), then run the same
# connection from inside a real `Sandbox` started from the very same namespace.
DRIVER = """
import asyncio, json, socket, sys
from pathlib import Path
from nemo_polar.runtime.sandbox import Sandbox, SandboxSpec
host, port, work, home = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
PROBE = '''
import errno, socket, sys
s = socket.socket(); s.settimeout(5)
rc = s.connect_ex((sys.argv[1], int(sys.argv[2])))
print(s.recv(64).decode().strip() if rc == 0 else errno.errorcode.get(rc, str(rc)))
'''
def outside():
    with socket.create_connection((host, port), timeout=5) as s:
        return s.recv(64).decode().strip()
async def main():
    before = outside()
    async with Sandbox(SandboxSpec(workdir=work, home=home, proxy_port=9)) as sb:
        res = await sb.run([sys.executable, "-c", PROBE, host, str(port)], env={}, timeout_s=60)
    print(json.dumps({"outside": before, "inside": res.stdout.strip(), "exit": res.exit_code, "err": res.stderr}))
asyncio.run(main())
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def _netns_pair() -> Iterator[tuple[str, str, str]]:
    """Two fresh network namespaces joined by a veth pair: (client ns, server ns, server address). The addresses
    (198.18.0.0/30, RFC 2544's benchmarking range) exist only inside these namespaces; the host's interfaces and
    routes are never touched. Deleting the namespaces removes the veth pair with them."""
    tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
    cli, srv = f"polar-t{tag}-cli", f"polar-t{tag}-srv"
    try:
        _ip("netns", "add", cli)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"creating a network namespace needs CAP_SYS_ADMIN and iproute2: {exc}")
    try:
        _ip("netns", "add", srv)
        _ip(
            "link",
            "add",
            f"pv{tag[-4:]}c",
            "netns",
            cli,
            "type",
            "veth",
            "peer",
            "name",
            f"pv{tag[-4:]}s",
            "netns",
            srv,
        )
        for ns, dev, addr in ((cli, f"pv{tag[-4:]}c", "198.18.0.1/30"), (srv, f"pv{tag[-4:]}s", "198.18.0.2/30")):
            _ip("-n", ns, "addr", "add", addr, "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield cli, srv, "198.18.0.2"
    finally:
        for ns in (cli, srv):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_listener_in_a_test_namespace_is_reachable_outside_the_sandbox_only(tmp_path: Path) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    with _netns_pair() as (cli, srv, addr):
        listener = subprocess.Popen(
            ["ip", "netns", "exec", srv, PY, "-I", "-c", LISTENER, addr],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert listener.stdout is not None
            port = listener.stdout.readline().strip()
            assert port.isdigit(), f"the listener did not start (exit {listener.poll()})"
            res = subprocess.run(
                ["ip", "netns", "exec", cli, PY, "-c", DRIVER, addr, port, str(work), str(home)],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=REPO,
            )
            assert res.returncode == 0, res.stderr
            out = json.loads(res.stdout.strip().splitlines()[-1])
        finally:
            listener.kill()
            accepted, _ = listener.communicate(timeout=30)
    # outside the sandbox, in the same namespace and the same process: connected, the listener answered
    assert out["outside"] == "polar-netns-listener"
    # inside the sandbox started from there: no route at all
    assert out["exit"] == 0, out["err"]
    assert out["inside"] == "ENETUNREACH"
    # the listener saw exactly the one connection made outside
    assert accepted.split() == ["accepted"]
