# SPDX-License-Identifier: Apache-2.0
"""Layout tests: dependencies point inward (DESIGN §1), SPDX headers, packaging lists every package."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# directory on disk -> import name (the setuptools package-dir mapping)
SOURCE_ROOTS = {
    "nemo_polar": ROOT / "nemo_polar",
    "nemo_polar.harness_adapters": ROOT / "harness_adapters",
    "nemo_polar.credit": ROOT / "credit",
}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for prefix, base in SOURCE_ROOTS.items():
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([prefix, *parts])] = path
    return out


def _imports(path: Path, modname: str) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = modname.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return found


# (importer prefix, forbidden import prefixes, why)
RULES: list[tuple[str, tuple[str, ...], str]] = [
    ("nemo_polar.types", ("nemo_polar",), "types.py is a leaf"),
    (
        "nemo_polar.trajectory",
        (
            "nemo_polar.proxy",
            "nemo_polar.rollout",
            "nemo_polar.runtime",
            "nemo_polar.evaluators",
            "nemo_polar.backend",
            "nemo_polar.credit",
            "nemo_polar.harness_adapters",
            "nemo_polar.cli",
        ),
        "trajectory imports only types",
    ),
    (
        "nemo_polar.credit",
        (
            "nemo_polar.proxy",
            "nemo_polar.rollout.server",
            "nemo_polar.rollout.gateway",
            "nemo_polar.runtime",
            "nemo_polar.backend",
            "nemo_polar.cli",
        ),
        "credit imports types/trajectory (and only its counterfactual module the rollout client)",
    ),
    (
        "nemo_polar.proxy",
        ("nemo_polar.harness_adapters", "nemo_polar.rollout", "nemo_polar.credit"),
        "the proxy knows no adapter, rollout or credit",
    ),
    (
        "nemo_polar.harness_adapters",
        ("nemo_polar.proxy", "nemo_polar.rollout", "nemo_polar.credit"),
        "adapters see a small context object, not the gateway",
    ),
]
OUTWARD_THIRD_PARTY = ("nemo_gym", "nemo_rl")


def _violations() -> list[str]:
    bad: list[str] = []
    for mod, path in _modules().items():
        imports = _imports(path, mod)
        for prefix, forbidden, why in RULES:
            if mod == prefix or mod.startswith(prefix + "."):
                for imp in imports:
                    if any(imp == f or imp.startswith(f + ".") for f in forbidden):
                        bad.append(f"{mod} imports {imp}: {why}")
        top = {i.split(".")[0] for i in imports}
        if top & set(OUTWARD_THIRD_PARTY) and not mod.startswith("nemo_polar.credit.nemo_rl"):
            bad.append(
                f"{mod} imports {sorted(top & set(OUTWARD_THIRD_PARTY))}: only environments/ and credit/nemo_rl may"
            )
        if "nemo_rl" in top and mod.startswith("nemo_polar.credit.nemo_rl"):
            tree = ast.parse(path.read_text())
            for node in tree.body:  # module-level import of nemo_rl would make it a hard dependency
                if isinstance(node, (ast.Import, ast.ImportFrom)) and "nemo_rl" in ast.unparse(node).split()[1]:
                    bad.append(f"{mod} imports nemo_rl at module level: it must be lazy")
    return sorted(set(bad))


def test_dependencies_point_inward() -> None:
    assert _violations() == []


def test_the_checker_catches_an_outward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nemo_polar"
    (fake / "trajectory").mkdir(parents=True)
    (fake / "types.py").write_text("from nemo_polar.proxy import app\n")
    (fake / "trajectory" / "__init__.py").write_text("from ..credit import x\nimport nemo_gym\n")
    monkeypatch.setitem(SOURCE_ROOTS, "nemo_polar", fake)
    monkeypatch.setitem(SOURCE_ROOTS, "nemo_polar.harness_adapters", tmp_path / "none1")
    monkeypatch.setitem(SOURCE_ROOTS, "nemo_polar.credit", tmp_path / "none2")
    found = _violations()
    assert any("nemo_polar.types imports nemo_polar.proxy" in v for v in found)
    assert any("nemo_polar.trajectory imports nemo_polar.credit" in v for v in found)
    assert any("nemo_polar.trajectory imports ['nemo_gym']" in v for v in found)


def test_every_source_file_has_spdx_header() -> None:
    roots = [
        ROOT / d
        for d in ("nemo_polar", "harness_adapters", "credit", "environments", "tests", "benchmarks", "scripts")
    ]
    missing = []
    for base in roots:
        for path in list(base.rglob("*.py")) + list(base.rglob("*.sh")):
            head = path.read_text().splitlines()[:3]
            if not any("SPDX-License-Identifier: Apache-2.0" in line for line in head):
                missing.append(str(path.relative_to(ROOT)))
    assert missing == []


def test_pyproject_lists_every_package() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {m for m, p in _modules().items() if p.name == "__init__.py"}
    assert on_disk - listed == set(), "add these packages to [tool.setuptools] packages"
    assert listed - on_disk == set(), "listed packages without an __init__.py"
