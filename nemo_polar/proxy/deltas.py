# SPDX-License-Identifier: Apache-2.0
"""Session deltas: a record whose prompt extends an earlier record of its session is stored as what is new.

In an agent session every call's prompt is the previous call's plus the new turn: the same messages and tools with
more appended, the same prompt ids followed by the last answer's and the new turn's. Stored whole, a session of n
calls writes O(n²) bytes: a 50-call session growing from 7k to 30k tokens is ≈ 12.6 MB of records for ≈ 770 new
tokens a call (docs/performance.md, "Session deltas"). With deltas on (`RecordStore(session_deltas=True)`, the
default) the store keeps, per session, up to `KEYS_PER_SESSION` *keys*: records it wrote whole, one per chain (the
main agent's, a sub-agent's, a harness's side calls). A later record whose prompt ids start with a key's is written
as a delta against it:

- `prompt_token_ids` holds only the ids after the key's;
- every top-level list of `original_request` and of `request` (a chat's `messages` and `tools`, a Responses
  call's `input`, Gemini's `contents`) whose first items serialise to exactly the key's list holds only the items
  after them;
- a first member `"_delta": {"base": <the key's id>, "ids": <ids kept>, "lists": {field: {name: <items kept>}}}`
  says what was cut. A record's JSON otherwise starts with `{"id":`, so a reader tells the two apart by their first
  bytes, and the name is the store's own (a caller's data is never at the record's top level).

A delta always refers to a record written whole, never to another delta, so a read takes at most one more record.
A record is written whole, and becomes a key, when its prompt extends none of its session's keys (a new chain, a
compacted context) or has grown past a quarter of its key's ids since (`REKEY`, the key replaced): a 50-call session
then writes ≈ 5 whole records, and its deltas stay a fraction of a whole one. A stream's placeholder (no ids yet) is
cut against the key its session used last, and never becomes a key, nor does a failed call or a record of fewer
than `MIN_KEY_IDS` prompt ids. Lists are compared as JSON (`_arrays.same_json`, or their `orjson` bytes without the
C module), not with `==` (for which `1 == 1.0 == True`), so a reader gets back the JSON that was committed. A key
holds copies of its record's lists (not their items, which nothing changes after the commit: the proxy builds every
request's objects anew) and its ids' stored form up to a multiple of 3 ids: a record's ids are matched, cut and put
back together as base64 text, never decoded, and a prompt that extends no key costs one failed prefix comparison.
The keys hold about `KEYS_MAX_BYTES` at most (256 MiB; least recently used sessions dropped first), and a
closed session's are let go (`RecordStore.session_ended`).

Within one record too (`share_request`, whether or not session deltas are on): a list of the normalised `request`
that is the caller's `original_request`'s under the same name, as JSON (an OpenAI Chat call's `messages` and
`tools`, normalised as they came), is written once: the request keeps the name, in its place, with `null`, and the
header names it, `"_delta": {"same": [<names>]}` (beside the session delta's fields when the record is one; a header
without `base` refers to no other record). Where the messages are shared too (requests already in the normalised
form: text contents, no tool calls in the history) an OpenAI Chat record is ≈ 27 % smaller (an 8k-token prompt's
117.5 → 85.7 KB) and ≈ 10 % cheaper to commit. A history with tool calls carries the proxy's canonical call ids in
the normalised request, so there only `tools` is shared; a dialect whose normalised lists differ (Anthropic,
Responses, Gemini) writes them as before.

Every read path of `nemo_polar.proxy.store` resolves deltas (`resolve`): readers only ever see whole records. A key
lost with a batch that failed to commit is forgotten, and an already serialised delta against it is written whole
(`RecordStore._write_batch`). A store written with deltas needs this version or later to read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from nemo_polar.errors import PolarError
from nemo_polar.proxy.payloads import Buffer
from nemo_polar.types import decode_array, encode_array

__all__ = [
    "BASES_KEPT",
    "DELTA_TAG",
    "KEYS_MAX_BYTES",
    "KEYS_PER_SESSION",
    "MIN_KEY_IDS",
    "REKEY",
    "DeltaError",
    "SessionDeltas",
    "is_delta",
    "parts_size",
    "resolve",
    "share_request",
    "stored_json",
    "stored_parts",
]

DELTA_TAG = b'{"_delta":'
MIN_KEY_IDS = 2048  # a record with fewer prompt ids (its JSON ≈ 25 KB or less) is not worth a key
REKEY = 4  # a new key once the ids after the key's exceed 1/REKEY of the key's
KEYS_PER_SESSION = 4  # keys kept per session (its chains)
KEYS_MAX_BYTES = 256 << 20  # what all keys may hold (≈ 0.5 MB a key at a 30k-token prompt: ≈ 500 keys)
BASES_KEPT = 16  # bases' JSON a read keeps
_LIST_FIELDS = ("original_request", "request")
_I32 = "b64:i32:"
RAW_IDS_MIN = 4096  # a stored id string this long or longer is written as its own buffer (`stored_parts`)


class DeltaError(PolarError, ValueError):
    """A delta that cannot be resolved against its base (the store reports it as `StoreCorrupt`)."""


@dataclass(slots=True)
class _Key:
    record_id: str
    n_bytes: int  # its prompt ids' packed size (4 per id)
    head: str  # the stored form of its ids ("b64:i32:..."), cut after a multiple of 3 ids (`_key`)
    lists: dict[tuple[str, str], list[Any]]  # (field, name) -> a copy of the list (its items the record's own)
    size: int = 0  # about what it holds (`SessionDeltas.held`): its stored JSON's size


def _same_json_bytes(a: Any, b: Any) -> bool:
    return orjson.dumps(a) == orjson.dumps(b)


try:  # the same answer without serialising either side (nemo_polar/_arrays.c)
    from nemo_polar._arrays import same_json as _same_json
except ImportError:
    _same_json = _same_json_bytes


def share_request(out: dict[str, Any]) -> dict[str, Any] | None:
    """Within one record (`out`, as `record_dict` builds it): the header naming the lists of its `request` that are
    its `original_request`'s as JSON (None: none are), each then replaced by `null` in a copy of the request, so the
    request's members keep their order; the record's own objects are left as they are."""
    req, orig = out.get("request"), out.get("original_request")
    if not (isinstance(req, dict) and isinstance(orig, dict)):
        return None
    same = [
        name
        for name, items in req.items()
        if isinstance(items, list) and items and name in orig and _same_json(items, orig[name])
    ]
    if not same:
        return None
    out["request"] = {name: None if name in same else value for name, value in req.items()}
    return {"same": same}


def stored_json(out: dict[str, Any], head: dict[str, Any] | None) -> bytes:
    """A record's stored JSON: `out`, after the header `head` when there is one (its first member)."""
    return orjson.dumps(out) if head is None else orjson.dumps({"_delta": head, **out})


