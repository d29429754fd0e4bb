# SPDX-License-Identifier: Apache-2.0
"""Small token/message relations the prefix-merging builder uses to explain a new chain.

`find_terminator` locates the first end-of-turn terminator (possibly multi-token) in a token list;
`ends_with_terminator` tells whether a sampled turn closed itself; `diff_window` sizes the deviation between a
sampled turn and its re-rendering; `system_fingerprint` identifies a conversation's system turn (message content
when the normalised request has it, else the prompt tokens up to the first terminator). Pure; no chain logic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nemo_polar.types import CompletionRecord

__all__ = ["diff_window", "ends_with_terminator", "find_terminator", "messages_continue", "system_fingerprint"]

Terminators = Sequence[Sequence[int]]


def find_terminator(ids: Sequence[int], start: int, terms: Terminators) -> tuple[int, tuple[int, ...]] | None:
    """First position >= `start` where one of `terms` begins, and that terminator; None when there is none."""
    best: tuple[int, tuple[int, ...]] | None = None
    for term in terms:
        head, rest = term[0], list(term[1:])
        pos = start
        while True:
            try:
                pos = ids.index(head, pos)
            except ValueError:
                break
            if best is not None and pos >= best[0]:
                break
            if not rest or ids[pos + 1 : pos + 1 + len(rest)] == rest:
                best = (pos, tuple(term))
                break
            pos += 1
    return best


def ends_with_terminator(ids: list[int], terms: Terminators) -> tuple[int, ...] | None:
    """The terminator a sampled turn ends with (the longest that matches), or None (e.g. `finish_reason=length`)."""
    hit: tuple[int, ...] | None = None
    for term in terms:
        n = len(term)
        if len(ids) >= n and ids[-n:] == list(term) and (hit is None or n > len(hit)):
            hit = tuple(term)
    return hit


def diff_window(a: list[int], b: list[int]) -> int:
    """Size of the differing window between two token lists: longer length minus common prefix and suffix."""
    if a == b:
        return 0
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    j = 0
    while j < n - i and a[-1 - j] == b[-1 - j]:
        j += 1
    return max(len(a), len(b)) - i - j


def _messages(rec: CompletionRecord) -> list[Any] | None:
    req = rec.request
    msgs = req.get("messages") if isinstance(req, dict) else None
    return msgs if isinstance(msgs, list) and msgs else None


def system_fingerprint(rec: CompletionRecord, terms: Terminators) -> Any:
    """What identifies the conversation's system turn; None when it cannot be told."""
    msgs = _messages(rec)
    if msgs is not None:
        first = msgs[0]
        if isinstance(first, dict) and first.get("role") in ("system", "developer"):
            return ("message", repr(first.get("content")))
        return None
    if terms:
        hit = find_terminator(rec.prompt_token_ids, 0, terms)
        if hit is not None:
            pos, term = hit
            return ("tokens", tuple(rec.prompt_token_ids[: pos + len(term)]))
    return None


def messages_continue(rec: CompletionRecord, earlier: CompletionRecord) -> bool:
    """True when `rec`'s request messages start with all of `earlier`'s and add more (a message-level continuation)."""
    a, b = _messages(rec), _messages(earlier)
    if a is None or b is None or len(a) <= len(b):
        return False
    return a[: len(b)] == b
