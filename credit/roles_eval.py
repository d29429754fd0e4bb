# SPDX-License-Identifier: Apache-2.0
"""Accuracy of the role rules on the hand-labelled set, by split, source and clear/ambiguous.

    python -m nemo_polar.credit.roles_eval                  # the tuning split (train), with its misses
    python -m nemo_polar.credit.roles_eval --split test     # the held-out 30 %: report it once, do not tune on it

Prints one line per (source, subset) — `idiom`, `capture` and `all` × `clear`, `ambiguous`, `all` — and, with
`--misses`, each miss as `id gold→predicted tool arguments`. `--json` prints the numbers as JSON. The rows and the
split are `labels.py`'s; this module changes no rule.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .labels import LABELS_PATH, Accuracy, evaluate, load_labels

__all__ = ["main", "report"]

SOURCES = ("idiom", "capture", "all")
SUBSETS = ("clear", "ambiguous", "all")


def report(rows: Sequence[Mapping[str, Any]], split: str | None) -> dict[str, dict[str, Accuracy]]:
    """{source: {subset: Accuracy}} for the rows of `split` (None: every row)."""
    out = {}
    for source in SOURCES:
        subset = [r for r in rows if source == "all" or r.get("source") == source]
        out[source] = evaluate(subset, split=split)
    return out


def _brief(row: Mapping[str, Any]) -> str:
    args = row.get("arguments") or {}
    text = args.get("command") or args.get("cmd") or args.get("content") or json.dumps(args, ensure_ascii=False)
    if isinstance(text, list):
        text = " ".join(map(str, text))
    return f"{row.get('tool')} {str(text)[:100]!r}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=("train", "test", "all"), default="train")
    ap.add_argument("--labels", type=Path, default=LABELS_PATH)
    ap.add_argument("--misses", action="store_true", help="list every miss")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = load_labels(args.labels)
    split = None if args.split == "all" else args.split
    res = report(rows, split)
    if args.json:
        print(json.dumps({s: {k: {"n": a.n, "correct": a.correct} for k, a in v.items()} for s, v in res.items()}))
        return 0
    print(f"role rules on {args.labels.name}, split={args.split}")
    print(f"{'source':8} {'subset':10} {'n':>4} {'correct':>7} {'accuracy':>8}")
    for source in SOURCES:
        for subset in SUBSETS:
            a = res[source][subset]
            acc = f"{a.value:.3f}" if a.n else "-"
            print(f"{source:8} {subset:10} {a.n:>4} {a.correct:>7} {acc:>8}")
    if args.misses:
        by_id = {r["id"]: r for r in rows}
        for rid, gold, pred in res["all"]["all"].misses:
            amb = " (ambiguous)" if by_id[rid].get("ambiguous") else ""
            print(f"  {rid} {gold}→{pred}{amb} {_brief(by_id[rid])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
