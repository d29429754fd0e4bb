# SPDX-License-Identifier: Apache-2.0
"""`polar harness install NAME|all` and `polar harness list`.

`install` puts the pinned CLI of one built-in harness (or all of them) into
`<cache>/harnesses/<name>-<version>` (idempotent; `--force` reinstalls); `list` prints name, package, version
and whether it is installed. The lead registers this module in `nemo_polar/cli.py`'s `_SUBSYSTEMS`.
"""

from __future__ import annotations

import argparse
import sys

from . import BUILTIN, get_adapter
from .install import InstallError, install, status


def _names(name: str) -> list[str]:
    return list(BUILTIN) if name == "all" else [name]


def _cmd_install(args: argparse.Namespace) -> int:
    rc = 0
    for name in _names(args.name):
        try:
            adapter = get_adapter(name)
        except KeyError as exc:
            print(exc.args[0], file=sys.stderr)
            return 2
        try:
            st = install(adapter, force=args.force)
        except InstallError as exc:
            print(str(exc), file=sys.stderr)
            rc = 1
            continue
        where = st.path if st.path is not None else "(nothing to install)"
        print(f"{name}: {adapter.package or '-'} {adapter.version or '-'} -> {where}")
    return rc


def _cmd_list(args: argparse.Namespace) -> int:
    rows = [("NAME", "PACKAGE", "VERSION", "INSTALLED")]
    for name in BUILTIN:
        st = status(get_adapter(name))
        rows.append((name, st.package or "-", st.version or "-", "yes" if st.installed else "no"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("harness", help="install and list the pinned harness CLIs")
    sub = parser.add_subparsers(dest="harness_command", metavar="ACTION", required=True)
    p_install = sub.add_parser("install", help="install a harness CLI (or all) into the cache")
    p_install.add_argument("name", choices=[*BUILTIN, "all"], help="harness name or 'all'")
    p_install.add_argument("--force", action="store_true", help="reinstall even when present")
    p_install.set_defaults(func=_cmd_install)
    p_list = sub.add_parser("list", help="list harnesses: name, package, version, installed?")
    p_list.set_defaults(func=_cmd_list)
