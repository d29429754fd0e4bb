# SPDX-License-Identifier: Apache-2.0
"""The `prefix_merging` builder: recover append-only conversation chains from a session's calls.

Records are taken in arrival order (`seq`). Each extends the open chain whose tip is the longest token prefix
of its prompt; a tip is consumed when a record extends it, so identical prompts (retries, n>1, parallel
subagents) become sibling chains instead of truncating one. Two fidelity modes:

- `exact` (default): a chain's tip is its whole stitched sequence (first prompt + sampled and interstitial
  tokens); a record extends it only if that sequence is a token prefix of its prompt, so every trainable token's
  left context is exactly what the model saw. Interstitial tokens (tool results, template glue, a terminator the
  model did not sample after `finish_reason=length`) get mask 0 and logprob 0.
- `canonical` (opt-in, the reference's lossy rule): the tip is the previous record's prompt; the new prompt's
  tail is split at the first end-of-turn terminator; the sampled turn replaces the template's re-rendering and
  every deviating token is counted in `drift_tokens`.

A record that extends nothing starts a new chain, and the reason is counted (`sibling`, `drift`, `truncated`,
`no_eot`, `compaction`); a record in a brand-new conversation (first main call, a subagent, a side call) starts
one without a split. Chain kinds come from the call kind (after the optional classifier) plus a fingerprint
heuristic: a main call that extends no tip and whose system turn matches the main chain's is `post_compaction`;
one with a different system turn is a `subagent`. This module does not export anything (see `export`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_polar.errors import PolarError
from nemo_polar.types import CallKind, ChainKind, CompletionRecord, SplitReason, Trace, Trajectory, id_list

from .common import DROP, TRAIN, Tally, call_policy, finish_trajectory, trace_reward, usable_records
from .fingerprint import diff_window, ends_with_terminator, find_terminator, messages_continue, system_fingerprint
from .options import BuildOptions

__all__ = ["FidelityError", "build_prefix_merging", "check_exact"]


class FidelityError(PolarError, AssertionError):
    """A merged trace violates the exact-fidelity invariant (a builder bug, never bad input)."""


@dataclass(slots=True, eq=False)
class _Chain:
    kind: str
    prompt: list[int]
    reason: str | None
    related: str | None
    resp: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    spans: list[tuple[str, int, int]] = field(default_factory=list)
    records: list[CompletionRecord] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)
    drift_tokens: int = 0

    def append_call(self, rec: CompletionRecord, policy: str, interstitial: list[int]) -> None:
        if interstitial:
            n = len(interstitial)
            self.resp.extend(interstitial)
            self.mask.extend([0] * n)
            self.lps.extend([0.0] * n)
        start = len(self.resp)
        gen = rec.generation_token_ids
        n = len(gen)
        self.resp.extend(gen)
        if policy == TRAIN:
            self.mask.extend([1] * n)
            self.lps.extend(rec.generation_log_probs)
        else:
            self.mask.extend([0] * n)
            self.lps.extend([0.0] * n)
        self.spans.append((rec.id, start, start + n))
        self.records.append(rec)
        self.policies.append(policy)


_SIDE, _SUBAGENT = CallKind.SIDE.value, CallKind.SUBAGENT.value  # plain strings: no enum lookups in hot loops


def _compatible(call_kind: str, chain_kind: str) -> bool:
    """Side calls only continue side chains, explicit subagent calls only subagent chains; main calls any non-side.

    This keeps a side call that happens to replay the whole main history (a router, a title generator) from
    consuming the main chain's tip.
    """
    if call_kind == _SIDE:
        return chain_kind == _SIDE
    if call_kind == _SUBAGENT:
        return chain_kind == _SUBAGENT
    return chain_kind != _SIDE


def pack(ids: Sequence[int]) -> bytes:
    """Token ids as packed uint32, so a prefix check is one `memcmp` (`bytes.startswith`).

    Packing a list costs about one pass over it; comparing two lists of distinct int objects costs several times
    more, and a record's prompt is packed once but may be compared against several tips.
    """
    try:
        return array("I", ids).tobytes()
    except (OverflowError, TypeError) as exc:
        raise ValueError("token ids must be ints in [0, 2**32)") from exc


_W = array("I").itemsize


class _Packed:
    """Per-build cache of packed prompts and generations, keyed by record object."""

    def __init__(self) -> None:
        self._prompt: dict[int, bytes] = {}
        self._gen: dict[int, bytes] = {}

    def prompt(self, rec: CompletionRecord) -> bytes:
        b = self._prompt.get(id(rec))
        if b is None:
            b = self._prompt[id(rec)] = pack(rec.prompt_token_ids)
        return b

    def gen(self, rec: CompletionRecord) -> bytes:
        b = self._gen.get(id(rec))
        if b is None:
            b = self._gen[id(rec)] = pack(rec.generation_token_ids)
        return b

    def extends_exact(self, pb: bytes, last: CompletionRecord) -> bool:
        """The chain's stitched sequence (= last prompt + last sampled turn, by construction) prefixes `pb`."""
        n, g = len(last.prompt_token_ids), len(last.generation_token_ids)
        if len(pb) < _W * (n + g):
            return False
        return pb.startswith(self.gen(last), _W * n) and pb.startswith(self.prompt(last))


