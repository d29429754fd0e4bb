# SPDX-License-Identifier: Apache-2.0
"""The in-sandbox half of the network relay: the only way out of the sandbox's network namespace.

Run as a script (standard library only) as the sandbox's first process. It listens on `127.0.0.1:<port>` inside
the namespace (the same port as the host-side proxy, so the harness keeps its base URL), forwards every accepted
connection over a unix socket that the host bind-mounts into the sandbox, and appends one JSON line per
connection to the connect trace (`{"event": "connect", "dest": "127.0.0.1:<port>", "t": …}`, then `"close"` with
byte counts). Then it runs the given command as its child, waits for it and exits with its status (128+signal
when killed). SIGTERM/SIGINT are passed on to the child's process group.

    python3 relay.py --port 18080 --unix /polar-ctl/relay.sock --trace /polar-ctl/connect.jsonl -- CMD ARGS…

It does not filter or parse HTTP; it knows nothing of the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import TextIO

_CHUNK = 64 * 1024
_CONNECT_TIMEOUT_S = 10.0


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    n = 0
    try:
        while data := await reader.read(_CHUNK):
            n += len(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            pass
    return n


class Relay:
    def __init__(self, port: int, unix_path: str, trace: TextIO):
        self.port = port
        self.unix_path = unix_path
        self.trace = trace
        self.count = 0

    def log(self, **fields: object) -> None:
        self.trace.write(json.dumps({"t": round(time.time(), 6), **fields}) + "\n")
        self.trace.flush()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except asyncio.CancelledError:  # the command exited while a connection was still open
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.count += 1
        cid = self.count
        peer = writer.get_extra_info("peername")
        self.log(event="connect", id=cid, dest=f"127.0.0.1:{self.port}", peer=f"{peer[0]}:{peer[1]}" if peer else "")
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_unix_connection(self.unix_path), _CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            self.log(event="error", id=cid, error=repr(exc))
            writer.close()
            return
        sent, received = await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
        for w in (up_w, writer):
            w.close()
        self.log(event="close", id=cid, bytes_up=sent, bytes_down=received)


async def _main(args: argparse.Namespace, trace: TextIO) -> int:
    relay = Relay(args.port, args.unix, trace)
    server = await asyncio.start_server(relay.handle, "127.0.0.1", args.port)
    relay.log(event="listen", dest=f"127.0.0.1:{args.port}")
    proc = await asyncio.create_subprocess_exec(*args.command, start_new_session=True)

    def forward(signum: int) -> None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, forward, sig)
    rc = await proc.wait()
    try:  # reap what the command left behind in its group
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.close()
    relay.log(event="exit", code=rc)
    return rc if rc >= 0 else 128 - rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="in-sandbox TCP→unix-socket relay")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unix", required=True)
    parser.add_argument("--trace", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given")
    with open(args.trace, "a", encoding="utf-8") as trace:
        return asyncio.run(_main(args, trace))


if __name__ == "__main__":
    sys.exit(main())
