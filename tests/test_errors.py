# SPDX-License-Identifier: Apache-2.0
"""One exception root: every exception class nemo-polar defines derives from `nemo_polar.errors.PolarError`, each
name is defined once, and the extra standard bases callers catch are kept."""

from __future__ import annotations

import ast
import builtins
from collections import Counter
from pathlib import Path

import pytest

from nemo_polar.errors import LoadError, PlanError, PolarError

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / d for d in ("nemo_polar", "harness_adapters", "credit", "environments")]
BUILTIN_EXCEPTIONS = {
    n
    for n in dir(builtins)
    if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)
}


def _exception_classes() -> list[tuple[str, str, list[str]]]:
    """(file, class, base names) of every class whose bases name a builtin exception, PolarError or another such
    class (resolved by name across the tree, to a fixed point)."""
    classes: list[tuple[str, str, list[str]]] = []
    for base in SOURCES:
        for path in sorted(base.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    names = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                    classes.append((str(path.relative_to(ROOT)), node.name, names))
    known = BUILTIN_EXCEPTIONS | {"PolarError", "ProviderError"}
    while True:
        grown = known | {name for _, name, bases in classes if set(bases) & known}
        if grown == known:
            break
        known = grown
    return [(f, n, b) for f, n, b in classes if set(b) & known]


def _offenders() -> list[str]:
    """Classes that derive only from builtin exceptions (no nemo-polar class among their bases)."""
    ours = {name for _, name, _ in _exception_classes()}
    out = []
    for file, name, bases in _exception_classes():
        if name.startswith("_") or file == "nemo_polar/errors.py":
            continue  # private control-flow signals stay outside the root
        if not (set(bases) & (ours | {"PolarError"})):
            out.append(f"{file}::{name}")
    return out


def test_every_exception_class_is_under_the_polar_root() -> None:
    assert _offenders() == []


def test_no_exception_name_is_defined_twice() -> None:
    counts = Counter(name for _, name, _ in _exception_classes() if not name.startswith("_"))
    assert [n for n, c in counts.items() if c > 1] == []


def test_the_classes_import_and_keep_their_standard_bases() -> None:
    from nemo_polar.harness_adapters import PlanError as AdapterPlanError

    from nemo_polar.backend import PrepareError
    from nemo_polar.proxy.engines.base import UpstreamError
    from nemo_polar.proxy.sessions import PlanError as ProxyPlanError
    from nemo_polar.rollout.spec import TaskSpecError
    from nemo_polar.trajectory import OptionsError
    from nemo_polar.types import ValidationError

    assert AdapterPlanError is ProxyPlanError is PlanError
    assert issubclass(PlanError, ValueError) and issubclass(LoadError, KeyError)
    for cls, std in (
        (PrepareError, RuntimeError),
        (TaskSpecError, ValueError),
        (OptionsError, ValueError),
        (ValidationError, ValueError),
        (UpstreamError, Exception),
    ):
        assert issubclass(cls, PolarError) and issubclass(cls, std), cls
    with pytest.raises(PolarError):
        raise TaskSpecError(["x"])
