# SPDX-License-Identifier: Apache-2.0
"""`polar view RUN_DIR --out report.html`: one self-contained HTML file (no network, no script needed) showing
a run the way the paper's Figure 4 shows a session.

- An index of sessions: reward, harness, task, status, turns, chains, calls, trainable tokens.
- Per session: a timeline of its model calls in one lane per chain (main / subagent / side / post-compaction; a
  call no trace holds goes in a lane of its call kind), each call placed at its arrival time, coloured by its
  CALL-CREDIT role (IG / AE / RV / OTHER, from credit.jsonl) and labelled with its credit; a table of the calls
  (tools, origin, tokens, evidence); and a token view per trace: runs of trainable (loss_mask 1) and masked tokens,
  as text when a tokenizer is at hand (the run's model dir, or `--tokenizer`), else as counts.

The DOM is the contract the tests read: `section.session[data-session-id][data-harness][data-reward]`, each call
`.call[data-record-id][data-role][data-credit][data-chain]`, each token run `.tok.trainable` / `.tok.masked`.
This module only reads a run directory and renders; it runs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import jinja2

from nemo_polar.rundir import RunDir, read_json, read_results, records_by_session
from nemo_polar.types import CompletionRecord, SessionResult, Trace

__all__ = ["render_report", "write_report"]

ROLE_COLOURS = {"IG": "#3b82f6", "AE": "#f97316", "RV": "#16a34a", "OTHER": "#9ca3af", "?": "#d1d5db"}
LANE_ORDER = {"main": 0, "post_compaction": 1, "subagent": 2, "side": 3}
MAX_RUN_CHARS = 1200  # per token run in the token view; the middle of longer runs is elided
MAX_TRACE_CHARS = 60_000


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def _load_tokenizer(path: str | Path | None) -> _Decoder | None:
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    tok: _Decoder = Tokenizer.from_file(str(p))
    return tok


def _credit_by_session(run_dir: Path) -> dict[str, dict[str, Any]]:
    path = RunDir(run_dir).credit
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            out[str(d["session_id"])] = d
    return out


def _elide(text: str, limit: int = MAX_RUN_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} … [{len(text) - limit} characters elided] … {text[-half:]}"


@dataclass(slots=True)
class _Lane:
    key: str
    label: str
    kind: str
    calls: list[dict[str, Any]]


def _tools_of(rec: CompletionRecord) -> list[str]:
    calls = rec.response.get("tool_calls") if isinstance(rec.response, dict) else None
    names = []
    for c in calls or []:
        fn = c.get("function", c) if isinstance(c, dict) else {}
        names.append(str(fn.get("name", "?")))
    return names


def _lanes(s: SessionResult, records: Sequence[CompletionRecord], credit: Mapping[str, Any]) -> list[_Lane]:
    """One lane per trace (chain), then one per call kind for calls no trace holds; calls placed by time."""
    by_id = {r.id: r for r in records}
    credit_calls = {c["record_id"]: c for c in credit.get("calls", [])}
    times = [t for r in records for t in (r.arrived_at, r.finished_at or r.arrived_at) if t]
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    span = max(t1 - t0, 1e-6)

    def call(rid: str, chain: str) -> dict[str, Any]:
        rec = by_id.get(rid)
        cc = credit_calls.get(rid, {})
        start = (rec.arrived_at - t0) if rec is not None and rec.arrived_at else 0.0
        end = (rec.finished_at - t0) if rec is not None and rec.finished_at else start
        role = str(cc.get("role") or "?")
        text = ""
        if rec is not None and isinstance(rec.response, dict):
            text = str(rec.response.get("content") or "")
        return {
            "record_id": rid,
            "seq": rec.seq if rec is not None else None,
            "chain": chain,
            "call_kind": rec.call_kind if rec is not None else "?",
            "origin": rec.origin if rec is not None else "?",
            "role": role,
            "colour": ROLE_COLOURS.get(role, ROLE_COLOURS["?"]),
            "credit": cc.get("credit"),
            "credit_label": "–" if cc.get("credit") is None else f"{cc['credit']:+.3f}",
            "evidence": cc.get("evidence") or "",
            "summary": cc.get("summary") or "",
            "tools": _tools_of(rec) if rec is not None else [],
            "text": _elide(text, 300),
            "gen_tokens": len(rec.generation_token_ids) if rec is not None else 0,
            "error": (rec.error or {}).get("message") if rec is not None and rec.error else None,
            "left": round(100.0 * start / span, 3),
            "width": round(max(100.0 * (end - start) / span, 1.2), 3),
            "start_s": round(start, 3),
            "dur_s": round(max(end - start, 0.0), 3),
        }

    lanes: list[_Lane] = []
    seen: set[str] = set()
    per_kind: dict[str, int] = {}
    for t in s.trajectory.traces:
        n = per_kind[t.chain_kind] = per_kind.get(t.chain_kind, 0) + 1
        rids = [rid for rid, _, _ in t.call_spans]
        seen.update(rids)
        lanes.append(
            _Lane(f"{t.chain_kind}-{n}", f"{t.chain_kind} #{n}", t.chain_kind, [call(r, t.chain_kind) for r in rids])
        )
    loose: dict[str, list[str]] = {}
    for r in sorted(records, key=lambda r: r.seq):
        if r.id not in seen:
            loose.setdefault(r.call_kind, []).append(r.id)
    for kind, rids in loose.items():
        lanes.append(_Lane(f"{kind}-untraced", f"{kind} (in no trace)", kind, [call(r, kind) for r in rids]))
    lanes.sort(key=lambda ln: (LANE_ORDER.get(ln.kind, 9), ln.key))
    return lanes


def _token_runs(t: Trace, decoder: _Decoder | None) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    mask, ids = t.loss_mask, t.response_ids
    i, total_chars = 0, 0
    while i < len(ids):
        j = i
        while j < len(ids) and mask[j] == mask[i]:
            j += 1
        text = None
        if decoder is not None and total_chars < MAX_TRACE_CHARS:
            text = _elide(decoder.decode(list(ids[i:j]), skip_special_tokens=False))
            total_chars += len(text)
        runs.append({"trainable": bool(mask[i]), "n": j - i, "text": text})
        i = j
    return runs


def _session_view(
    s: SessionResult,
    row: Mapping[str, Any],
    records: Sequence[CompletionRecord],
    credit: Mapping[str, Any],
    decoder: _Decoder | None,
) -> dict[str, Any]:
    lanes = _lanes(s, records, credit)
    calls = sorted((c for ln in lanes for c in ln.calls), key=lambda c: (c["seq"] is None, c["seq"] or 0))
    traces = []
    for k, t in enumerate(s.trajectory.traces):
        traces.append(
            {
                "index": k,
                "chain": t.chain_kind,
                "prompt_tokens": len(t.prompt_ids),
                "response_tokens": len(t.response_ids),
                "trainable": t.trainable_tokens,
                "masked": len(t.response_ids) - t.trainable_tokens,
                "calls": len(t.call_spans),
                "runs": _token_runs(t, decoder),
            }
        )
    failure = None
    if s.eval is not None and s.eval.failure_kind:
        failure = f"{s.eval.failure_kind}: {s.eval.failure_reason or ''}"[:500]
    return {
        **row,
        "anchor": f"s-{s.session_id}",
        "lanes": lanes,
        "calls": calls,
        "traces": traces,
        "advantage": credit.get("advantage"),
        "hacked": credit.get("hacked"),
        "failure": failure,
        "chains_label": ", ".join(f"{k}×{v}" for k, v in sorted(row["chains"].items())) or "–",
        "roles": _role_counts(calls),
    }


def _role_counts(calls: Sequence[Mapping[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for c in calls:
        counts[c["role"]] = counts.get(c["role"], 0) + 1
    return " ".join(f"{k}:{v}" for k, v in sorted(counts.items()))


def render_report(run_dir: str | Path, *, tokenizer: str | Path | None = None, title: str | None = None) -> str:
    """The report HTML for `run_dir` (sessions from trajectories.jsonl, records, credit.jsonl, summary.json)."""
    from nemo_polar.collect.summary import session_row

    rd = Path(run_dir)
    summary: dict[str, Any] = read_json(RunDir(rd).summary, {})
    threshold = float(summary.get("accept_threshold", 1.0))
    if tokenizer is None:
        tokenizer = (summary.get("model") or {}).get("model_dir")
    decoder = _load_tokenizer(tokenizer)
    results = sorted(read_results(rd), key=lambda s: (s.harness or "", s.task_id, s.sample_index))
    records = records_by_session(rd)
    credit = _credit_by_session(rd)
    sessions = []
    for s in results:
        recs = records.get(s.session_id, [])
        sessions.append(_session_view(s, session_row(s, recs, threshold), recs, credit.get(s.session_id, {}), decoder))
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    tpl = env.from_string(resources.files(__package__).joinpath("report.html.jinja").read_text(encoding="utf-8"))
    return tpl.render(
        title=title or f"Polar run {rd.resolve().name}",
        run_dir=str(rd.resolve()),
        summary=summary,
        sessions=sessions,
        roles=ROLE_COLOURS,
        has_credit=bool(credit),
        decoded=decoder is not None,
    )


def write_report(run_dir: str | Path, out: str | Path | None = None, *, tokenizer: str | Path | None = None) -> Path:
    path = Path(out) if out is not None else RunDir(run_dir).report
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(run_dir, tokenizer=tokenizer), encoding="utf-8")
    return path
