# SPDX-License-Identifier: Apache-2.0
"""Install the pinned harness CLIs into the cache: `<cache>/harnesses/<name>-<version>`.

npm packages go into `<dir>/node_modules` (`npm install --prefix`), PyPI packages into their own venv
`<dir>/venv`. Installation is idempotent: a marker
file, written last, records the exact spec. The cache root is `$POLAR_CACHE_DIR`, else `~/.cache/nemo-polar`.
This module does not run harnesses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from nemo_polar.errors import PolarError

from .base import HarnessAdapter

__all__ = ["InstallError", "InstallStatus", "cache_root", "install", "install_dir", "status"]

MARKER = ".polar-installed"
INSTALL_TIMEOUT_S = 900.0


class InstallError(PolarError, RuntimeError):
    """An install command failed; `output` holds its tail."""

    def __init__(self, name: str, output: str):
        super().__init__(f"installing {name} failed:\n{output[-4000:]}")
        self.name = name
        self.output = output


@dataclass(frozen=True, slots=True)
class InstallStatus:
    name: str
    package: str | None
    version: str | None
    path: Path | None
    installed: bool


def cache_root() -> Path:
    override = os.environ.get("POLAR_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "nemo-polar"


def _spec(adapter: HarnessAdapter) -> str:
    sep = "==" if adapter.package_kind == "pypi" else "@"
    return f"{adapter.package}{sep}{adapter.version}"


def install_dir(adapter: HarnessAdapter, root: Path | None = None) -> Path | None:
    """Where the adapter's pinned package lives (None for adapters without a package)."""
    if adapter.package is None or adapter.package_kind == "none":
        return None
    return (root or cache_root()) / "harnesses" / f"{adapter.name}-{adapter.version}"


def _executable(adapter: HarnessAdapter, path: Path) -> Path:
    if adapter.package_kind == "npm":
        return path / "node_modules" / ".bin" / adapter.executable
    return path / "venv" / "bin" / adapter.executable


def status(adapter: HarnessAdapter, root: Path | None = None) -> InstallStatus:
    path = install_dir(adapter, root)
    installed = path is not None and _is_installed(adapter, path)
    return InstallStatus(adapter.name, adapter.package, adapter.version, path, installed if path else True)


def _is_installed(adapter: HarnessAdapter, path: Path) -> bool:
    marker = path / MARKER
    return marker.is_file() and marker.read_text().strip() == _spec(adapter) and _executable(adapter, path).exists()


def _run(name: str, argv: list[str], cwd: Path) -> None:
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except FileNotFoundError as exc:
        raise InstallError(name, f"{argv[0]} not found: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise InstallError(name, f"timed out after {INSTALL_TIMEOUT_S:.0f} s: {' '.join(argv)}") from exc
    if proc.returncode != 0:
        raise InstallError(name, proc.stdout + proc.stderr)


def install(adapter: HarnessAdapter, root: Path | None = None, *, force: bool = False) -> InstallStatus:
    """Install the adapter's pinned package unless it is already there; returns the resulting status.

    The package is built in place (a venv cannot be moved: its scripts carry absolute paths); the marker is
    written last, so an interrupted install is redone on the next call.
    """
    path = install_dir(adapter, root)
    if path is None:
        return status(adapter, root)
    if not force and _is_installed(adapter, path):
        return status(adapter, root)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    try:
        if adapter.package_kind == "npm":
            npm = shutil.which("npm") or "npm"
            argv = [npm, "install", "--prefix", str(path), "--no-audit", "--no-fund", "--loglevel=error"]
            _run(adapter.name, [*argv, _spec(adapter)], path)
        elif adapter.package_kind == "pypi":
            _run(adapter.name, [sys.executable, "-m", "venv", str(path / "venv")], path)
            pip = [
                str(path / "venv" / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ]
            _run(adapter.name, [*pip, _spec(adapter)], path)
        else:
            raise InstallError(adapter.name, f"unknown package kind {adapter.package_kind!r}")
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    (path / MARKER).write_text(_spec(adapter) + "\n")
    return status(adapter, root)
