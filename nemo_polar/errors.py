# SPDX-License-Identifier: Apache-2.0
"""The exception root of nemo-polar: every error the package raises on purpose derives from `PolarError`.

`except PolarError` catches any of them (and nothing from a library underneath). Classes keep an extra standard
base where callers catch that one (`ValueError` for bad input, `RuntimeError` for a failed operation, `KeyError`
for an unknown name), so adding the root changed no `except` clause. This module also holds the few errors that
two packages raise and that must not be defined twice (`PlanError`, `LoadError`), and `InputProblems`, the shape of
the input files' all-problems-at-once errors. It imports nothing of ours.
"""

from __future__ import annotations

__all__ = ["InputProblems", "LoadError", "PlanError", "PolarError"]


class PolarError(Exception):
    """Base of every exception nemo-polar raises on purpose."""


class PlanError(PolarError, ValueError):
    """A session plan is malformed, or one of its steps cannot be resolved for the harness (see docs/contracts.md,
    "Plans"). Raised by the harness adapters (resolving harness-neutral steps) and the proxy (validating a plan)."""


class LoadError(PolarError, KeyError):
    """A name or dotted path (`pkg.mod:Name` / `pkg.mod.Name`) could not be resolved to an object; the message
    names the path and why. A `KeyError` too, so the registries' callers that catch an unknown name keep working."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InputProblems(PolarError, ValueError):
    """An input file (or list) has problems: `errors` lists every one, with its line number where there is one; the
    message counts them (`noun`, set by each subclass) and lists one a line."""

    noun = "problem(s)"

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__(f"{len(errors)} {self.noun}:\n  " + "\n  ".join(errors))
