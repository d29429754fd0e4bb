# SPDX-License-Identifier: Apache-2.0
"""CPU per committed record of the proxy's record store (issue 23: long streams), side by side in one run.

Records are built the way the proxy builds them: the 1k- and 8k-token chat requests of `peers.py`'s long-stream mix
as `original_request`, their OpenAI-Chat parse as the normalised `request`, fake prompt ids / generation ids /
logprobs of the right lengths, an answer text of the answer's length and an `upstream` block; every record in its
own session (`sess-{seed}-{i}`): records of one session with the same request would be written as session deltas
against each other (`proxy/deltas.py`), and these columns measure independent records (`session_store.py` measures
sessions). Each case commits `n` distinct records through `RecordStore` on an asyncio loop, `batch` at a time (batch
1 = concurrency 1: every write its own transaction; 16 / 64 = that many replies finishing in the same loop
iteration), either final only (a non-streamed reply) or pending placeholder then final (a stream). The CPU is the
whole process's (`getrusage(RUSAGE_SELF)`: the event loop, the background checkpointer thread and the final
checkpoint of `close()`), per committed record; `loop` is the event-loop thread's share (what delays replies),
`ckpt` the rest.

Columns, measured in the same run:
  store     the store as shipped, on a new database
  old db    the same code on a database created with 8 KiB pages (as stores were made before they used 16 KiB
            pages, and then 4 KiB once large records' JSON moved to the payload file; same schema): the page size's
            effect, in the same run
  replace   (streams) the final record written as before in-place updates: INSERT OR REPLACE of the placeholder's
            row, which deletes the row and its two index entries and inserts them again
  floor     plain SQLite, the store's page size and connection settings: one `INSERT` of the same bytes per write
            into a one-B-tree table, one transaction per batch, no checkpoint (the WAL grows): what any durable
            SQLite record with its JSON in the row costs (the store writes large ones to its payload file instead)
  zlib crc  the store with zlib.crc32 as the payload frames' checksum instead of `_arrays.crc32` (the same value,
            folded with carry-less multiplication where the CPU has it): the checksum's share, in the same run
  kept mem  the store in a forked process that first calls `keep_freed_memory` (`proxy/tuning.py`, as `polar proxy`,
            `polar serve` and the other serving processes do), against the store in a forked process with glibc's
            defaults (`forked`), in the same run: what page-faulting on freed-and-reallocated buffers costs
  bytes     `record_bytes` alone (serialising the record, and its placeholder for a stream; part of `loop`)

    .venv/bin/python benchmarks/store_cost.py [--quick] [--repeat N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import sqlite3
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (the repository root)
from _tables import note, table
from peers import mix_bodies

from nemo_polar.proxy import payloads as payload_file
from nemo_polar.proxy.dialects import openai_chat
from nemo_polar.proxy.normalized import RouteMatch
from nemo_polar.proxy.record_json import record_bytes
from nemo_polar.proxy.store import DB_NAME, PAGE_SIZE, RecordStore
from nemo_polar.proxy.tuning import keep_freed_memory
from nemo_polar.types import CompletionRecord

# the mix's two prompt sizes, and the top of a harness session's range (prompts grow to ~30k tokens)
KINDS = {
    "1k prompt, 64 answer": (1000, 64),
    "8k prompt, 512 answer": (8000, 512),
    "30k prompt, 512 answer": (30000, 512),
}
BATCHES = (1, 16, 64)

# a store as created with 8 KiB pages (the schema is unchanged)
OLD_SCHEMA = """
PRAGMA page_size=8192;
PRAGMA journal_mode=WAL;
CREATE TABLE records (
    id TEXT PRIMARY KEY, session_id TEXT NOT NULL, seq INTEGER NOT NULL, state TEXT NOT NULL,
    failed INTEGER NOT NULL, data BLOB NOT NULL
);
CREATE INDEX records_by_session ON records (session_id, seq);
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY, api_key TEXT NOT NULL UNIQUE, created_at REAL NOT NULL, data BLOB NOT NULL
);
"""


def cpu_s() -> float:
    """Whole-process CPU seconds (every thread)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def bench_record(
    rid: str,
    session_id: str,
    seq: int,
    body: dict[str, Any],
    request: dict[str, Any],
    response: dict[str, Any],
    finish: str,
    prompt_ids: list[int],
    answer_tokens: int,
    rng: random.Random,
) -> CompletionRecord:
    """One record as `recording.open_record` + `completed` fill it: `body` the caller's request, `request` its
    normalised form (the sampling added here), random generation ids and logprobs, an `upstream` block."""
    now = time.time()
    return CompletionRecord(
        id=rid,
        session_id=session_id,
        seq=seq,
        dialect="openai_chat",
        arrived_at=now,
        first_byte_at=now + 0.01,
        finished_at=now + 0.2,
        original_request=body,
        request={**request, "sampling": {"temperature": 0.0, "max_tokens": answer_tokens}},
        response=response,
        finish_reason=finish,
        prompt_token_ids=prompt_ids,
        generation_token_ids=[rng.randrange(151_000) for _ in range(answer_tokens)],
        generation_log_probs=[-rng.random() * 3 for _ in range(answer_tokens)],
        requested_model="bench-model",
        served_model="bench-model",
        policy_version=0,
        upstream={
            "endpoint": "http://127.0.0.1:8000",
            "sent_at": now,
            "first_byte_at": now + 0.01,
            "finished_at": now + 0.2,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": answer_tokens},
        },
    )


