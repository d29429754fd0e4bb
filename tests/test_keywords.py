# SPDX-License-Identifier: Apache-2.0
"""`nemo_polar.keywords.same_named`, and that the CLIs which carry their flags by name lose none on the way."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass

from nemo_polar.keywords import same_named


@dataclass
class _Target:
    a: int
    b: str = "b"
    c: float = 0.5


def _fn(x: int, *, y: int = 2, **rest: int) -> int:
    return x + y


def test_same_named_takes_the_targets_names_the_source_has_and_overrides_win() -> None:
    src = argparse.Namespace(a=1, b="B", unrelated=True)
    assert same_named(src, _Target) == {"a": 1, "b": "B"}
    assert _Target(**same_named(src, _Target)) == _Target(1, "B", 0.5)  # c: the target's default
    assert same_named(src, _Target, b="over", c=2.0) == {"a": 1, "b": "over", "c": 2.0}
    assert same_named(argparse.Namespace(x=1, y=3, rest=9), _fn) == {"x": 1, "y": 3}  # never **rest
    assert same_named(src, ("b", "missing")) == {"b": "B"}


def _parser(register: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))  # type: ignore[operator]
    return parser


def _dests(parser: argparse.ArgumentParser, *path: str) -> set[str]:
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return {a.dest for a in parser._actions if a.dest != "help"}


def test_every_proxy_flag_reaches_proxy_config() -> None:
    from nemo_polar.proxy import cli
    from nemo_polar.proxy.config import ProxyConfig

    fields = set(inspect.signature(ProxyConfig).parameters)
    # --host / --port bind the server and --event-loop picks the process's loop (arguments of app.run);
    # --upstream / --store are renamed (upstreams, store_dir)
    serving = {"host", "port", "event_loop", "upstream", "store"}
    assert _dests(_parser(cli.register), "proxy") - serving <= fields


def test_every_collect_option_flag_reaches_collect_options() -> None:
    from nemo_polar.collect import cli
    from nemo_polar.collect.collect import CollectOptions

    fields = set(inspect.signature(CollectOptions).parameters)
    # what picks the tasks, the upstream's parts (`_upstream`), and the display
    elsewhere = {"tasks", "harness", "samples", "builder", "plans", "model", "model_dir", "eot_token_ids"}
    elsewhere |= {"prefix_preserving", "no_credit", "report", "no_live"}
    assert _dests(_parser(cli.register), "collect") - elsewhere <= fields


def test_every_swe_gym_option_flag_is_passed_on() -> None:
    from nemo_polar.data import cli

    assert _dests(_parser(cli.register), "data", "swe-gym") - {"input", "out"} == set(cli.SWE_GYM_OPTIONS)
