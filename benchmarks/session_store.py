# SPDX-License-Identifier: Apache-2.0
"""Bytes and CPU of agent sessions' records in the proxy's record store, whole vs session deltas, side by side.

A synthetic agent session built the way the proxy builds its records: `--calls` calls whose prompt grows from
`--start` to `--end` tokens, `--answer`-token answers. Call i's OpenAI-chat `original_request` is a system message
(`peers.py`'s harness-like request, grown to `--start` tokens), the user's task and, for each earlier turn, an
assistant message (its answer text and one tool call) and the tool's result, whose text makes up the rest of the
growth; every call's body is a fresh object (as the proxy parses each request anew), its OpenAI-chat parse the
normalised `request`. `prompt_token_ids` are the previous call's prompt ids + its generation ids + new random ids up
to the call's target (at least `MIN_TAIL` new ones: with the defaults, 23,000 tokens over 49 calls is less than an
answer a call, so the prompt grows by answer + `MIN_TAIL` and ends past `--end`; the first table gives the real
range). Generation ids and logprobs are random. A streamed call writes its placeholder (`put_pending`) then its final
record (`commit`).

Each case commits the sessions through `RecordStore` on an asyncio loop, with `session_deltas=False` (`whole`) and
`True` (`deltas`), in the same run, the two stores' order alternated between repeats (the least CPU of `--repeat`
runs is reported): `--sessions` sessions at once (their calls interleaved, `--batch` committed at a time, as
`store_cost.py`'s batches: replies finishing in the same loop iteration) and one session alone (batch 1: a session's
calls follow each other). After `close()` every record is read back by `list_records` (each session), `get_record`
(each id) and `read_records(dir, ids=...)` and checked against what was committed (`record_bytes`, compared as
parsed JSON): a record that differs ends the run with a non-zero exit status naming it and its path.

Columns:
  delta recs  records the store wrote as deltas (`RecordStore.delta_records`: a stream's placeholders count too)
  MB/session  bytes on disk per session after `close()` (payload file + database + its WAL)
  KB/call     the same per call
  commit      CPU per call committed, us: the whole process (`getrusage`: event loop, checkpointer thread, opening
              and the final checkpoint of `close()`), and `loop`, the event-loop thread's share
  list / get / ids  CPU per record read back, us: `list_records` of each session on a reopened store, `get_record`
              of each id, `read_records(dir, ids=...)` of every id, session by session
A `deltas` row's cells carry their ratio to the `whole` row's in parentheses.

    .venv/bin/python benchmarks/session_store.py [--quick] [--calls 50] [--start 7000] [--end 30000] [--answer 512]
        [--sessions 8] [--batch N] [--repeat 3] [--dir DIR] [--replay RUN_DIR ...]

`--quick`: 20 calls a session, 4 sessions, 2 repeats (unless given). `--replay RUN_DIR` (repeatable) measures real
sessions instead of the synthetic one: the records of an existing store (e.g. `runs/demo` after `make demo`: real
CLIs on vLLM), committed again in the order they arrived, one at a time, into both stores, then read back and checked
the same way; one row pair per store and harness (the session id's second dot-separated part, else its dialect).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (the repository root)
import orjson
from _tables import note, table
from peers import mix_bodies
from store_cost import admitted, bench_record, cpu_s

from nemo_polar.proxy.dialects import openai_chat
from nemo_polar.proxy.normalized import RouteMatch
from nemo_polar.proxy.record_json import record_bytes
from nemo_polar.proxy.store import DB_NAME, PAYLOADS_NAME, RecordStore, read_records
from nemo_polar.types import CompletionRecord

# the result tables' columns after the first (what the rows are of)
COLUMNS = (
    "writes",
    "store",
    "delta recs",
    "MB/session",
    "KB/call",
    "commit us",
    "loop us",
    "list us",
    "get us",
    "ids us",
)
MIN_TAIL = 32  # new prompt ids a call adds at least besides the last answer (the tool result and the template)
CHARS_PER_TOKEN = 4  # text per token (as `peers.mix_bodies` sizes its prompts)
WORDS = "the parser reads each line of the input file and the failing test expects an empty list here ".split()


def _text(rng: random.Random, tokens: int) -> str:
    """About `tokens` tokens of text."""
    out: list[str] = []
    size = 0
    while size < tokens * CHARS_PER_TOKEN:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def session_records(
    session: int, calls: int, start: int, end: int, answer: int, stream: bool, seed: int = 0
) -> list[CompletionRecord]:
    """One session's records, in call order (module docstring)."""
    rng = random.Random(seed * 1_000_003 + session)
    template = mix_bodies("bench-model", [(start, answer, stream)])[0]
    messages = template["messages"]
    prompt = [rng.randrange(151_000) for _ in range(start)]
    out: list[CompletionRecord] = []
    for i in range(calls):
        if i:  # the previous turn: its answer and tool call, then the tool's result
            prev = out[-1]
            target = start + round((end - start) * i / max(1, calls - 1))
            tail = max(MIN_TAIL, target - len(prompt) - answer)
            messages.append(
                {"role": "assistant", "content": prev.response["content"], "tool_calls": prev.response["tool_calls"]}
            )
            call_id = prev.response["tool_calls"][0]["id"]
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _text(rng, tail)})
            prompt = prompt + list(prev.generation_token_ids) + [rng.randrange(151_000) for _ in range(tail)]
        body = orjson.loads(orjson.dumps(template))  # a fresh object per call: nothing shared between calls
        request = openai_chat.parse_request(body, RouteMatch("chat_completions")).normalized_dict()
        tool_call = {
            "id": f"call_{session}_{i}",
            "type": "function",
            "function": {
                "name": "run_shell_command",
                "arguments": orjson.dumps({"path": "/repo", "content": f"pytest -q tests/test_{i}.py"}).decode(),
            },
        }
        response = {"content": _text(rng, answer), "reasoning": None, "tool_calls": [tool_call]}
        rid = f"{seed:04x}{session:04x}{i:024x}"
        sid = f"sess-{seed}-{session}"
        out.append(bench_record(rid, sid, i, body, request, response, "tool_calls", list(prompt), answer, rng))
    return out


