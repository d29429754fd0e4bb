# SPDX-License-Identifier: Apache-2.0
"""`load_object`: the one way nemo-polar resolves a dotted path to a Python object.

Registries (harness adapters, evaluators, trajectory builders, post-run hooks, the NeMo RL estimator `_target_`)
let a user name their own object by path. Both spellings are accepted everywhere: `pkg.mod:Name` (the module
left of the colon, an attribute path right of it) and `pkg.mod.Name` (the longest importable module prefix, then
attributes). Every failure is a `nemo_polar.errors.LoadError` that names the path and the cause. This module holds
no registry; `lookup` is the rule the registries share (a registered key first, else a dotted path to a callable).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from nemo_polar.errors import LoadError

__all__ = ["is_dotted_path", "load_object", "lookup"]


def is_dotted_path(name: str) -> bool:
    """Whether `name` is spelled as a path (`a.b:C` or `a.b.C`) rather than a bare registry key."""
    return ":" in name or "." in name


def _import(module: str, path: str, what: str) -> ModuleType | None:
    """The module, or None when the module itself does not exist (an error inside it is a `LoadError`)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module == missing or module.startswith(missing + ".")):
            return None
        raise LoadError(f"cannot load {what} {path!r}: importing {module!r} failed: {exc}") from exc
    except Exception as exc:
        raise LoadError(
            f"cannot load {what} {path!r}: importing {module!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def _attrs(obj: Any, attrs: list[str], module: str, path: str, what: str) -> Any:
    for i, attr in enumerate(attrs):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            where = ".".join([module, *attrs[:i]])
            raise LoadError(f"cannot load {what} {path!r}: {where!r} has no attribute {attr!r}") from None
    return obj


def load_object(path: str, *, what: str = "object") -> Any:
    """The object named by `path` (`pkg.mod:Name`, `pkg.mod:Outer.inner` or `pkg.mod.Name`).

    Args:
        path: the dotted path.
        what: what the caller is loading ("harness adapter", "evaluator", ...), used in error messages.

    Raises:
        LoadError: the path is malformed, its module is missing or fails to import, or an attribute is missing.
    """
    if not isinstance(path, str) or not path.strip():
        raise LoadError(f"cannot load {what} {path!r}: expected a dotted path (pkg.mod:Name or pkg.mod.Name)")
    module, colon, rest = path.partition(":")
    if colon:
        attrs = rest.split(".")
        if not module or not all(module.split(".")) or not all(attrs):
            raise LoadError(f"cannot load {what} {path!r}: expected pkg.mod:Name")
        mod = _import(module, path, what)
        if mod is None:
            raise LoadError(f"cannot load {what} {path!r}: no module named {module!r}")
        return _attrs(mod, attrs, module, path, what)
    parts = path.split(".")
    if len(parts) < 2 or not all(parts):
        raise LoadError(f"cannot load {what} {path!r}: expected a dotted path (pkg.mod:Name or pkg.mod.Name)")
    for cut in range(len(parts) - 1, 0, -1):  # the longest importable module prefix
        module = ".".join(parts[:cut])
        mod = _import(module, path, what)
        if mod is not None:
            return _attrs(mod, parts[cut:], module, path, what)
    raise LoadError(f"cannot load {what} {path!r}: no module named {parts[0]!r}")


def lookup(registry: Mapping[str, Any], name: str, *, what: str) -> Any:
    """`registry[name]`, or, when `name` is spelled as a dotted path, the callable it names.

    Raises:
        LoadError: `name` is neither a registered key (the message lists the keys) nor a loadable path to a callable.
    """
    if name in registry:
        return registry[name]
    if not is_dotted_path(name):
        raise LoadError(f"unknown {what} {name!r}; registered: {sorted(registry)} (or give a dotted path)")
    obj = load_object(name, what=what)
    if not callable(obj):
        raise LoadError(f"{what} {name!r} is not callable")
    return obj
