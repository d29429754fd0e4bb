# SPDX-License-Identifier: Apache-2.0
"""Shipped task sets built from real open-source repositories (see `pybugs`)."""

from __future__ import annotations

from nemo_polar.tasks.pybugs import PyBug, build_tree, load_catalog, task_specs

__all__ = ["PyBug", "build_tree", "load_catalog", "task_specs"]
