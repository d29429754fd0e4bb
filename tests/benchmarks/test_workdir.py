# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/_workdir.py`: a benchmark's work directory is removed when the run ends, kept (its path printed to
stderr) when the run fails, and always kept with `POLAR_KEEP_BENCH_DIRS=1` (no servers)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _workdir import KEEP_ENV, release, work_dir


@pytest.fixture(autouse=True)
def _no_keep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(KEEP_ENV, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # mkdtemp's directories land under pytest's, cleaned either way
    monkeypatch.setattr("tempfile.tempdir", None)


def test_removed_on_normal_exit(capsys: pytest.CaptureFixture[str]) -> None:
    with work_dir("polar-test-") as work:
        (work / "store").mkdir()
        (work / "store" / "records.db").write_bytes(b"x" * 1024)
        assert work.name.startswith("polar-test-")
    assert not work.exists()
    assert capsys.readouterr().err == ""


def test_kept_and_printed_when_the_run_fails(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError, match="boom"), work_dir("polar-test-") as work:
        (work / "log.txt").write_text("what went wrong")
        raise RuntimeError("boom")
    assert (work / "log.txt").read_text() == "what went wrong"
    err = capsys.readouterr().err
    assert str(work) in err and "RuntimeError" in err
    shutil.rmtree(work)


def test_kept_and_printed_with_the_env_var(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(KEEP_ENV, "1")
    with work_dir("polar-test-") as work:
        (work / "log.txt").write_text("ok")
    assert (work / "log.txt").exists()
    err = capsys.readouterr().err
    assert str(work) in err and KEEP_ENV in err
    shutil.rmtree(work)


def test_release_for_a_class_exit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What a `Stack.__exit__` calls: the exception given there decides; a clean `sys.exit(0)` is not a failure; no
    directory (never created) is nothing to do."""
    done, failed = tmp_path / "done", tmp_path / "failed"
    done.mkdir()
    failed.mkdir()
    release(done, None)
    release(failed, ValueError("bad answer"))
    assert not done.exists() and failed.exists()
    assert str(failed) in capsys.readouterr().err

    exited = tmp_path / "exited"
    exited.mkdir()
    release(exited, SystemExit(0))
    assert not exited.exists()
    release("", ValueError("never started"))
    assert capsys.readouterr().err == ""


def test_zero_in_the_env_var_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEEP_ENV, "0")
    with work_dir("polar-test-") as work:
        pass
    assert not work.exists()
