# SPDX-License-Identifier: Apache-2.0
"""Layout tests: the import rules of docs/architecture.md (dependencies point inward, no core → credit arrow, no
cycles, nothing imports polar_lab), module size and docstrings, SPDX headers, packaging lists every package."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
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


def _module_level(tree: ast.Module) -> Iterator[ast.AST]:
    """The import statements that run when the module is imported: top level (inside `try`/`if` too), but not
    in functions, classes or `if TYPE_CHECKING:` blocks."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                stack.extend(node.body)
            stack.extend(node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend([*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)])
        elif isinstance(node, ast.With):
            stack.extend(node.body)


def _imports(path: Path, modname: str, *, module_level: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in _module_level(tree) if module_level else ast.walk(tree):
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


CORE_LEAVES = (
    "nemo_polar.errors",
    "nemo_polar.keywords",
    "nemo_polar.loading",
    "nemo_polar.token_ids",
    "nemo_polar.types",
)
ABOVE_ROLLOUT = (
    "nemo_polar.collect",
    "nemo_polar.data",
    "nemo_polar.demo",
    "nemo_polar.cli",
    "nemo_polar.credit",
)


def _all_but(*allowed: str) -> tuple[str, ...]:
    """Every top-level part of nemo_polar except `allowed` (for rules that list what a package MAY import)."""
    parts = {
        m.split(".")[1] if m.count(".") >= 1 else m
        for m in _modules()
        if m.startswith("nemo_polar.") and not m.startswith("nemo_polar.credit.")
    } | {"credit"}
    keep = {a.split(".")[1] for a in allowed}
    return tuple(sorted(f"nemo_polar.{p}" for p in parts - keep))


# (importer prefix, forbidden import prefixes, why): docs/architecture.md, "Folders, what they own, what they may
# import". A rule that names what a package MAY import is written with `_all_but(...)`.
RULES: list[tuple[str, tuple[str, ...], str]] = [
    ("nemo_polar.errors", ("nemo_polar",), "errors.py imports nothing of ours"),
    ("nemo_polar.loading", _all_but("nemo_polar.errors"), "loading.py imports only errors"),
    ("nemo_polar.keywords", ("nemo_polar",), "keywords.py imports nothing of ours"),
    ("nemo_polar.token_ids", ("nemo_polar",), "token_ids.py imports nothing of ours"),
    (
        "nemo_polar.types",
        _all_but("nemo_polar.errors", "nemo_polar.token_ids"),
        "types.py is a leaf (errors, token_ids)",
    ),
    ("nemo_polar.trajectory", _all_but(*CORE_LEAVES), "trajectory imports only types/errors/loading"),
    ("nemo_polar.harness_adapters", _all_but(*CORE_LEAVES), "adapters see a small context object, not the gateway"),
    ("nemo_polar.proxy", _all_but(*CORE_LEAVES), "the proxy knows no adapter, rollout, runtime or credit"),
    ("nemo_polar.backend", _all_but("nemo_polar.errors", "nemo_polar.types"), "the backend is a leaf"),
    ("nemo_polar.examples", _all_but(), "the example tasks are data"),
    (
        "nemo_polar.rundir",
        (
            *_all_but(*CORE_LEAVES, "nemo_polar.proxy"),
            *(f"nemo_polar.proxy.{m}" for m in ("app", "admin", "dialects")),
        ),
        "the run directory reads records through the store only",
    ),
    (
        "nemo_polar.evaluators",
        (*_all_but(*CORE_LEAVES, "nemo_polar.rollout"), "nemo_polar.rollout.server", "nemo_polar.rollout.gateway"),
        "evaluators see types and the Runtime they are handed (rollout.runtime), nothing else",
    ),
    (
        "nemo_polar.runtime",
        ("nemo_polar.proxy", "nemo_polar.evaluators", "nemo_polar.backend", *ABOVE_ROLLOUT),
        "runtimes run harnesses; they reach the proxy only through the stack",
    ),
    (
        "nemo_polar.rollout",
        ("nemo_polar.backend", *ABOVE_ROLLOUT),
        "the rollout service sits below collect and credit",
    ),
    (
        "nemo_polar.collect",
        ("nemo_polar.credit", "nemo_polar.demo", "nemo_polar.cli"),
        "no core module imports credit",
    ),
    (
        "nemo_polar.data",
        ("nemo_polar.proxy", "nemo_polar.runtime", "nemo_polar.backend", "nemo_polar.collect", "nemo_polar.credit"),
        "data converters produce rows and TaskSpecs only",
    ),
    (
        "nemo_polar.credit",
        (
            "nemo_polar.proxy",
            "nemo_polar.rollout.server",
            "nemo_polar.rollout.gateway",
            "nemo_polar.rollout.stack",
            "nemo_polar.runtime",
            "nemo_polar.evaluators",
            "nemo_polar.backend",
            "nemo_polar.collect",
            "nemo_polar.cli",
        ),
        "credit imports types/trajectory/rundir (and only its counterfactual module the rollout client)",
    ),
]
CREDIT_ROLLOUT_OK = ("nemo_polar.credit.counterfactual_rollout",)  # the one credit module that is a rollout client
OUTWARD_THIRD_PARTY = ("nemo_gym", "nemo_rl")


def _violations() -> list[str]:
    bad: list[str] = []
    for mod, path in _modules().items():
        imports = _imports(path, mod)
        for prefix, forbidden, why in RULES:
            if mod == prefix or mod.startswith(prefix + "."):
                for imp in imports:
                    if imp == prefix or imp.startswith(prefix + "."):
                        continue  # within the package itself
                    if any(imp == f or imp.startswith(f + ".") for f in forbidden):
                        bad.append(f"{mod} imports {imp}: {why}")
        in_credit = mod.startswith("nemo_polar.credit")
        for imp in imports:
            if not in_credit and (imp == "nemo_polar.credit" or imp.startswith("nemo_polar.credit.")):
                bad.append(f"{mod} imports {imp}: no arrow from the core into credit")
            if in_credit and imp.startswith("nemo_polar.rollout") and mod not in CREDIT_ROLLOUT_OK:
                bad.append(f"{mod} imports {imp}: only {CREDIT_ROLLOUT_OK[0]} may use the rollout service")
            if imp.split(".")[0] == "polar_lab":
                bad.append(f"{mod} imports {imp}: nothing in nemo_polar imports polar_lab")
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


def _module_graph() -> dict[str, set[str]]:
    """Module → the nemo_polar modules it imports when it is imported (module level, see `_module_level`)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        found = _imports(path, mod, module_level=True)
        # `from pkg import sub` names the submodule `pkg.sub`: the edge goes there, not to pkg/__init__ (which
        # a package's own modules may import from while it initialises); `from pkg import name` goes to pkg.
        targets = {i for i in found if i in mods}
        targets -= {
            t for t in list(targets) if any(o.startswith(t + ".") for o in targets) and t not in _named(path, mod, t)
        }
        graph[mod] = targets - {mod}
    return graph


def _named(path: Path, modname: str, pkg: str) -> set[str]:
    """`{pkg}` when the module imports a name from `pkg` that is not a submodule (so pkg itself is needed)."""
    mods = _modules()
    for imp in _imports(path, modname, module_level=True):
        if imp.startswith(pkg + ".") and imp.count(".") == pkg.count(".") + 1 and imp not in mods:
            return {pkg}
    return set()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_cycles_between_modules() -> None:
    assert _cycles(_module_graph()) == []


MAX_LINES = 600


def _sizes_and_docstrings() -> Iterator[tuple[str, Path, int, bool]]:
    for mod, path in sorted(_modules().items()):
        text = path.read_text()
        yield mod, path, len(text.splitlines()), bool(ast.get_docstring(ast.parse(text)))


def test_every_module_opens_with_a_docstring() -> None:
    assert [str(p.relative_to(ROOT)) for _, p, _, doc in _sizes_and_docstrings() if not doc] == []


def test_every_module_is_under_600_lines() -> None:
    too_long = {
        rel: n for _, p, n, _ in _sizes_and_docstrings() if n >= MAX_LINES and (rel := str(p.relative_to(ROOT)))
    }
    assert too_long == {}, "split these modules (one concept per module)"


def test_the_checker_catches_cycles_core_to_credit_and_polar_lab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "nemo_polar"
    for d in ("rollout", "collect", "evaluators"):
        (fake / d).mkdir(parents=True)
    (fake / "rollout" / "__init__.py").write_text('"""r."""\n')
    (fake / "rollout" / "a.py").write_text("from nemo_polar.rollout import b\n")
    (fake / "rollout" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nemo_polar.rollout import c\n"
        "import nemo_polar.rollout.a\n"
    )
    (fake / "rollout" / "c.py").write_text("def f():\n    from nemo_polar.rollout import b\n")
    (fake / "collect" / "__init__.py").write_text("from nemo_polar.credit import runio\nimport polar_lab.credit_sim\n")
    (fake / "evaluators" / "__init__.py").write_text("from nemo_polar.proxy import app\n")
    monkeypatch.setitem(SOURCE_ROOTS, "nemo_polar", fake)
    monkeypatch.setitem(SOURCE_ROOTS, "nemo_polar.harness_adapters", tmp_path / "none1")
    monkeypatch.setitem(SOURCE_ROOTS, "nemo_polar.credit", tmp_path / "none2")
    # a and b import each other at module level; c's import of b is lazy and b's of c is for type checking only
    assert _cycles(_module_graph()) == [["nemo_polar.rollout.a", "nemo_polar.rollout.b"]]
    found = _violations()
    assert any(
        v.startswith("nemo_polar.collect imports nemo_polar.credit.runio: no arrow from the core") for v in found
    )
    assert any("nemo_polar.collect imports polar_lab.credit_sim" in v for v in found)
    assert any(v.startswith("nemo_polar.evaluators imports nemo_polar.proxy") for v in found)


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
