# SPDX-License-Identifier: Apache-2.0
"""`polar harness install/list`: a real npm install into a temporary POLAR_CACHE_DIR, idempotence, listing.

Uses a small real npm package with an executable (semver) through an adapter subclass, so the test exercises
the same code path as the six CLIs without downloading hundreds of megabytes.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest
from nemo_polar.harness_adapters import HarnessAdapter, cli
from nemo_polar.harness_adapters.install import cache_root, install, install_dir, status


class SemverAdapter(HarnessAdapter):
    name = "semver_test"
    package = "semver"
    package_kind = "npm"
    version = "7.6.3"
    executable = "semver"


def test_cache_root_honours_polar_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLAR_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    assert install_dir(SemverAdapter()) == tmp_path / "harnesses" / "semver_test-7.6.3"
    monkeypatch.delenv("POLAR_CACHE_DIR")
    assert cache_root() == Path.home() / ".cache" / "nemo-polar"


@pytest.mark.slow
def test_npm_install_is_real_and_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed (make test installs Node 20 and npm)")
    monkeypatch.setenv("POLAR_CACHE_DIR", str(tmp_path))
    adapter = SemverAdapter()
    assert not status(adapter).installed
    st = install(adapter)
    assert st.installed and st.path == tmp_path / "harnesses" / "semver_test-7.6.3"
    exe = st.path / "node_modules" / ".bin" / "semver"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "SemVer 7.6.3" in out
    marker = st.path / ".polar-installed"
    before = marker.stat().st_mtime_ns
    install(adapter)  # second call: nothing to do
    assert marker.stat().st_mtime_ns == before
    marker.unlink()  # an interrupted install (no marker) is redone
    assert not status(adapter).installed
    assert install(adapter).installed


def test_harness_list_prints_every_builtin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("POLAR_CACHE_DIR", str(tmp_path))
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["harness", "list"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "PACKAGE", "VERSION", "INSTALLED"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["claude_code"] == ["claude_code", "@anthropic-ai/claude-code", "2.1.197", "no"]
    assert rows["mini_swe_agent"][1:] == ["mini-swe-agent", "2.4.6", "no"]
    assert rows["shell"][-1] == "yes"
    with pytest.raises(SystemExit):
        parser.parse_args(["harness", "install", "emacs"])
