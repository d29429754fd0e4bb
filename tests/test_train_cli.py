# SPDX-License-Identifier: Apache-2.0
"""`polar train`: both modes in its help, `--config` runs the NeMo RL launcher, `--smoke` refuses clearly (exit 2,
saying what to run) outside a checkout and without the NeMo RL venv. The smoke run itself is
`tests/nemo_rl/test_gym_grpo_smoke.py` (the same `polar_lab.gym_grpo_smoke`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_polar import train_cli
from nemo_polar.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_help_shows_the_launch_and_the_smoke_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--config RECIPE" in out and "--smoke" in out and "make train-smoke" in out
    with pytest.raises(SystemExit) as refused:  # one of --config / --smoke is required
        main(["train"])
    assert refused.value.code == 2


def test_config_runs_the_nemo_rl_launcher(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    rc = main(["train", "--config", "recipes/grpo_polar_swe_smoke.yaml", "--dry-run", "polar.harness=codex"])
    captured = capsys.readouterr()
    assert "gym config: resources_servers/polar_swe/configs/polar_swe.yaml" in captured.out  # the launcher's lines
    try:
        import nemo_rl  # noqa: F401
    except ImportError:  # the project venv: the launcher stops where NeMo RL is needed, exit 2
        assert rc == 2 and "nemo_rl must be installed" in captured.err
    else:
        assert rc == 0 and "dry run: not training" in captured.out
    assert main(["train", "--config", "recipes/nope.yaml"]) == 2


def test_smoke_outside_a_checkout_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train_cli, "PACKAGE_ROOT", tmp_path / "site-packages")  # as an installed wheel
    assert main(["train", "--smoke"]) == 2
    err = capsys.readouterr().err
    assert "not in the installed package" in err and "make train-smoke" in err
    assert train_cli.checkout_root((tmp_path, ROOT)) == ROOT


def test_smoke_without_the_nemo_rl_venv_says_make_nemo_rl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("POLAR_CACHE_DIR", str(tmp_path / "empty-cache"))  # no venv built there
    assert main(["train", "--smoke"]) == 2
    err = capsys.readouterr().err
    assert "NeMo RL environment is not built" in err and "make nemo-rl" in err
    assert not (tmp_path / "empty-cache").exists() or not any((tmp_path / "empty-cache").glob("nemo-rl-venv-*"))
