# SPDX-License-Identifier: Apache-2.0
"""The built wheel installs on its own and maps harness_adapters/ and credit/ under nemo_polar."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_and_imports_mapped_packages(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("nemo_polar-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "nemo_polar/credit/__init__.py" in names
    assert "nemo_polar/harness_adapters/__init__.py" in names
    assert "nemo_polar/py.typed" in names
    # data files the code reads at run time ship inside the wheel
    for data in (
        "nemo_polar/backend/smollm2_hermes.jinja",
        "nemo_polar/examples/roman.json",
        "nemo_polar/credit/data/role_labels.jsonl",
        "nemo_polar/credit/nemo_rl/NEMO_RL_COMMIT",
    ):
        assert data in names, data
    assert not any(n.startswith(("credit/", "harness_adapters/", "tests/")) for n in names)
    # test and benchmark code stays out of the wheel: polar_lab (the fake upstream, the credit simulator)
    assert not any(n.startswith("polar_lab/") or "fake_upstream" in n or "credit/sim/" in n for n in names)

    # A scratch venv that sees the project venv's third-party packages (one plain path entry, so the
    # editable finder of the project's own install is NOT active there) and the wheel installed on top.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "-q",
            "--no-deps",
            "--force-reinstall",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    probe = (
        "import nemo_polar, nemo_polar.credit, nemo_polar.harness_adapters, nemo_polar.types, nemo_polar.cli;"
        "import pathlib;"
        "print(pathlib.Path(nemo_polar.credit.__file__).parent.parent)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([py, "-I", "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == site / "nemo_polar"
    cli = subprocess.run([venv / "bin" / "polar", "--version"], capture_output=True, text=True, env=env, timeout=120)
    assert cli.returncode == 0 and "nemo-polar" in cli.stdout, cli.stderr