def interleave(sessions: Sequence[Sequence[CompletionRecord]]) -> list[CompletionRecord]:
    """The sessions' records in the order concurrent sessions reach the store: every session's call 0, then call 1..."""
    return [s[i] for i in range(max(map(len, sessions), default=0)) for s in sessions if i < len(s)]


class Mismatch(Exception):
    """A record read back that differs from the one committed (or is missing)."""


@dataclass(slots=True)
class Result:
    """One store's run of one case: bytes on disk, and CPU seconds per record."""

    disk_bytes: int
    delta_records: int
    commit_s: float  # whole process
    loop_s: float  # the event-loop thread
    list_s: float
    get_s: float
    ids_s: float


def commit_case(
    directory: Path, recs: list[CompletionRecord], batch: int, stream: bool, deltas: bool
) -> tuple[float, float, int]:
    """(whole-process, event-loop) CPU seconds per record for committing `recs` in order, `batch` at a time, through a
    `RecordStore(session_deltas=deltas)` in `directory` (opening and `close()` included in the first), and its
    `delta_records`."""

    async def main() -> float:
        t0 = time.thread_time()
        for i in range(0, len(recs), batch):
            chunk = recs[i : i + batch]
            if batch == 1:  # as a handler awaits it: no gather
                if stream:
                    await store.put_pending(admitted(chunk[0]))
                await store.commit(chunk[0])
                continue
            if stream:
                await asyncio.gather(*(store.put_pending(admitted(r)) for r in chunk))
            await asyncio.gather(*(store.commit(r) for r in chunk))
        return time.thread_time() - t0

    c0 = cpu_s()
    store = RecordStore(directory, session_deltas=deltas).open()
    loop_s = asyncio.run(main())
    store.close()
    return (cpu_s() - c0) / len(recs), loop_s / len(recs), store.delta_records


def disk_bytes(directory: Path) -> int:
    """The store's bytes on disk: payload file, database and its WAL (when there is one)."""
    names = (PAYLOADS_NAME, DB_NAME, DB_NAME + "-wal")
    return sum((directory / n).stat().st_size for n in names if (directory / n).exists())


def check(path: str, got: Sequence[CompletionRecord | None], want: Sequence[str], expected: dict[str, bytes]) -> None:
    """Raise `Mismatch` unless `got` are the records `want` (ids, in order) as committed (`expected`: their
    `record_bytes`), compared as parsed JSON."""
    if len(got) != len(want):
        raise Mismatch(f"{path}: {len(got)} records read back, {len(want)} committed")
    for rid, rec in zip(want, got, strict=True):
        if rec is None:
            raise Mismatch(f"{path}: record {rid} not found")
        if rec.id != rid:
            raise Mismatch(f"{path}: record {rec.id} read back where {rid} was expected")
        raw = record_bytes(rec)
        if raw == expected[rid]:
            continue
        a, b = orjson.loads(raw), orjson.loads(expected[rid])
        if a != b:
            fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            raise Mismatch(f"{path}: record {rid} differs from the one committed in {', '.join(fields)}")


