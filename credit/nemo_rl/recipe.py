# SPDX-License-Identifier: Apache-2.0
"""Load a NeMo RL recipe the way NeMo RL does: `defaults:` inheritance, `_override_`, Hydra overrides.

Where `nemo_rl` is importable (a NeMo RL launch, the NeMo RL environment of `scripts/nemo_rl_venv.sh`), this is
NeMo RL's own code: `nemo_rl.utils.config.load_config` for the `defaults:` chain, `parse_hydra_overrides` (Hydra's
override parser, struct mode) for the command-line overrides, `register_omegaconf_resolvers` for `${mul:...}` and
friends. So `launch --dry-run`, the schema tests and the trainer see exactly the same config.

Without `nemo_rl` (the project venv, where only `launch --dry-run` can run), a fallback with the same behaviour
and no Hydra (hydra-core 1.3 needs omegaconf < 2.4; the project pins 2.4): `defaults:` loaded depth-first and
merged, `_override_: true` replaces the inherited section, `key=value` changes an existing key (struct mode),
`+key=value` adds, `++key=value` adds or changes, `~key` deletes; values parsed as YAML flow scalars.
`OverrideError` is raised either way.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from nemo_polar.errors import PolarError

_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class OverrideError(PolarError, ValueError):
    """A command-line override does not apply (unknown key without `+`, `+` on an existing key, bad syntax)."""


def nemo_rl_config() -> ModuleType | None:
    """NeMo RL's `nemo_rl.utils.config` where NeMo RL is installed, else None."""
    try:
        return importlib.import_module("nemo_rl.utils.config")
    except ImportError:
        return None


def register_resolvers() -> None:
    """The arithmetic resolvers NeMo RL recipes use (`${mul:a,b}` …), registered once."""
    nrl = nemo_rl_config()
    if nrl is not None:
        nrl.register_omegaconf_resolvers()
        return
    for name, fn in (
        ("add", lambda a, b: a + b),
        ("mul", lambda a, b: a * b),
        ("div", lambda a, b: a / b),
        ("max", lambda a, b: max(a, b)),
    ):
        if OmegaConf.has_resolver(name):
            continue
        if "annotation_validation" in inspect.signature(OmegaConf.register_resolver).parameters:
            OmegaConf.register_resolver(name, fn)  # omegaconf >= 2.4 (register_new_resolver is deprecated there)
        else:
            OmegaConf.register_new_resolver(name, fn)


def _merge(base: DictConfig, child: DictConfig) -> DictConfig:
    for key in list(child.keys()):
        if OmegaConf.is_missing(child, key):
            continue
        value = child[key]
        if isinstance(value, DictConfig) and value.get("_override_", False):
            value.pop("_override_")
            if key in base:
                base.pop(key)
    merged = OmegaConf.merge(base, child)
    assert isinstance(merged, DictConfig)
    return merged


def load_recipe(path: str | Path) -> DictConfig:
    """A recipe with its `defaults:` chain merged (unresolved; see `to_plain`)."""
    path = Path(path)
    nrl = nemo_rl_config()
    if nrl is not None:
        loaded = nrl.load_config(path)
        assert isinstance(loaded, DictConfig)
        return loaded
    config = OmegaConf.load(path)
    if not isinstance(config, DictConfig):
        raise ValueError(f"{path}: a recipe must be a mapping")
    if "defaults" in config:
        defaults = config.pop("defaults")
        parents = [str(defaults)] if isinstance(defaults, str) else [str(d) for d in defaults]
        base = OmegaConf.create({})
        for parent in parents:
            parent_path = Path(parent) if parent.startswith("/") else path.parent / parent
            base = _merge(base, load_recipe(parent_path))
        config = _merge(base, config)
    return config


def parse_value(text: str) -> Any:
    """An override's value as Hydra reads it (YAML flow syntax; `1e-6` is a float; `${...}` stays a string)."""
    if "${" in text:
        return text
    if _FLOAT.match(text.strip()) and not re.match(r"^[-+]?\d+$", text.strip()):
        return float(text)
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


_MISSING = object()


def apply_overrides(config: DictConfig, overrides: list[str]) -> DictConfig:
    """Apply Hydra overrides in order (struct mode); raises `OverrideError`.

    With NeMo RL: its `parse_hydra_overrides` (Hydra's parser; stops at the first bad override). Without: the
    fallback, which lists every bad override at once.
    """
    nrl = nemo_rl_config()
    if nrl is not None:
        try:
            return nrl.parse_hydra_overrides(config, list(overrides))  # type: ignore[no-any-return]
        except nrl.OverridesError as exc:
            raise OverrideError(str(exc)) from exc
    errors: list[str] = []
    for item in overrides:
        deleting = item.startswith("~")
        force = item.startswith("++")
        add = item.startswith("+") and not force
        body = item[2:] if force else item[1:] if (add or deleting) else item
        key, sep, raw = body.partition("=")
        key = key.strip()
        if not key or (not sep and not deleting) or not re.match(r"^[\w.\-/@]+$", key):
            errors.append(f"{item!r}: expected key=value, +key=value, ++key=value or ~key")
            continue
        exists = OmegaConf.select(config, key, default=_MISSING, throw_on_missing=False) is not _MISSING
        if deleting:
            if not exists:
                errors.append(f"{item!r}: cannot delete {key}: no such key")
                continue
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(config, parent_key) if parent_key else config
            if isinstance(parent, DictConfig):
                del parent[leaf]
            elif isinstance(parent, ListConfig):
                del parent[int(leaf)]
            continue
        if add and exists:
            errors.append(f"{item!r}: {key} already exists; drop the '+' to change it, or use '++'")
            continue
        if not add and not force and not exists:
            errors.append(f"{item!r}: {key} is not in the config; prefix with '+' to add a new key")
            continue
        OmegaConf.update(config, key, parse_value(raw), merge=False, force_add=True)
    if errors:
        raise OverrideError("invalid overrides:\n  " + "\n  ".join(errors))
    return config


def to_plain(config: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python data (what NeMo RL passes to `MasterConfig(**config)`)."""
    register_resolvers()
    plain = OmegaConf.to_container(config, resolve=True)
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


def load_with_overrides(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """`load_recipe` + `apply_overrides` + `to_plain`."""
    return to_plain(apply_overrides(load_recipe(path), list(overrides or [])))
