# SPDX-License-Identifier: Apache-2.0
"""Session deltas in the record store (`proxy/deltas.py`): a record whose prompt extends its session's key is
written as what is new, and every read path gives back the whole record that was committed."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import struct
from pathlib import Path

import orjson
import pytest

from nemo_polar.proxy import deltas
from nemo_polar.proxy.deltas import RAW_IDS_MIN, parts_size, stored_json, stored_parts
from nemo_polar.proxy.payloads import PayloadFile, StoreCorrupt
from nemo_polar.proxy.record_json import _i32
from nemo_polar.proxy.store import DB_NAME, PAYLOADS_NAME, RecordStore, read_records, record_bytes
from nemo_polar.types import CompletionRecord, TokenIds


def session(
    sid: str, calls: int, *, start: int = 3000, grow: int = 150, packed: bool = False
) -> list[CompletionRecord]:
    """An agent session as the proxy records it: every call's messages and prompt ids extend the previous call's,
    each request a fresh object (as parsed from its own body)."""
    rng = random.Random(sid)
    ids = [rng.randrange(150_000) for _ in range(start)]
    msgs: list[dict] = [{"role": "system", "content": "You are an agent. " * 40}, {"role": "user", "content": "fix"}]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "n": 1}}}]
    out = []
    for i in range(calls):
        body = orjson.loads(orjson.dumps({"model": "m", "messages": msgs, "tools": tools, "stream": True}))
        gen = [rng.randrange(150_000) for _ in range(32)]
        prompt = TokenIds(struct.pack(f"<{len(ids)}i", *ids)) if packed else list(ids)
        out.append(
            CompletionRecord(
                id=f"{sid}-{i}",
                session_id=sid,
                seq=i,
                dialect="openai_chat",
                original_request=body,
                request={**orjson.loads(orjson.dumps({"messages": msgs, "tools": tools})), "sampling": {"n": i}},
                response={"content": f"answer {i}"},
                prompt_token_ids=prompt,
                generation_token_ids=gen,
                generation_log_probs=[-0.25] * len(gen),
            )
        )
        msgs = [*msgs, {"role": "assistant", "content": f"step {i}"}, {"role": "tool", "content": "out " * grow}]
        ids = ids + gen + [rng.randrange(150_000) for _ in range(grow)]
    return out


def commit_all(store: RecordStore, recs: list[CompletionRecord], *, stream: bool) -> None:
    async def main() -> None:
        for r in recs:
            if stream:
                await store.put_pending(r)
            await store.commit(r)

    asyncio.run(main())
    store.write_rows()  # rows follow the frames (store docstring): `stored` reads the rows


def stored(directory: Path) -> dict[str, bytes]:
    """Every row's stored JSON as written (deltas unresolved)."""
    conn = sqlite3.connect(directory / DB_NAME)
    rows = conn.execute("SELECT id, data FROM records").fetchall()
    conn.close()
    payloads = PayloadFile(directory / PAYLOADS_NAME, writable=False)
    try:
        return {rid: payloads.resolve(rid, data) for rid, data in rows}
    finally:
        payloads.close()


def base_of(raw: bytes) -> str | None:
    """The record a stored row is a session delta of (None: written without one)."""
    return orjson.loads(raw).get("_delta", {}).get("base") if deltas.is_delta(raw) else None


def as_json(rec: CompletionRecord) -> dict:
    return orjson.loads(record_bytes(rec))


def check_reads(store: RecordStore, directory: Path, recs: list[CompletionRecord]) -> None:
    want = {r.id: as_json(r) for r in recs}
    sessions = sorted({r.session_id for r in recs})
    got = [r for s in sessions for r in store.list_records(s, limit=10_000)]
    got += [store.get_record(r.id) for r in reversed(recs)]  # type: ignore[misc]
    raw = [CompletionRecord.from_json(x) for s in sessions for x in store.list_records_raw(s, limit=10_000)]
    for r in got + raw + read_records(directory) + read_records(directory, ids=[r.id for r in reversed(recs)]):
        assert as_json(r) == want[r.id], r.id
    assert len(got) == 2 * len(recs)