class _Builder:
    def __init__(self, options: BuildOptions, tally: Tally):
        self.o = options
        self.terms = options.eot_token_ids
        self.tally = tally
        self.chains: list[_Chain] = []
        self.main: _Chain | None = None
        self.main_fp: Any = None
        self.packed = _Packed()

    # -- placement --------------------------------------------------------------------------------------------

    def place(self, rec: CompletionRecord, kind: str, policy: str) -> None:
        p = id_list(rec.prompt_token_ids)
        pb = self.packed.prompt(rec)
        cands = [c for c in self.chains if _compatible(kind, c.kind)]
        no_eot: _Chain | None = None
        if self.o.fidelity == "exact":
            best = self._match_exact(pb, cands)
            if best is not None:
                best.append_call(rec, policy, p[len(best.prompt) + len(best.resp) :])
                self.tally.merged += 1
                return
        else:
            hit, no_eot = self._match_canonical(p, pb, cands)
            if hit is not None:
                chain, inter, drift = hit
                chain.drift_tokens += drift
                self.tally.drift_tokens += drift
                chain.append_call(rec, policy, inter)
                self.tally.merged += 1
                return
        reason, chain_kind, related = self._explain_new(rec, pb, kind, cands, no_eot)
        if reason is not None:
            self.tally.splits[reason] += 1
        chain = _Chain(kind=chain_kind, prompt=list(p), reason=reason, related=related)
        chain.append_call(rec, policy, [])
        self.chains.append(chain)
        if self.main is None and chain_kind == ChainKind.MAIN.value:
            self.main = chain
            self.main_fp = system_fingerprint(rec, self.terms)

    def _match_exact(self, pb: bytes, cands: list[_Chain]) -> _Chain | None:
        best: _Chain | None = None
        best_len = -1
        for c in cands:
            tip_len = len(c.prompt) + len(c.resp)
            if tip_len <= best_len or _W * tip_len > len(pb):
                continue
            if self.packed.extends_exact(pb, c.records[-1]):
                best, best_len = c, tip_len
        return best

    def _match_canonical(
        self, p: list[int], pb: bytes, cands: list[_Chain]
    ) -> tuple[tuple[_Chain, list[int], int] | None, _Chain | None]:
        """The chain whose previous prompt is the longest proper prefix of `p`, if its tail holds a terminator.

        Among chains with equally long previous prompts (siblings), the one whose sampled turn deviates least from
        the re-rendering wins. Returns (chain, interstitial, drift) or None, and a chain that matched but had no
        terminator in the tail (for the `no_eot` reason).
        """
        groups: dict[int, list[_Chain]] = {}
        for c in cands:
            lp = c.records[-1].prompt_token_ids
            if pb.startswith(self.packed.prompt(c.records[-1])):
                if len(lp) == len(p):
                    # the longest tip is this very prompt, already consumed: a sibling/retry, never an
                    # extension of some older, shorter tip
                    return None, None
                groups.setdefault(len(lp), []).append(c)
        if not groups:
            return None, None
        best: tuple[_Chain, list[int], int] | None = None
        no_eot: _Chain | None = None
        for c in groups[max(groups)]:  # only the longest tip: never fall back to an older, shorter one
            spliced = self._splice(p, c.records[-1])
            if spliced is None:
                no_eot = no_eot or c
            elif best is None or spliced[1] < best[2]:
                best = (c, spliced[0], spliced[1])
        return (best, None) if best is not None else (None, no_eot)

    def _splice(self, p: list[int], last: CompletionRecord) -> tuple[list[int], int] | None:
        """Interstitial and drift when `p` continues `last` canonically; None when its tail has no terminator."""
        n = len(last.prompt_token_ids)
        hit = find_terminator(p, n, self.terms)
        if hit is None:
            return None
        k, term = hit
        raw = last.generation_token_ids
        closed = ends_with_terminator(raw, self.terms)
        canon = p[n:k]
        if closed is not None:
            drift = diff_window(raw[: len(raw) - len(closed)], canon)
            if closed != term:
                drift += max(len(closed), len(term))
            return p[k + len(term) :], drift
        # the model did not sample a terminator (finish_reason=length, a stop string): the template's
        # terminator is interstitial, never trained, and nothing is guessed.
        return p[k:], diff_window(raw, canon)

    # -- explaining a new chain -------------------------------------------------------------------------------

    def _explain_new(
        self, rec: CompletionRecord, pb: bytes, kind: str, cands: list[_Chain], no_eot: _Chain | None
    ) -> tuple[str | None, str, str | None]:
        """(split reason or None, chain kind, related record id) for a record that extends no tip."""
        if no_eot is not None:
            return SplitReason.NO_EOT.value, no_eot.kind, no_eot.records[-1].id
        p = id_list(rec.prompt_token_ids)
        found = self._longest_prompt_prefix(p, pb, cands)
        if found is not None:
            chain, i = found
            q = chain.records[i]
            qp, qg = q.prompt_token_ids, q.generation_token_ids
            if len(qp) == len(p):
                reason = SplitReason.TRUNCATED if q.finish_reason == "length" else SplitReason.SIBLING
            elif i + 1 < len(chain.records) and (
                self.o.fidelity == "canonical" or p[len(qp) : len(qp) + len(qg)] == qg
            ):
                reason = SplitReason.SIBLING  # a branch at a tip a later call already consumed
            else:
                reason = SplitReason.TRUNCATED if q.finish_reason == "length" else SplitReason.DRIFT
            return reason.value, chain.kind, q.id
        near = self._near_continuation(rec, pb, cands)
        if near is not None:
            last = near.records[-1]
            reason = SplitReason.TRUNCATED if last.finish_reason == "length" else SplitReason.DRIFT
            return reason.value, near.kind, last.id
        if kind == CallKind.SIDE.value:
            return None, ChainKind.SIDE.value, None
        if kind == CallKind.SUBAGENT.value or self.main is None:
            return None, kind, None
        fp = system_fingerprint(rec, self.terms)
        if fp is not None and fp == self.main_fp:
            return SplitReason.COMPACTION.value, ChainKind.POST_COMPACTION.value, self.main.records[-1].id
        return None, ChainKind.SUBAGENT.value, None

    def _longest_prompt_prefix(self, p: list[int], pb: bytes, cands: list[_Chain]) -> tuple[_Chain, int] | None:
        """The earlier call (any position in a compatible chain) with the longest prompt that prefixes `p`.

        Several calls can share that prompt (siblings, a retry): the one whose sampled turn agrees longest with what
        follows in `p` wins (the turn `p` actually continues), then the most recent (a retry duplicates the latest).
        """
        order = sorted(
            ((len(q.prompt_token_ids), q.seq, ci, i) for ci, c in enumerate(cands) for i, q in enumerate(c.records)),
            reverse=True,
        )
        hits: list[tuple[int, int, int, int]] = []
        for n, seq, ci, i in order:  # longest first: stop after the first length that hits
            if hits and n < hits[0][0]:
                break
            if _W * n <= len(pb) and pb.startswith(self.packed.prompt(cands[ci].records[i])):
                hits.append((n, seq, ci, i))
        if not hits:
            return None
        if len(hits) == 1:
            return cands[hits[0][2]], hits[0][3]

        def agreement(h: tuple[int, int, int, int]) -> tuple[int, int]:
            g = cands[h[2]].records[h[3]].generation_token_ids
            n = h[0]
            k = 0
            while k < len(g) and n + k < len(p) and p[n + k] == g[k]:
                k += 1
            return k, h[1]

        best = max(hits, key=agreement)
        return cands[best[2]], best[3]

    def _near_continuation(self, rec: CompletionRecord, pb: bytes, cands: list[_Chain]) -> _Chain | None:
        """A chain `rec` continues at the message level, or whose last prompt it shares except a short tail."""
        w = self.o.drift_window_tokens
        best: _Chain | None = None
        best_len = -1
        for c in cands:
            last = c.records[-1]
            lp = last.prompt_token_ids
            if len(lp) <= best_len:
                continue
            if messages_continue(rec, last):
                best, best_len = c, len(lp)
                continue
            shared = len(lp) - w
            if shared > len(lp) // 2 and pb.startswith(self.packed.prompt(last)[: _W * shared]):
                best, best_len = c, len(lp)
        return best

    # -- output -----------------------------------------------------------------------------------------------

    def traces(self) -> list[Trace]:
        out: list[Trace] = []
        exact = self.o.fidelity == "exact"
        for c in self.chains:
            if exact:
                _check_lengths(c)
            out.append(
                Trace(
                    prompt_ids=c.prompt,
                    response_ids=c.resp,
                    loss_mask=c.mask,
                    response_logprobs=c.lps,
                    call_spans=c.spans,
                    chain_kind=c.kind,
                    reward=trace_reward(c.kind, self.o),
                    metadata={
                        "builder": "prefix_merging",
                        "fidelity": self.o.fidelity,
                        "session_id": c.records[0].session_id,
                        "records": [r.id for r in c.records],
                        "policies": list(c.policies),
                        "split_reason": c.reason,
                        "related_record": c.related,
                        "drift_tokens": c.drift_tokens,
                    },
                )
            )
        return out