def read_case(
    directory: Path, sessions: dict[str, list[str]], expected: dict[str, bytes], deltas: bool
) -> tuple[float, float, float]:
    """CPU seconds per record read back by `list_records` (each session), `get_record` (each id) and `read_records`
    (every id, session by session), after checking that each path returns the committed records (`Mismatch`)."""
    ids = [rid for s in sessions.values() for rid in s]
    store = RecordStore(directory, session_deltas=deltas).open()
    try:  # each path checked (untimed) and dropped before the next: one path's records in memory at a time
        c0 = cpu_s()
        listed = {sid: store.list_records(sid, limit=len(want) + 1) for sid, want in sessions.items()}
        list_s = cpu_s() - c0
        for sid, want in sessions.items():
            check(f"list_records({sid!r})", listed[sid], want, expected)
        del listed
        c0 = cpu_s()
        got = [store.get_record(rid) for rid in ids]
        get_s = cpu_s() - c0
        check("get_record", got, ids, expected)
        del got
    finally:
        store.close()
    c0 = cpu_s()
    read = read_records(directory, ids=ids)
    ids_s = cpu_s() - c0
    check("read_records(ids=...)", read, ids, expected)
    n = len(ids)
    return list_s / n, get_s / n, ids_s / n


def run_case(directory: Path, recs: list[CompletionRecord], batch: int, stream: bool, deltas: bool) -> Result:
    """Commit `recs` (in this order) into a new store in `directory`, then read them all back and check them."""
    expected = {r.id: record_bytes(r) for r in recs}
    sessions: dict[str, list[str]] = {}
    for r in sorted(recs, key=lambda r: (r.session_id, r.seq)):
        sessions.setdefault(r.session_id, []).append(r.id)
    commit_s, loop_s, n_deltas = commit_case(directory, recs, batch, stream, deltas)
    size = disk_bytes(directory)
    list_s, get_s, ids_s = read_case(directory, sessions, expected, deltas)
    return Result(size, n_deltas, commit_s, loop_s, list_s, get_s, ids_s)


def best(runs: list[Result]) -> Result:
    """The least CPU of each measure over the runs (the commit columns from the least disturbed run)."""
    commit = min(runs, key=lambda r: r.commit_s)
    return Result(
        max(r.disk_bytes for r in runs),
        max(r.delta_records for r in runs),
        commit.commit_s,
        commit.loop_s,
        min(r.list_s for r in runs),
        min(r.get_s for r in runs),
        min(r.ids_s for r in runs),
    )


def both(where: Path, recs: list[CompletionRecord], batch: int, stream: bool, repeat: int) -> tuple[Result, Result]:
    """`run_case` with whole records and with deltas, `repeat` times each, the order alternated; the best of each."""
    runs: dict[bool, list[Result]] = {False: [], True: []}
    for rep in range(repeat):
        for deltas in (False, True) if rep % 2 == 0 else (True, False):
            case = where.with_name(f"{where.name}-{rep}-{deltas}")
            runs[deltas].append(run_case(case, recs, batch, stream, deltas))
            shutil.rmtree(case)
    return best(runs[False]), best(runs[True])


def rows_for(label: str, writes: str, n_sessions: int, n_calls: int, whole: Result, deltas: Result) -> list[list[Any]]:
    """The two table rows of one case (`deltas` with its ratios to `whole`)."""

    def cells(r: Result, ref: Result | None) -> list[str]:
        def c(get: Any, scale: float, digits: int = 0) -> str:
            s = f"{get(r) * scale:,.{digits}f}"
            return s if ref is None or not get(ref) else f"{s} ({get(r) / get(ref):.2f}x)"

        return [
            str(r.delta_records),
            c(lambda x: x.disk_bytes / n_sessions, 1e-6, 2),
            c(lambda x: x.disk_bytes / n_calls, 1e-3, 1),
            c(lambda x: x.commit_s, 1e6),
            c(lambda x: x.loop_s, 1e6),
            c(lambda x: x.list_s, 1e6),
            c(lambda x: x.get_s, 1e6),
            c(lambda x: x.ids_s, 1e6),
        ]

    return [[label, writes, "whole", *cells(whole, None)], [label, writes, "deltas", *cells(deltas, whole)]]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20 calls, 4 sessions, 2 repeats (unless given)")
    ap.add_argument("--calls", type=int, default=None, help="calls per session (default 50; --quick 20)")
    ap.add_argument("--start", type=int, default=7000, help="the first call's prompt tokens")
    ap.add_argument("--end", type=int, default=30000, help="the last call's prompt tokens (at least; docstring)")
    ap.add_argument("--answer", type=int, default=512, help="tokens per answer")
    ap.add_argument("--sessions", type=int, default=None, help="concurrent sessions (default 8; --quick 4)")
    ap.add_argument("--batch", type=int, default=None, help="commits at a time across them (default: --sessions)")
    ap.add_argument(
        "--repeat", type=int, default=None, help="runs per case, least CPU reported (default 3; --quick 2)"
    )
    ap.add_argument("--dir", type=Path, default=None, help="where the stores go (default: a temporary directory)")
    ap.add_argument(
        "--replay", type=Path, action="append", default=[], metavar="RUN_DIR", help="real sessions: an existing store"
    )
    args = ap.parse_args(argv)
    quick = args.quick
    args.calls = args.calls or (20 if quick else 50)
    args.sessions = args.sessions or (4 if quick else 8)
    args.batch = args.batch or args.sessions
    args.repeat = args.repeat or (2 if quick else 3)
    if min(args.calls, args.sessions, args.batch, args.repeat, args.start, args.answer) < 1 or args.end < args.start:
        ap.error("sizes must be positive and --end at least --start")
    return args