def make_records(prompt_tokens: int, answer_tokens: int, n: int, seed: int = 0) -> list[CompletionRecord]:
    """`n` records of one size, as `recording.open_record` + `completed` fill them, each in its own session."""
    rng = random.Random(seed)
    body = mix_bodies("bench-model", [(prompt_tokens, answer_tokens, True)])[0]
    request = openai_chat.parse_request(body, RouteMatch("chat_completions")).normalized_dict()
    response = {"content": "word " * answer_tokens, "reasoning": None, "tool_calls": []}
    return [
        bench_record(
            f"{seed:08x}{i:024x}",
            f"sess-{seed}-{i}",
            i,
            body,
            request,
            response,
            "stop",
            [rng.randrange(151_000) for _ in range(prompt_tokens)],
            answer_tokens,
            rng,
        )
        for i in range(n)
    ]


def admitted(rec: CompletionRecord) -> CompletionRecord:
    """The record as it stands when a stream's placeholder is written: before generation (no answer, no ids)."""
    return CompletionRecord(
        id=rec.id,
        session_id=rec.session_id,
        seq=rec.seq,
        dialect=rec.dialect,
        arrived_at=rec.arrived_at,
        original_request=rec.original_request,
        request=rec.request,
        requested_model=rec.requested_model,
        served_model=rec.served_model,
        policy_version=rec.policy_version,
    )


class ReplacingStore(RecordStore):
    """The store as it was before in-place updates: a stream's final record replaces its placeholder's row (INSERT
    OR REPLACE: the row and its index entries deleted and inserted again)."""

    async def commit(self, record: CompletionRecord) -> None:
        self._pending_ids.discard(record.id)
        await super().commit(record)


def store_case(
    directory: Path,
    recs: list[CompletionRecord],
    batch: int,
    stream: bool,
    store_type: type[RecordStore] = RecordStore,
) -> tuple[float, float]:
    """(whole-process, event-loop) CPU seconds per record for committing `recs` through a `RecordStore` in
    `directory`; the whole process's includes opening the store and the final checkpoint of `close()`."""

    async def main() -> float:
        t0 = time.thread_time()
        if batch == 1:  # as a handler awaits it: no gather
            for r in recs:
                if stream:
                    await store.put_pending(admitted(r))
                await store.commit(r)
        for i in range(0, len(recs) if batch > 1 else 0, batch):
            chunk = recs[i : i + batch]
            if stream:
                await asyncio.gather(*(store.put_pending(admitted(r)) for r in chunk))
            await asyncio.gather(*(store.commit(r) for r in chunk))
        return time.thread_time() - t0

    c0 = cpu_s()
    store = store_type(directory).open()
    loop_s = asyncio.run(main())
    store.close()
    return (cpu_s() - c0) / len(recs), loop_s / len(recs)


def zlib_crc_case(directory: Path, recs: list[CompletionRecord], batch: int, stream: bool) -> tuple[float, float]:
    """`store_case` with zlib.crc32 as the payload frames' checksum (the value is the same)."""
    fast, payload_file._crc32 = payload_file._crc32, zlib.crc32
    try:
        return store_case(directory, recs, batch, stream)
    finally:
        payload_file._crc32 = fast


