# SPDX-License-Identifier: Apache-2.0
"""`credit/nemo_rl/wrapping.py` on a throwaway module object (no NeMo RL): wrap, idempotence, flag, rewrap, unwrap."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from nemo_polar.credit.nemo_rl.wrapping import is_wrapped, resolve_module, unwrap, wrap, wrap_if_present

FLAG = "__test_wrapped__"


def _module() -> ModuleType:
    module = ModuleType("throwaway")
    module.double = lambda x: 2 * x  # type: ignore[attr-defined]
    return module


def _plus_one(original: Callable[..., Any]) -> Callable[..., Any]:
    def plus_one(x: int) -> int:
        return int(original(x)) + 1

    return plus_one


def test_wrap_marks_and_replaces_then_unwrap_restores() -> None:
    module = _module()
    original = module.double
    wrapper = wrap(module, "double", _plus_one, FLAG)
    assert module.double is wrapper and module.double(3) == 7
    assert getattr(wrapper, FLAG) is True and is_wrapped(wrapper, FLAG) and not is_wrapped(original, FLAG)
    assert wrapper.__wrapped__ is original  # type: ignore[attr-defined]
    assert unwrap(module, "double", FLAG) is True
    assert module.double is original and module.double(3) == 6
    assert unwrap(module, "double", FLAG) is False  # nothing to undo
    assert module.double is original


def test_wrap_is_idempotent_per_flag() -> None:
    module = _module()
    made: list[Callable[..., Any]] = []

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        made.append(original)
        return _plus_one(original)

    first = wrap(module, "double", make, FLAG)
    assert wrap(module, "double", make, FLAG) is first and len(made) == 1  # the maker is not called again
    assert module.double(3) == 7
    other = wrap(module, "double", _plus_one, "__another_flag__")  # another flag wraps on top
    assert other is not first and module.double(3) == 8 and other.__wrapped__ is first  # type: ignore[attr-defined]


def test_rewrap_replaces_the_wrapper_instead_of_stacking() -> None:
    module = _module()
    original = module.double
    first = wrap(module, "double", _plus_one, FLAG, rewrap=True)
    second = wrap(module, "double", _plus_one, FLAG, rewrap=True)
    assert second is not first and module.double is second
    assert second.__wrapped__ is original and module.double(3) == 7  # type: ignore[union-attr]


def test_missing_attribute() -> None:
    module = _module()
    with pytest.raises(AttributeError):
        wrap(module, "absent", _plus_one, FLAG)
    with pytest.raises(AttributeError):
        unwrap(module, "absent", FLAG)
    assert wrap_if_present(module, "absent", _plus_one, FLAG) is None
    assert unwrap(module, "absent", FLAG, missing_ok=True) is False
    assert not hasattr(module, "absent")


def test_resolve_module() -> None:
    module = _module()
    assert resolve_module(module, "json") is module
    assert resolve_module(None, "json") is json
    assert resolve_module("", "json") is json
    assert resolve_module("json", "os") is json


def test_wrap_a_method_of_a_class() -> None:
    class Manager:
        def double(self, x: int) -> int:
            return 2 * x

    original = Manager.double

    def plus_one(method: Callable[..., Any]) -> Callable[..., Any]:
        def double(self: Manager, x: int) -> int:
            return int(method(self, x)) + 1

        return double

    wrapper = wrap(Manager, "double", plus_one, FLAG)
    assert wrap(Manager, "double", plus_one, FLAG) is wrapper and Manager().double(3) == 7  # bound to the instance
    assert unwrap(Manager, "double", FLAG) is True and Manager.double is original and Manager().double(3) == 6