def harness_of(rec: CompletionRecord) -> str:
    """A record's harness, as the rollout service names sessions (`<task>.<harness>.s<i>.a<j>`), else its dialect."""
    parts = rec.session_id.split(".")
    return parts[1] if len(parts) >= 3 else rec.dialect


def replay(args: argparse.Namespace, root: Path) -> None:
    """`--replay`: real sessions from existing stores, whole vs deltas (module docstring)."""
    rows: list[list[Any]] = []
    for run_dir in args.replay:
        by: dict[str, list[CompletionRecord]] = {}
        for r in sorted(read_records(run_dir), key=lambda r: (r.arrived_at or 0.0, r.session_id, r.seq)):
            by.setdefault(harness_of(r), []).append(r)
        for harness, recs in sorted(by.items()):
            n_sessions = len({r.session_id for r in recs})
            whole, deltas = both(root / harness, recs, 1, False, args.repeat)
            label = f"{run_dir.name}: {harness}, {n_sessions} sessions, {len(recs)} calls"
            rows += rows_for(label, "final", n_sessions, len(recs), whole, deltas)
    table(
        f"Real sessions re-committed, whole records vs session deltas (one at a time, in arrival order; least CPU of "
        f"{args.repeat} runs; same run)",
        ["run: harness", *COLUMNS],
        rows,
    )


def synthetic(args: argparse.Namespace, root: Path) -> None:
    """The synthetic sessions, whole vs deltas (module docstring)."""
    rows: list[list[Any]] = []
    shape: list[list[Any]] = []
    for stream in (False, True):
        writes = "pending+final" if stream else "final"
        built = [
            session_records(s, args.calls, args.start, args.end, args.answer, stream) for s in range(args.sessions)
        ]
        one = built[0]
        sizes = [len(record_bytes(r)) for r in one]
        shape.append(
            [
                writes,
                args.calls,
                f"{len(one[0].prompt_token_ids):,} → {len(one[-1].prompt_token_ids):,}",
                f"{sizes[0] / 1e3:,.0f} → {sizes[-1] / 1e3:,.0f}",
                f"{sum(sizes) / 1e6:,.2f}",
            ]
        )
        cases = [
            (f"{args.sessions} sessions, batch {args.batch}", interleave(built), args.batch, args.sessions),
            ("1 session, batch 1", one, 1, 1),
        ]
        for label, recs, batch, n_sessions in cases:
            whole, deltas = both(root / f"{stream}-{n_sessions}", recs, batch, stream, args.repeat)
            rows += rows_for(label, writes, n_sessions, len(recs), whole, deltas)
            for row in rows[-2:]:
                print(" | ".join(map(str, row)), file=sys.stderr, flush=True)
        del built, cases
    table(
        "The synthetic agent session (one session; records as the proxy builds them)",
        ["writes", "calls", "prompt tokens", "whole record KB", "record_bytes per session, MB"],
        shape,
    )
    table(
        f"Record store per session, whole records vs session deltas ({args.calls} calls a session; least CPU of "
        f"{args.repeat} runs; same run)",
        ["sessions", *COLUMNS],
        rows,
    )
    note(
        "MB/session, KB/call: bytes on disk after close() (payload file + database + WAL); commit: CPU per call "
        "committed, whole process (loop: the event-loop thread's share); list / get / ids: CPU per record read back "
        "by list_records, get_record, read_records(ids=...). Every record read back by all three paths was checked "
        "against the committed one. deltas rows: (deltas/whole)."
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="session_store_", dir=args.dir))
    try:
        (replay if args.replay else synthetic)(args, root)
    except Mismatch as exc:
        print(f"session_store.py: a record read back differs from the one committed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