def stored_parts(out: dict[str, Any], head: dict[str, Any] | None) -> list[Buffer]:
    """`stored_json(out, head)`'s bytes as buffers to write back to back (the payload file's vectored write joins
    nothing). The prompt ids' stored string, a record's largest member (43 KB of an 8k-token prompt's 85 KB), goes
    in as its own buffer, not through `orjson`: `orjson.dumps` grows its output by copies, so every byte of a large
    member is copied several times; writing around it saved ≈ 0.03 ms of the proxy's CPU per request on the
    long-stream mix at c=64 (docs/performance.md, "The record's prompt ids written as they are"). The string is the
    store's own encoding ("b64:i32:" and base64 characters: `record_json._i32`, or a delta's cut of it), which JSON
    writes as it is, so the bytes are `stored_json`'s, byte for byte."""
    ids = out.get("prompt_token_ids")
    if type(ids) is not str or len(ids) < RAW_IDS_MIN or not ids.startswith(_I32):
        return [stored_json(out, head)]
    before: dict[str, Any] = {} if head is None else {"_delta": head}
    after: dict[str, Any] = {}
    side = before
    for name, value in out.items():
        if name == "prompt_token_ids":
            side = after
        else:
            side[name] = value
    first = orjson.dumps(before)
    parts: list[Buffer] = [memoryview(first)[:-1], b',"prompt_token_ids":"' if before else b'"prompt_token_ids":"']
    parts.append(ids.encode("ascii"))
    if after:
        parts += [b'",', memoryview(orjson.dumps(after))[1:]]
    else:
        parts.append(b'"}')
    return parts


def parts_size(parts: list[Buffer]) -> int:
    """The bytes in `parts` (`stored_parts`)."""
    return sum(len(p) for p in parts)


def _b64_size(stored: str) -> int:
    """The packed size of a stored id array ("b64:i32:" + base64)."""
    body = len(stored) - len(_I32)
    return body // 4 * 3 - (stored.endswith("=") + stored.endswith("=="))