def forked_case(
    directory: Path, recs: list[CompletionRecord], batch: int, stream: bool, *, keep_memory: bool
) -> tuple[float, float]:
    """`store_case` in a forked child (the allocator setting is process-wide and cannot be undone), with
    `keep_freed_memory` first when `keep_memory`. Before it is measured the child serialises every record once (the
    copy-on-write faults of touching the parent's records) and commits two batches to a scratch store (the heap at
    its working size, as in a running proxy), in both variants."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report on the pipe, leave without running the parent's cleanup
        status = 1
        try:
            os.close(read_end)
            if keep_memory and not keep_freed_memory():
                raise RuntimeError("keep_freed_memory() changed nothing here (not glibc?)")
            for r in recs:
                record_bytes(r)
            store_case(directory / "warm", recs[: 2 * batch], batch, stream)  # the heap at its working size
            os.write(write_end, json.dumps(store_case(directory / "measured", recs, batch, stream)).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not out:
        raise RuntimeError(f"the forked store case failed (wait status {status})")
    total, loop = json.loads(out)
    return total, loop


def floor_case(directory: Path, payloads: list[tuple[bytes, ...]], batch: int) -> float:
    """Whole-process CPU seconds per write of plain SQLite inserts of the same bytes (`payloads`: one tuple of blobs
    per record, written in order)."""
    directory.mkdir(parents=True, exist_ok=True)
    c0 = cpu_s()
    conn = sqlite3.connect(directory / DB_NAME, isolation_level=None)
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (data BLOB NOT NULL)")
    for i in range(0, len(payloads), batch):
        for blobs in zip(*payloads[i : i + batch], strict=True):  # pending blobs, then final ones
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO t (data) VALUES (?)", [(b,) for b in blobs])
            conn.execute("COMMIT")
    conn.close()
    return (cpu_s() - c0) / len(payloads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer records per case")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (the least CPU is reported)")
    ap.add_argument("--dir", type=Path, default=None, help="where the databases go (default: a temporary directory)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="store_cost_", dir=args.dir))
    rows: list[list[Any]] = []
    try:
        for kind, (prompt_tokens, answer_tokens) in KINDS.items():
            n = (128 if args.quick else 512) * (4 if prompt_tokens < 4000 else 1 if prompt_tokens < 16000 else 0.25)
            n = int(n)
            recs = make_records(prompt_tokens, answer_tokens, n)
            finals = [record_bytes(r) for r in recs]
            pendings = [record_bytes(admitted(r), pending=True) for r in recs]
            t0 = time.thread_time()  # a second pass: warm, as in a running proxy
            for r in recs:
                record_bytes(r)
            final_bytes_s = (time.thread_time() - t0) / n
            t0 = time.thread_time()
            for r in recs:
                record_bytes(admitted(r), pending=True)
            pending_bytes_s = (time.thread_time() - t0) / n
            size_kb = sum(map(len, finals)) / n / 1024
            for stream in (False, True):
                payloads = (
                    [(p, f) for p, f in zip(pendings, finals, strict=True)] if stream else [(f,) for f in finals]
                )
                for batch in BATCHES:
                    runs: dict[str, list[tuple[float, float]]] = {
                        "store": [],
                        "old": [],
                        "replace": [],
                        "zlib": [],
                        "forked": [],
                        "kept": [],
                        "floor": [],
                    }
                    for rep in range(args.repeat):  # interleaved; the least CPU of each (the least disturbed)
                        case = root / f"{prompt_tokens}-{stream}-{batch}-{rep}"
                        runs["store"].append(store_case(case / "store", recs, batch, stream))
                        old = case / "old"
                        old.mkdir(parents=True)
                        sqlite3.connect(old / DB_NAME).executescript(OLD_SCHEMA).close()
                        runs["old"].append(store_case(old, recs, batch, stream))
                        if stream:
                            runs["replace"].append(store_case(case / "replace", recs, batch, stream, ReplacingStore))
                        runs["zlib"].append(zlib_crc_case(case / "zlib", recs, batch, stream))
                        runs["forked"].append(forked_case(case / "forked", recs, batch, stream, keep_memory=False))
                        runs["kept"].append(forked_case(case / "kept", recs, batch, stream, keep_memory=True))
                        runs["floor"].append((floor_case(case / "floor", payloads, batch), 0.0))
                        shutil.rmtree(case)
                    total, loop = min(runs["store"])
                    old_total, floor = min(runs["old"])[0], min(runs["floor"])[0]
                    zlib_total = min(runs["zlib"])[0]
                    forked, kept = min(runs["forked"])[0], min(runs["kept"])[0]
                    replace = (
                        f"{min(runs['replace'])[0] * 1e6:.0f} ({min(runs['replace'])[0] / total:.2f}x)"
                        if stream
                        else "–"
                    )
                    rows.append(
                        [
                            kind,
                            f"{size_kb:.0f} KB",
                            "pending+final" if stream else "final",
                            batch,
                            f"{total * 1e6:.0f}",
                            f"{loop * 1e6:.0f}",
                            f"{(total - loop) * 1e6:.0f}",
                            f"{old_total * 1e6:.0f} ({old_total / total:.2f}x)",
                            replace,
                            f"{zlib_total * 1e6:.0f} ({zlib_total / total:.2f}x)",
                            f"{kept * 1e6:.0f} / {forked * 1e6:.0f} ({kept / forked:.2f}x)",
                            f"{floor * 1e6:.0f} ({total / floor:.2f}x)",
                            f"{(final_bytes_s + (pending_bytes_s if stream else 0)) * 1e6:.0f}",
                        ]
                    )
                    print(" | ".join(map(str, rows[-1])), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table(
        "Record store CPU per committed record (us; whole process incl. checkpoints; same run)",
        [
            "record",
            "final size",
            "writes",
            "batch",
            "store",
            "loop",
            "ckpt",
            "old db (old/store)",
            "replace (replace/store)",
            "zlib crc (zlib/store)",
            "kept mem / forked (kept/forked)",
            "floor (store/floor)",
            "bytes",
        ],
        rows,
    )
    note(
        "loop: the event-loop thread while committing (serialising, SQL); ckpt: the rest (the checkpointer thread, "
        "opening and closing the store with its last checkpoint); zlib crc: the store checksumming its payload frames "
        "with zlib.crc32; kept mem / forked: the store in a forked process with and without keep_freed_memory(); "
        "floor: plain INSERTs of the same bytes, no checkpoint; bytes: record_bytes (pending+final: "
        "both)."
    )


if __name__ == "__main__":
    main()
