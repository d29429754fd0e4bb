# SPDX-License-Identifier: Apache-2.0
"""Wrap a NeMo RL module-level function in place, idempotently and reversibly: the one way the plug-in patches.

NeMo RL calls the functions the plug-in hooks (the estimator factory, `refit_policy_generation`, the Gym group
post-processing, the advantage logging, `spinup_nemo_gym_actor`) through their module globals, so replacing the
module attribute takes effect. `wrap(module, name, make_wrapper, flag)` builds `make_wrapper(original)`, marks it
with the attribute `flag` and `__wrapped__ = original`, and sets it on the module; a function that already
carries `flag` is left in place (or, with `rewrap=True`, replaced by a fresh wrapper of the function it wraps);
`wrap_if_present()` patches nothing where the module lacks the function. `unwrap(module, name, flag)` puts
`__wrapped__` back. Each caller keeps its own flag name, so a function wrapped
by an earlier version of this package is still recognised. `module` may also be a class (NeMo RL's
`CheckpointManager` methods, `training_state.py`); `launch.py` wraps `ray.init` the same way.

Does: patch one attribute of the module it is handed. Does not: import `nemo_rl` (a module given by dotted
name is imported by `resolve_module()` when called), or patch modules that imported the function by name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

Wrapper = Callable[..., Any]
Maker = Callable[[Wrapper], Wrapper]  # original -> its wrapper


def resolve_module(module: ModuleType | str | None, default: str) -> ModuleType:
    """`module` itself, or the module imported from its dotted name (`default` when None or empty)."""
    if isinstance(module, ModuleType):
        return module
    return importlib.import_module(module or default)


def is_wrapped(function: Any, flag: str) -> bool:
    """Whether `function` is a wrapper marked with `flag`."""
    return bool(getattr(function, flag, False))


def wrap(module: ModuleType | type, name: str, make_wrapper: Maker, flag: str, *, rewrap: bool = False) -> Wrapper:
    """Replace `<module>.<name>` by `make_wrapper(original)` marked with `flag` and `__wrapped__`.

    Returns:
        The function now at `<module>.<name>`: the new wrapper, or the existing one when it already carries
        `flag` (unless `rewrap`, which wraps its `__wrapped__` afresh). A missing `name` is `getattr`'s
        `AttributeError`.
    """
    original = getattr(module, name)
    if is_wrapped(original, flag):
        if not rewrap:
            return original  # type: ignore[no-any-return]
        original = original.__wrapped__
    wrapper = make_wrapper(original)
    setattr(wrapper, flag, True)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(module, name, wrapper)
    return wrapper


def wrap_if_present(
    module: ModuleType | type, name: str, make_wrapper: Maker, flag: str, *, rewrap: bool = False
) -> Wrapper | None:
    """`wrap()`, or None (nothing patched) when the module has no `name` (or it is None)."""
    if getattr(module, name, None) is None:
        return None
    return wrap(module, name, make_wrapper, flag, rewrap=rewrap)


def unwrap(module: ModuleType | type, name: str, flag: str, *, missing_ok: bool = False) -> bool:
    """Put back the function a `flag` wrapper at `<module>.<name>` wraps; False (no change) when none is there."""
    current: Any = getattr(module, name, None) if missing_ok else getattr(module, name)
    if not is_wrapped(current, flag):
        return False
    setattr(module, name, current.__wrapped__)
    return True