@pytest.mark.parametrize("stream", [False, True], ids=["final", "stream"])
@pytest.mark.parametrize("packed", [False, True], ids=["list-ids", "packed-ids"])
def test_growing_sessions_are_written_as_deltas_and_read_back_whole(tmp_path, stream, packed):
    recs = [r for pair in zip(session("a", 12, packed=packed), session("b", 12), strict=True) for r in pair]
    store = RecordStore(tmp_path / "d").open()
    commit_all(store, recs, stream=stream)
    check_reads(store, tmp_path / "d", recs)
    rows = stored(tmp_path / "d")
    as_deltas = {rid for rid, raw in rows.items() if base_of(raw) is not None}
    assert store.delta_records >= len(as_deltas) > len(recs) // 2
    for rid in as_deltas:  # a delta refers to a record written whole, of its own session, committed before it
        base = base_of(rows[rid])
        assert base is not None and base_of(rows[base]) is None
        assert base.split("-")[0] == rid.split("-")[0] and int(base.split("-")[1]) < int(rid.split("-")[1])
    store.close()
    check_reads(RecordStore(tmp_path / "d").open(), tmp_path / "d", recs)

    whole = RecordStore(tmp_path / "w", session_deltas=False).open()
    commit_all(whole, recs, stream=stream)
    assert whole.delta_records == 0 and not any(base_of(x) for x in stored(tmp_path / "w").values())
    whole.close()
    size = {k: sum(p.stat().st_size for p in (tmp_path / k).iterdir()) for k in ("d", "w")}
    assert size["d"] < 0.6 * size["w"], size


@pytest.mark.parametrize("compare", ["C", "orjson"])
def test_a_list_is_cut_only_where_its_json_is_the_same(tmp_path, monkeypatch, compare):
    """`==` holds 1 == 1.0 == True; the store compares JSON, so a later record keeps its own `true` (with the C
    module's `same_json` and with the `orjson` bytes used without it)."""
    if compare == "orjson":
        monkeypatch.setattr(deltas, "_same_json", deltas._same_json_bytes)
    elif deltas._same_json is deltas._same_json_bytes:
        pytest.skip("nemo_polar._arrays is not built here (no C compiler at install)")
    recs = session("s", 3)
    recs[1].original_request["messages"][0]["flag"] = True
    recs[0].original_request["messages"][0]["flag"] = 1
    recs[2].original_request["messages"][0]["flag"] = 1
    store = RecordStore(tmp_path).open()
    commit_all(store, recs, stream=False)
    check_reads(store, tmp_path, recs)
    rows = stored(tmp_path)
    assert "messages" not in orjson.loads(rows["s-1"])["_delta"]["lists"].get("original_request", {})
    assert orjson.loads(rows["s-2"])["_delta"]["lists"]["original_request"]["messages"] == 2
    assert store.get_record("s-1").original_request["messages"][0]["flag"] is True  # type: ignore[union-attr]
    store.close()


def test_a_session_that_leaves_its_key_gets_a_new_one(tmp_path):
    """A compacted context (the prompt no longer extends the key's) and a prompt grown far past its key are written
    whole and become the next key; the same record committed twice is written whole."""
    recs = session("s", 4) + session("t", 4, start=2500)
    for r in recs[4:]:  # the same session, another chain: not an extension of s-3's prompt
        r.session_id = "s"
        r.seq += 4
    big = session("u", 2, start=2100, grow=1800)  # the second prompt has 87 % more ids than the first
    store = RecordStore(tmp_path).open()
    commit_all(store, recs + big + [big[1]], stream=False)
    rows = stored(tmp_path)
    assert base_of(rows["t-0"]) is None and base_of(rows["t-1"]) == "t-0"
    assert base_of(rows["u-1"]) is None
    check_reads(store, tmp_path, recs + big)
    store.close()


def test_a_failed_batch_takes_its_key_with_it(tmp_path, monkeypatch):
    recs = session("s", 3)
    store = RecordStore(tmp_path).open()
    original = store._payloads.append
    monkeypatch.setattr(
        store._payloads, "append", lambda frames, metas=None: (_ for _ in ()).throw(OSError(28, "disk full"))
    )
    with pytest.raises(OSError):
        commit_all(store, recs[:1], stream=False)
    key_op = store._record_op(recs[1], "done")
    assert key_op[9] is None  # the lost key was forgotten: the next record is a key, written whole
    monkeypatch.setattr(store._payloads, "append", original)
    delta_op = store._record_op(recs[2], "done")
    assert delta_op[9] == recs[1].id
    store._lost.add(recs[1].id)  # as if the key's batch had failed after the delta was serialised
    store._write_batch(store._inline_conn, [(delta_op, None, asyncio.Future(loop=asyncio.new_event_loop()))])
    store.write_rows()
    assert base_of(stored(tmp_path)[recs[2].id]) is None
    assert as_json(store.get_record(recs[2].id)) == as_json(recs[2])  # type: ignore[arg-type]
    store.close()


