# SPDX-License-Identifier: Apache-2.0
"""`same_named`: the one way an option is carried by name from where it was given to where it is used.

Options travel through several shapes on their way in: parsed CLI flags (`argparse.Namespace`), a validated
`StackConfig`, then the `ProxyConfig` / `GatewayConfig` / `ServerConfig` of the part that runs. Where a field has
the same name on both sides it is copied by that name, here, instead of being spelt out keyword by keyword in every
CLI and in the stack (docs/architecture.md); what is renamed or converted on the way is given as an override. This
module imports nothing of ours and holds no options itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["same_named"]

_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _names(target: Callable[..., Any] | Iterable[str]) -> list[str]:
    if callable(target):  # a dataclass, a pydantic model or a function: its keyword parameters
        return [n for n, p in inspect.signature(target).parameters.items() if p.kind in _KEYWORD_KINDS]
    return list(target)


def same_named(source: object, target: Callable[..., Any] | Iterable[str], **overrides: Any) -> dict[str, Any]:
    """The keyword arguments for `target` (a class or function: its keyword parameters; or the names given) that
    `source` has as attributes, each with `source`'s value, and `overrides` over them (what is renamed or
    converted on the way). A name `source` lacks is left out, so `target`'s default applies."""
    out = {n: getattr(source, n) for n in _names(target) if hasattr(source, n)}
    out.update(overrides)
    return out
