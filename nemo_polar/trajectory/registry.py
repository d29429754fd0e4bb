# SPDX-License-Identifier: Apache-2.0
"""`build(records, builder=..., **options)`: the single entry point, with a registry of builders.

A builder is a pure function `(records, BuildOptions) -> Trajectory`. Built-ins: `per_request`,
`prefix_merging`. Users add their own with `register_builder(name, fn)` or name one by dotted path
(`package.module:function` or `package.module.function`). Options are validated at call time, all errors at once.
This module does no I/O, reads no clock and loads no tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from nemo_polar.errors import PolarError
from nemo_polar.loading import lookup
from nemo_polar.types import CompletionRecord, Trajectory

from .options import BuildOptions
from .per_request import build_per_request
from .prefix_merging import build_prefix_merging

__all__ = ["BuilderFn", "OptionsError", "available_builders", "build", "get_builder", "register_builder"]

BuilderFn = Callable[[Iterable[CompletionRecord], BuildOptions], Trajectory]


class OptionsError(PolarError, ValueError):
    """Builder options failed validation; `errors` lists every problem."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("invalid builder options: " + "; ".join(errors))


_REGISTRY: dict[str, BuilderFn] = {
    "per_request": build_per_request,
    "prefix_merging": build_prefix_merging,
}


def register_builder(name: str, fn: BuilderFn, *, replace: bool = False) -> None:
    """Register `fn` under `name` (refuses to shadow an existing name unless `replace`)."""
    if not callable(fn):
        raise TypeError(f"builder {name!r} is not callable")
    if name in _REGISTRY and not replace and _REGISTRY[name] is not fn:
        raise ValueError(f"builder {name!r} is already registered")
    _REGISTRY[name] = fn


def available_builders() -> list[str]:
    return sorted(_REGISTRY)


def get_builder(name: str) -> BuilderFn:
    """A registered builder, or one imported by dotted path; `LoadError` (a `KeyError`) when neither."""
    return lookup(_REGISTRY, name, what="builder")  # type: ignore[no-any-return]


def make_options(options: BuildOptions | None = None, **kwargs: Any) -> BuildOptions:
    """Validate keyword options (or pass a ready `BuildOptions` through, with keyword overrides)."""
    try:
        if options is None:
            return BuildOptions(**kwargs)
        if not kwargs:
            return options
        base = {name: getattr(options, name) for name in BuildOptions.model_fields}
        return BuildOptions(**{**base, **kwargs})
    except PydanticValidationError as exc:
        errors = [f"{'.'.join(str(x) for x in e['loc']) or 'options'}: {e['msg']}" for e in exc.errors()]
        raise OptionsError(errors) from exc


def build(
    records: Iterable[CompletionRecord],
    builder: str | BuilderFn = "prefix_merging",
    *,
    options: BuildOptions | None = None,
    **kwargs: Any,
) -> Trajectory:
    """Build a session's trajectory from its records.

    Args:
        records: the session's `CompletionRecord`s, any order (ordered by `seq` inside); failed ones are skipped.
        builder: a registered name, a dotted path, or a builder function.
        options: a ready `BuildOptions`; keyword arguments (e.g. `eot_token_ids=[151645]`, `fidelity="exact"`,
            `side_calls="mask"`, `forced_policy="mask"`, `classifier=fn`, `reward=1.0`) are validated here.
    """
    opts = make_options(options, **kwargs)
    fn = builder if callable(builder) else get_builder(builder)
    return fn(list(records), opts)