def test_a_delta_without_its_base_is_store_corrupt_naming_it(tmp_path):
    recs = session("s", 3)
    store = RecordStore(tmp_path).open()
    commit_all(store, recs, stream=False)
    store.close()
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("DELETE FROM records WHERE id = 's-0'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreCorrupt, match=r"s-1.*base record s-0 is missing"):
        read_records(tmp_path)


def test_an_interrupted_delta_placeholder_is_recovered_whole(tmp_path):
    recs = session("s", 3)
    store = RecordStore(tmp_path).open()
    commit_all(store, recs[:2], stream=True)

    async def admit() -> None:
        await store.put_pending(recs[2])

    asyncio.run(admit())
    store.write_rows()
    assert base_of(stored(tmp_path)["s-2"]) == "s-0"  # the key its session used last
    store.close()  # the final record never came: a killed proxy's pending row
    again = RecordStore(tmp_path).open()
    rec = again.get_record("s-2")
    assert rec is not None and rec.error is not None and rec.error["type"] == "interrupted"
    assert rec.original_request == recs[2].original_request
    again.close()


def test_keys_are_bounded_by_bytes_and_kept_per_chain(tmp_path):
    store = RecordStore(tmp_path).open()
    assert store._deltas is not None
    # a main chain with a side chain interleaved (a harness's title call): each extends its own key
    main, side = session("m", 6, start=4000, grow=40), session("x", 6, start=3000, grow=40)
    for r in side:
        r.session_id, r.seq = "m", r.seq + 100
    commit_all(store, [r for pair in zip(main, side, strict=True) for r in pair], stream=False)
    assert store.delta_records == 10 and len(store._deltas) == 2  # both chains: 1 whole + 5 deltas each
    held = store._deltas.held
    assert held > 0
    store._deltas.max_bytes = held  # no room for another session's key: the least recently used session goes
    recs = session("n", 3, start=4000)
    commit_all(store, recs, stream=False)
    assert len(store._deltas) == 1 and store._deltas.held <= held
    check_reads(store, tmp_path, main + side + recs)
    store.session_ended("n")  # a closed session's keys are let go
    assert len(store._deltas) == 0 and store._deltas.held == 0
    store.close()


@pytest.mark.parametrize("on", [True, False])
def test_the_switch_reaches_the_store_from_every_entry_point(tmp_path, on):
    """`polar proxy --no-session-deltas`, `polar serve`/`collect --no-session-deltas` and the Gym config's
    `session_deltas` all end in the proxy's `ProxyConfig.session_deltas`, which the store obeys."""
    from nemo_polar.proxy.app import Proxy
    from nemo_polar.rollout.stack import StackConfig

    cfg = StackConfig(work_dir=str(tmp_path), upstreams=["http://127.0.0.1:9"], session_deltas=on)
    proxy = Proxy(cfg.proxy_config(str(tmp_path / "store")))
    assert proxy.config.session_deltas is on and (proxy.store._deltas is not None) is on


@pytest.mark.parametrize("kept", [0, 1, 2, 3, 4, 5, 6, 7, 299, 300])
def test_ids_are_put_back_together_for_any_number_kept(kept):
    """The store cuts ids after a multiple of 3 (whole base64 groups, joined as text); any other count, which it
    does not write, is joined through the bytes."""
    from collections import OrderedDict

    from nemo_polar.types import decode_array, encode_array

    ids = list(range(1000, 1300))
    base = {"id": "b", "prompt_token_ids": encode_array(ids, "i32")}
    tail = [7, 8, 9, 10][: 1 + kept % 4]
    raw = orjson.dumps(
        {"_delta": {"base": "b", "ids": kept, "lists": {}}, "id": "d", "prompt_token_ids": encode_array(tail, "i32")}
    )
    got = deltas.resolve(raw, {"b": orjson.dumps(base)}.get, OrderedDict())
    assert decode_array(got["prompt_token_ids"]) == ids[:kept] + tail and got["id"] == "d" and "_delta" not in got
    with pytest.raises(deltas.DeltaError, match="keeps 301"):
        deltas.resolve(raw.replace(b'"ids":%d' % kept, b'"ids":301'), {"b": orjson.dumps(base)}.get, OrderedDict())


@pytest.mark.parametrize("on", [True, False], ids=["session-deltas", "whole"])
def test_a_request_list_that_is_the_callers_is_written_once(tmp_path, on):
    """An OpenAI Chat call's normalised `messages` and `tools` are the caller's: written once, in `original_request`,
    with `null` in their place and the header naming them; read back as their own objects, in their place. A list
    that differs (a key's `tools` here, a delta's `messages` there, a `true` for a `1`) is written as it is."""
    recs = session("s", 5)
    recs[0].request["tools"] = [{"type": "function", "function": {"name": "other"}}]  # the key: messages only
    recs[3].request["messages"][0] = {**recs[3].request["messages"][0], "flag": True}
    recs[3].original_request["messages"][0] = {**recs[3].original_request["messages"][0], "flag": 1}
    store = RecordStore(tmp_path, session_deltas=on).open()
    commit_all(store, recs, stream=True)
    rows = {rid: orjson.loads(raw) for rid, raw in stored(tmp_path).items()}
    want = {"s-0": ["messages"], "s-1": ["messages", "tools"], "s-3": ["tools"]}
    for rec in recs:
        row = rows[rec.id]
        same = want.get(rec.id, ["messages", "tools"])
        assert row["_delta"]["same"] == same and all(row["request"][n] is None for n in same), rec.id
        assert list(row["request"]) == list(rec.request)  # every member in its place
        assert (base_of(stored(tmp_path)[rec.id]) is not None) is (on and rec.seq > 0)
    check_reads(store, tmp_path, recs)
    for rec in recs:
        got = store.get_record(rec.id)
        assert got is not None and list(got.request) == list(rec.request)
        assert got.request["messages"] is not got.original_request["messages"]
    full = len(record_bytes(recs[1]))
    assert len(stored(tmp_path)["s-1"]) < full - len(orjson.dumps(recs[1].request["messages"]))
    store.close()


def test_nothing_else_is_shared_within_a_record(tmp_path):
    """Only a non-empty list, under the same name, with the same JSON: a Responses call's `input` against the
    normalised `messages`, an equal string and an empty list are written as they are."""
    rec = session("s", 1)[0]
    rec.original_request = {"input": rec.request["messages"], "instructions": "x", "tools": [], "m": [1]}
    rec.request = {"messages": rec.request["messages"], "instructions": "x", "tools": [], "m": [1.0]}
    store = RecordStore(tmp_path).open()
    commit_all(store, [rec], stream=False)
    assert not deltas.is_delta(stored(tmp_path)["s-0"])
    check_reads(store, tmp_path, [rec])
    store.close()


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda row: row["request"].__setitem__("messages", []), "shared with original_request but holds"),
        (lambda row: row["original_request"].pop("tools"), "KeyError"),
    ],
    ids=["value-in-place", "original-missing"],
)
def test_a_shared_list_that_cannot_be_put_back_is_store_corrupt(tmp_path, edit, match):
    rec = session("s", 1)[0]
    store = RecordStore(tmp_path, session_deltas=False).open()
    commit_all(store, [rec], stream=False)
    store.close()
    row = orjson.loads(stored(tmp_path)["s-0"])
    edit(row)
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("UPDATE records SET data = ? WHERE id = 's-0'", (orjson.dumps(row),))
    conn.commit()
    conn.close()
    with pytest.raises(StoreCorrupt, match=rf"s-0.*{match}"):
        read_records(tmp_path)


