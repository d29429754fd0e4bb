# SPDX-License-Identifier: Apache-2.0
"""The `polar` command line: one entry point, subcommands contributed by the subsystems.

Each subsystem that has commands exposes `register(subparsers)` in a `cli` module listed in
`_SUBSYSTEMS`; a subsystem that is not installed yet is skipped. This module does no work itself.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

_SUBSYSTEMS = (
    "nemo_polar.backend.cli",
    "nemo_polar.proxy.cli",
    "nemo_polar.harness_adapters.cli",
    "nemo_polar.runtime.cli",
    "nemo_polar.runtime.image_cli",
    "nemo_polar.trajectory.cli",
    "nemo_polar.rollout.cli",
    "nemo_polar.collect.cli",
    "nemo_polar.credit.cli",
    "nemo_polar.data.cli",
    "nemo_polar.demo",
    "nemo_polar.train_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polar",
        description="nemo-polar: train any coding-agent harness with RL without modifying it.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    from nemo_polar import __version__

    parser.add_argument("--version", action="version", version=f"nemo-polar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBSYSTEMS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        register: Callable[[argparse._SubParsersAction], None] = mod.register
        register(sub)
    return parser


# the commands that serve model calls: run as the program, they move to huge pages before anything is imported
# (`proxy/tuning.py`, "Huge pages")
SERVING_COMMANDS = frozenset({"proxy", "serve", "serve-rollout", "serve-gateway", "collect", "demo"})


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named in `argv` (the first word that is not an option), without parsing it."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and _command(sys.argv[1:]) in SERVING_COMMANDS:
        from nemo_polar.proxy.tuning import start_serving_process

        start_serving_process()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    rc = func(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
