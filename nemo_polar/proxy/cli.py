# SPDX-License-Identifier: Apache-2.0
"""`polar proxy`: run the model-API proxy standalone in front of one or more vLLM (or SGLang) servers.

    polar proxy --upstream http://127.0.0.1:8000 [--upstream URL ...] --port 8080 --store runs/proxy

The control token for the admin API comes from `POLAR_CONTROL_TOKEN`, or is generated and printed.
This module only parses flags; the server is `nemo_polar.proxy.app`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from nemo_polar.keywords import same_named
from nemo_polar.proxy.config import ProxyConfig as _Defaults

__all__ = ["register"]


def _cache_mb(text: str) -> int | None:
    """`--store-page-cache-mb`: MiB >= 0, or `all` (None: no pages dropped)."""
    if text == "all":
        return None
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"expected MiB (an integer >= 0) or `all`, not {text!r}")
    return int(text)


_DIRECT_IO = {"auto": None, "on": True, "off": False}


def _direct_io(text: str) -> bool | None:
    """`--store-direct-io`: auto | on | off."""
    if text not in _DIRECT_IO:
        raise argparse.ArgumentTypeError(f"expected auto, on or off, not {text!r}")
    return _DIRECT_IO[text]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("proxy", help="run the model-API proxy (records every call token-faithfully)")
    p.add_argument(
        "--upstream",
        action="append",
        required=True,
        metavar="URL",
        help="inference server base URL (repeat for several; sessions stick to one by hash)",
    )
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--store", required=True, metavar="DIR", help="record store directory (SQLite WAL)")
    p.add_argument("--engine", default="vllm", choices=["vllm", "sglang"])
    p.add_argument("--served-model", default=None, help="served model name (default: the upstream's first model)")
    p.add_argument(
        "--sampling",
        default=None,
        metavar="JSON",
        help='gateway sampling overrides, e.g. \'{"temperature": 1.0, "top_p": 1.0, "max_tokens": 4096}\'',
    )
    p.add_argument("--strict-models", action="store_true", help="404 for model names that are not served")
    p.add_argument(
        "--prefix-preserving",
        choices=["splice", "nemo_rl"],
        default=None,
        help="splice: the proxy splices the chain tip itself (stock vLLM, needs --model-dir); "
        "nemo_rl: send required_prefix_token_ids",
    )
    p.add_argument(
        "--model-dir", default=None, help="tokenizer + chat template folder (for --prefix-preserving splice)"
    )
    spelling = "forced/choose plan steps: grammar (spelled under a grammar) | canonical (needs --model-dir)"
    p.add_argument("--forced-tokens", choices=["grammar", "canonical"], default="grammar", help=spelling)
    p.add_argument(
        "--chat-template", default=None, help="chat template file vLLM was started with, if not the model's"
    )
    p.add_argument(
        "--fsync",
        action="store_true",
        help="fsync every commit batch (survives power loss); default: WAL synchronous=NORMAL (survives a killed proxy)",
    )
    p.add_argument(
        "--store-page-cache-mb",
        type=_cache_mb,
        default=_Defaults.store_page_cache_mb,
        metavar="MB|all",
        help="MiB of the record store's payload file kept in the page cache behind its end; older pages are dropped "
        "once on disk (default: %(default)s; `all`: the OS decides)",
    )
    p.add_argument(
        "--store-direct-io",
        type=_direct_io,
        default=_Defaults.store_direct_io,
        metavar="auto|on|off",
        help="write the record store's payload file with O_DIRECT, past the page cache (less CPU per record); "
        "auto (default): on a local block file system (ext4, xfs, btrfs, f2fs); on: wherever the file system takes it",
    )
    p.add_argument(
        "--no-session-deltas",
        dest="session_deltas",
        action="store_false",
        help="write every record whole (default: a record whose prompt extends an earlier one of its session is "
        "written as what is new; readers see whole records either way)",
    )
    p.add_argument(
        "--routing",
        choices=["sticky", "round_robin"],
        default="sticky",
        help="sticky: each session stays on one upstream (prefix-cache reuse); round_robin: each request goes to "
        "the next upstream",
    )
    for field, what in (
        ("read_timeout_s", "the longest silence waited for from the upstream in an answer, then a 504"),
        ("pause_wait_s", "how long a call waits while admission is paused (a weight update), then a 503"),
    ):
        flag = "--" + field.replace("_", "-")
        p.add_argument(flag, type=float, default=getattr(_Defaults, field), help=f"{what} (default: %(default)s)")
    p.add_argument("--connect-timeout-s", type=float, default=5.0)
    p.add_argument(
        "--stream-interval",
        type=int,
        default=None,
        metavar="N",
        help="vLLM streams: ask for N tokens a chunk (vLLM >= 0.32; fewer chunks, less proxy CPU; default: the server's)",
    )
    p.add_argument(
        "--stream-headers-after-s",
        type=_headers_after,
        default=_Defaults.stream_headers_after_s,
        metavar="S",
        help="send a stream's headers alone when its first token takes longer than S seconds (a weight update's "
        "wait included; some harnesses give up on headers after 60 s), and a Google generateContent call's when its "
        "answer does; `never`: always with the first token (default: %(default)s)",
    )
    p.add_argument(
        "--http-server",
        choices=["lean", "aiohttp"],
        default=_Defaults.http_server,
        help="lean (default): harness calls are read and answered by the proxy's own HTTP/1.1 front (less CPU a "
        "call; the admin API and anything unusual go to aiohttp); aiohttp: aiohttp's server for everything",
    )
    p.add_argument(
        "--event-loop",
        choices=["auto", "uvloop", "asyncio"],
        default=None,
        help="the process's event loop (default: $POLAR_EVENT_LOOP, else auto: uvloop where installed)",
    )
    p.set_defaults(func=_run)


def _headers_after(text: str) -> float | None:
    if text == "never":
        return None
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds > 0, or `never`")
    return value


def _run(args: argparse.Namespace) -> int:
    from nemo_polar.proxy.app import ProxyConfig, run
    from nemo_polar.proxy.tuning import serving_loop
    from nemo_polar.proxy.upstream_http import Target

    for url in args.upstream:
        try:
            Target.parse(url)
        except ValueError as exc:
            print(f"polar proxy: --upstream {url}: {exc} (e.g. http://127.0.0.1:8000)", file=sys.stderr)
            return 2
    if args.forced_tokens == "canonical" and not args.model_dir:
        print("polar proxy: --forced-tokens canonical needs --model-dir (the model's tokenizer)", file=sys.stderr)
        return 2
    sampling: dict[str, Any] = json.loads(args.sampling) if args.sampling else {}
    # every flag but --upstream / --store is named as its ProxyConfig field
    cfg = ProxyConfig(
        **same_named(args, ProxyConfig, upstreams=args.upstream, store_dir=args.store, sampling=sampling)
    )
    try:
        loop = serving_loop(args.event_loop)
    except ValueError as exc:  # an unknown name, or uvloop asked for and not installed
        print(f"polar proxy: {exc}", file=sys.stderr)
        return 2
    run(cfg, host=args.host, port=args.port, loop=loop)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m nemo_polar.proxy.cli …`: the same flags as `polar proxy`, without loading the other subsystems.
    Run as the program (`argv` None), it first moves to huge pages (`tuning.start_serving_process`), before the
    server is imported."""
    if argv is None:
        from nemo_polar.proxy.tuning import start_serving_process

        start_serving_process()
    parser = argparse.ArgumentParser(prog="polar")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["proxy", *(argv if argv is not None else sys.argv[1:])])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
