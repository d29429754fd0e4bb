# SPDX-License-Identifier: Apache-2.0
"""`nemo_polar.loading.load_object` and the registries that use it: both path spellings, one error type."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from nemo_polar.harness_adapters import get_adapter

from nemo_polar.errors import LoadError, PolarError
from nemo_polar.evaluators import get_evaluator
from nemo_polar.evaluators.swe_tests import swe_tests
from nemo_polar.loading import is_dotted_path, load_object
from nemo_polar.trajectory import get_builder
from nemo_polar.trajectory.prefix_merging import build_prefix_merging


def test_both_spellings_resolve_the_same_object() -> None:
    assert load_object("nemo_polar.trajectory.prefix_merging:build_prefix_merging") is build_prefix_merging
    assert load_object("nemo_polar.trajectory.prefix_merging.build_prefix_merging") is build_prefix_merging
    # attribute paths: after the colon, or after the longest importable module
    assert load_object("nemo_polar.errors:LoadError.__str__") is LoadError.__str__
    assert load_object("nemo_polar.errors.LoadError.__str__") is LoadError.__str__
    assert is_dotted_path("a.b") and is_dotted_path("a:b") and not is_dotted_path("prefix_merging")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("nemo_polar.no_such_module:thing", "no module named 'nemo_polar.no_such_module'"),
        ("nemo_polar.no_such_module.thing", "no attribute 'no_such_module'"),
        ("nemo_polar.errors:Missing", "'nemo_polar.errors' has no attribute 'Missing'"),
        ("nemo_polar.errors.Missing", "'nemo_polar.errors' has no attribute 'Missing'"),
        ("no_such_top_level_pkg.x", "no module named 'no_such_top_level_pkg'"),
        ("justaname", "expected a dotted path"),
        ("pkg.:x", "expected pkg.mod:Name"),
        ("pkg..x", "expected a dotted path"),
        ("", "expected a dotted path"),
    ],
)
def test_failures_are_load_errors_naming_the_path(path: str, why: str) -> None:
    with pytest.raises(LoadError) as info:
        load_object(path, what="thing")
    assert isinstance(info.value, PolarError) and isinstance(info.value, KeyError)
    assert f"cannot load thing {path!r}" in str(info.value)
    assert why in str(info.value)


def test_an_error_inside_the_module_is_reported_not_mistaken_for_a_missing_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "polar_broken_mod.py").write_text("import polar_dependency_that_is_missing\nX = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "polar_broken_mod", raising=False)
    for path in ("polar_broken_mod:X", "polar_broken_mod.X"):
        with pytest.raises(LoadError, match=r"importing 'polar_broken_mod' failed.*polar_dependency_that_is_missing"):
            load_object(path)


def test_every_registry_accepts_both_spellings_and_raises_load_error() -> None:
    assert get_adapter("nemo_polar.harness_adapters.pi:PiAdapter").name == "pi"
    assert get_adapter("nemo_polar.harness_adapters.pi.PiAdapter").name == "pi"
    assert get_evaluator("nemo_polar.evaluators.swe_tests:swe_tests") is swe_tests
    assert get_evaluator("nemo_polar.evaluators.swe_tests.swe_tests") is swe_tests
    assert get_builder("nemo_polar.trajectory.prefix_merging:build_prefix_merging") is build_prefix_merging
    assert get_builder("nemo_polar.trajectory.prefix_merging.build_prefix_merging") is build_prefix_merging
    for fn, what in ((get_adapter, "harness"), (get_evaluator, "evaluator"), (get_builder, "builder")):
        with pytest.raises(LoadError, match=f"unknown {what} 'nope'"):
            fn("nope")
        with pytest.raises(LoadError, match=re.escape("'nemo_polar.nope:x'")):
            fn("nemo_polar.nope:x")
    with pytest.raises(LoadError, match="is not callable"):
        get_evaluator("nemo_polar.evaluators.swe_tests:PASSING")


def test_the_nemo_rl_target_loader_uses_the_same_rules() -> None:
    from nemo_polar.credit.nemo_rl.factory import import_target

    assert import_target("nemo_polar.errors.PolarError") is PolarError
    assert import_target("nemo_polar.errors:PolarError") is PolarError
    with pytest.raises(LoadError, match=re.escape("_target_ 'nemo_polar.errors.Nope'")):
        import_target("nemo_polar.errors.Nope")