def _check_lengths(c: _Chain) -> None:
    """O(1) per call: in exact mode each call's left context has exactly its prompt's length."""
    for rec, (rid, s, e) in zip(c.records, c.spans, strict=True):
        if rid != rec.id or len(c.prompt) + s != len(rec.prompt_token_ids) or e - s != len(rec.generation_token_ids):
            raise FidelityError(f"call {rid}: span ({s}, {e}) does not line up with its prompt/generation")


def check_exact(trace: Trace, records: dict[str, CompletionRecord]) -> None:
    """Token-by-token proof of exact fidelity for one trace: every call's left context is its record's prompt,
    its span is its sampled tokens, and its logprobs are aligned (or zero where masked)."""
    ids = trace.prompt_ids + trace.response_ids
    base = len(trace.prompt_ids)
    for rid, s, e in trace.call_spans:
        rec = records[rid]
        if ids[: base + s] != rec.prompt_token_ids:
            raise FidelityError(f"call {rid}: left context differs from the prompt the model saw")
        if trace.response_ids[s:e] != rec.generation_token_ids:
            raise FidelityError(f"call {rid}: span is not the sampled tokens")
        if any(trace.loss_mask[s:e]) and trace.response_logprobs[s:e] != rec.generation_log_probs:
            raise FidelityError(f"call {rid}: logprobs are not aligned with the sampled tokens")


def build_prefix_merging(records: Iterable[CompletionRecord], options: BuildOptions) -> Trajectory:
    ok, failed = usable_records(records)
    tally = Tally(records=len(ok))
    b = _Builder(options, tally)
    for rec in ok:
        kind = options.call_kind(rec)
        tally.sampled_tokens += len(rec.generation_token_ids)
        policy = call_policy(rec, kind, options, tally)
        if policy == DROP:
            continue
        b.place(rec, kind, policy)
    traces = b.traces()
    if options.verify and options.fidelity == "exact":
        by_id = {r.id: r for r in ok}
        for t in traces:
            check_exact(t, by_id)
    return finish_trajectory(traces, tally, failed=failed)