@pytest.mark.parametrize("n_ids", [0, 3, RAW_IDS_MIN // 16 * 3 - 3, RAW_IDS_MIN // 16 * 3, 8000])
@pytest.mark.parametrize("where", ["middle", "last", "only"])
@pytest.mark.parametrize("head", [None, {"same": ["messages"]}])
def test_stored_parts_are_the_stored_json_byte_for_byte(n_ids, where, head):
    """The prompt ids' string goes in as its own buffer once it is long; the buffers joined are `stored_json`'s
    bytes, whatever the members around it, with or without a header."""
    ids = _i32(list(range(100_000, 100_000 + n_ids)))
    out: dict = {"id": "r1", "original_request": {"messages": [{"role": "user", "content": 'é "q" \\ \n'}]}}
    if where == "only":
        out = {}
    out["prompt_token_ids"] = ids
    if where == "middle":
        out |= {"generation_log_probs": "b64:f64:AAAA", "error": None, "upstream": {"x": [1.5, True]}}
    parts = stored_parts(out, head)
    assert b"".join(parts) == stored_json(out, head)
    assert (len(parts) > 1) == (len(ids) >= RAW_IDS_MIN)
    assert parts_size(parts) == len(stored_json(out, head))


def test_stored_parts_leave_other_id_forms_to_orjson():
    for ids in ([1, 2, 3] * 2000, "x" * 5000, "b64:f64:" + "A" * 5000):
        out = {"id": "r", "prompt_token_ids": ids}
        assert stored_parts(out, None) == [stored_json(out, None)]