def _key(record_id: str, stored: str, n_bytes: int, out: dict[str, Any], size: int) -> _Key:
    """A key whose ids are matched up to a multiple of 3 ids: 12 bytes, 16 base64 characters. The stored form of
    those ids is then a prefix of any stored array that starts with them, and what follows it is the stored form of
    the rest; so a record is matched, cut and put back together in its base64, never decoded (a key's last 1-2 ids
    go into each delta's tail). Its lists are copied (a list the caller appends to later does not change the key);
    their items are the committed record's, which nothing changes after its commit (the proxy builds each request's
    objects anew)."""
    lists = {}
    for field in _LIST_FIELDS:
        value = out.get(field)
        if isinstance(value, dict):
            for name, items in value.items():
                if isinstance(items, list) and items:
                    lists[(field, name)] = list(items)
    return _Key(record_id, n_bytes, stored[: len(_I32) + n_bytes // 12 * 16], lists, size)


def _after(key: _Key, stored: str) -> str | None:
    """The base64 of the ids after the key's matched ones when `stored` (a record's ids, stored form) starts with
    them; None otherwise (one failed prefix comparison for a prompt that does not extend the key)."""
    return stored[len(key.head) :] if stored.startswith(key.head) else None


class SessionDeltas:
    """The write side: per session, up to `KEYS_PER_SESSION` keys (one per chain: the main agent's, a sub-agent's,
    a harness's side calls), most recently used first; sessions are bounded too, least recently used dropped first
    (a dropped session's next record becomes a key again) once the keys hold more than `max_bytes`."""

    def __init__(self, max_bytes: int = KEYS_MAX_BYTES):
        self.max_bytes = max_bytes
        self.held = 0  # bytes the keys hold (their JSON and ids as stored)
        self._keys: OrderedDict[str, list[_Key]] = OrderedDict()

    def encode(
        self, out: dict[str, Any], rec: Any, *, pending: bool, shared: dict[str, Any] | None = None
    ) -> tuple[list[Buffer], str | None]:
        """The JSON to store for `rec`, as `stored_parts` (`out`: its JSON dict, as `record_bytes` builds it, after
        `share_request`, whose header is `shared`), and the id of the key it refers to (None: written without one).
        May make `rec` a key of its session."""
        sid = rec.session_id
        keys = self._keys.get(sid)
        if keys is None:
            keys = []  # registered when it gets a key: a session with none holds nothing here
        else:
            self._keys.move_to_end(sid)
        if any(k.record_id == rec.id for k in keys):  # a key itself written again: whole, never against itself
            return stored_parts(out, shared), None
        stored_ids = out.get("prompt_token_ids")
        if not (isinstance(stored_ids, str) and stored_ids.startswith(_I32)):
            stored_ids = None
        key, tail = None, None
        for k in keys if stored_ids is not None else ():
            tail = _after(k, stored_ids)  # type: ignore[arg-type]
            if tail is not None:
                key = k
                break
        if not pending:  # a final record: a delta, or whole (and maybe a key)
            if key is None or len(tail) * 3 // 4 * REKEY > key.n_bytes:  # type: ignore[arg-type]
                whole = stored_parts(out, shared)
                n_bytes = 0 if stored_ids is None else _b64_size(stored_ids)
                if rec.error is None and stored_ids is not None and n_bytes >= 4 * MIN_KEY_IDS:
                    if key is not None:  # grown past its key: this record takes the key's place
                        keys.remove(key)
                        self.held -= key.size
                    new = _key(rec.id, stored_ids, n_bytes, out, len(stored_ids) + parts_size(whole))
                    keys = self._keys.setdefault(sid, keys)
                    keys.insert(0, new)
                    self.held += new.size - sum(k.size for k in keys[KEYS_PER_SESSION:])
                    del keys[KEYS_PER_SESSION:]
                    while self.held > self.max_bytes and len(self._keys) > 1:
                        self.held -= sum(k.size for k in self._keys.popitem(last=False)[1])
                return whole, None
        elif key is None:  # a placeholder (no ids yet): against the key its session used last, if any
            key = keys[0] if keys else None
            if key is None:
                return stored_parts(out, shared), None
        assert key is not None
        if keys[0] is not key:
            keys.remove(key)
            keys.insert(0, key)
        key_lists = key.lists
        lists: dict[str, dict[str, int]] = {}
        for field in _LIST_FIELDS:
            value = out.get(field)
            if not isinstance(value, dict):
                continue
            cut = None
            for name, items in value.items():
                kept = key_lists.get((field, name))
                if kept is None or not isinstance(items, list) or len(items) < len(kept):
                    continue
                if not _same_json(items[: len(kept)], kept):
                    continue
                if cut is None:
                    cut = dict(value)
                cut[name] = items[len(kept) :]
                lists.setdefault(field, {})[name] = len(kept)
            if cut is not None:
                out[field] = cut
        n_ids = 0 if tail is None else (len(key.head) - len(_I32)) // 16 * 3
        if not lists and not n_ids:
            return stored_parts(out, shared), None
        if tail is not None:
            out["prompt_token_ids"] = _I32 + tail
        head = {"base": key.record_id, "ids": n_ids, "lists": lists, **(shared or {})}
        return stored_parts(out, head), key.record_id

    def forget(self, session_ids: Iterable[str]) -> None:
        """Drop these sessions' keys (the session ended, or a batch of its records failed to commit: a key may not
        exist)."""
        for sid in session_ids:
            self.held -= sum(k.size for k in self._keys.pop(sid, ()))

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._keys.values())


def _join_ids(base: Any, n_ids: int, tail: Any) -> str:
    """The stored form of the base's first `n_ids` ids followed by the tail's (both stored forms)."""
    if not (isinstance(base, str) and base.startswith(_I32) and isinstance(tail, str) and tail.startswith(_I32)):
        raise DeltaError("token ids not in their stored form")
    if _b64_size(base) < 4 * n_ids:
        raise DeltaError(f"its base has {_b64_size(base) // 4} prompt ids, the delta keeps {n_ids}")
    if n_ids % 3 == 0:  # as written: a whole number of base64 groups, joined as text
        return base[: len(_I32) + n_ids // 3 * 16] + tail[len(_I32) :]
    return encode_array(decode_array(base)[:n_ids] + decode_array(tail), "i32")  # any other count: through the ids


def is_delta(raw: bytes) -> bool:
    """Whether a stored record's JSON leaves something out (its first member is `_delta`): a session delta, or a
    record with lists shared within it (`share_request`)."""
    return raw.startswith(DELTA_TAG)


def resolve(raw: bytes, fetch: Callable[[str], bytes | None], bases: OrderedDict[str, bytes]) -> dict[str, Any]:
    """The whole record (as its JSON parses) from the stored `raw` of one that leaves something out (`is_delta`);
    `fetch(id)` reads a base's stored JSON (None: no such record), and `bases` keeps the last `BASES_KEPT` bases'
    JSON (reads go session by session, and a session's deltas share a few bases). The base is parsed anew for every
    delta, and a list shared within a record is read twice, so no two records, nor two members of one, share an
    object."""
    try:
        out = orjson.loads(raw)
        meta = out.pop("_delta")
        bid = meta.get("base")
        if bid is not None:
            _join(out, meta, bid, fetch, bases)
        for name in meta.get("same", ()):
            if out["request"][name] is not None:
                raise DeltaError(f"request.{name} is shared with original_request but holds a value")
            out["request"][name] = orjson.loads(orjson.dumps(out["original_request"][name]))
    except DeltaError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as exc:  # orjson's decode error is a ValueError
        raise DeltaError(
            f"a delta that does not fit its base or its own record ({type(exc).__name__}: {exc})"
        ) from exc
    return out


def _join(
    out: dict[str, Any],
    meta: dict[str, Any],
    bid: str,
    fetch: Callable[[str], bytes | None],
    bases: OrderedDict[str, bytes],
) -> None:
    """A session delta's ids and lists put back together with its base's (`resolve`)."""
    braw = bases.get(bid)
    if braw is None:
        braw = fetch(bid)
        if braw is None:
            raise DeltaError(f"its base record {bid} is missing")
        bases[bid] = braw
        while len(bases) > BASES_KEPT:
            bases.popitem(last=False)
    base = orjson.loads(braw)
    if base.get("_delta", {}).get("base") is not None:
        raise DeltaError(f"its base record {bid} is itself a delta")
    n_ids = int(meta["ids"])
    if n_ids:
        out["prompt_token_ids"] = _join_ids(base["prompt_token_ids"], n_ids, out["prompt_token_ids"])
    for field, names in meta["lists"].items():
        for name, n in names.items():
            items, rest = base[field][name], out[field][name]
            if not isinstance(items, list) or len(items) < n or not isinstance(rest, list):
                raise DeltaError(f"its base's {field}.{name} has fewer than {n} items, or its own is no list")
            del items[n:]
            items += rest
            out[field][name] = items
