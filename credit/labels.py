# SPDX-License-Identifier: Apache-2.0
"""The hand-labelled role set (`credit/data/role_labels.jsonl`) and the accuracy of the rules on it.

Row format: `{id, source, harness, tool, arguments, observation?, context?, label, ambiguous, split}`.
`source` is `idiom` (realistic shell/tool idioms written by hand) or `capture` (calls taken from harness
end-to-end runs). `tool` is null for a tool-less reply (mini-swe-agent), whose `arguments.content` is the
reply text. `context.after_edit` states whether an edit preceded the call in its session (the position
prior needs it). `split` is `train`/`test`, 70/30: for idiom rows fixed by `split_of(id)` (a seeded hash), so
adding rows never moves old ones; capture rows (also `reason`, the one-line why of the hand label) are split by
`tests/credit/capture_role_calls.py`, stratified by harness × label. Rules are tuned on `train` only;
`python -m nemo_polar.credit.roles_eval` prints the accuracy. This module does not change any rule.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .calls import Action, Call
from .config import RoleConfig
from .roles import classify_calls

__all__ = ["LABELS_PATH", "Accuracy", "evaluate", "load_labels", "split_of"]

LABELS_PATH = Path(__file__).resolve().parent / "data" / "role_labels.jsonl"
_SPLIT_SEED = "polar-role-labels-v1"


def split_of(row_id: str) -> str:
    """'train' for ~70 % of ids, 'test' for the rest, stable per id."""
    h = int(hashlib.sha256(f"{_SPLIT_SEED}:{row_id}".encode()).hexdigest()[:8], 16)
    return "train" if h % 100 < 70 else "test"


def load_labels(path: Path | str = LABELS_PATH) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _call_of(row: Mapping[str, Any]) -> Call:
    args = dict(row.get("arguments") or {})
    tool = row.get("tool")
    if tool is None:
        text = str(args.get("content", ""))
        call = Call(index=0, record_id=row["id"], seq=0, call_kind="main", text=text)
        from .calls import _BASH_BLOCK  # the same extraction as for records

        call.actions = [
            Action(tool=None, arguments={"command": m.group(1).strip()}) for m in _BASH_BLOCK.finditer(text)
        ]
        if call.actions:
            call.actions[0].observation = row.get("observation")
        return call
    return Call(
        index=0,
        record_id=row["id"],
        seq=0,
        call_kind="main",
        text="",
        actions=[Action(tool=tool, arguments=args, observation=row.get("observation"))],
    )


@dataclass(slots=True)
class Accuracy:
    """Accuracy on one subset, with the misses (id, gold, predicted)."""

    n: int
    correct: int
    misses: list[tuple[str, str, str]]

    @property
    def value(self) -> float:
        return self.correct / self.n if self.n else float("nan")


def predict(row: Mapping[str, Any], config: RoleConfig | None = None) -> str:
    ctx = row.get("context") or {}
    return classify_calls([_call_of(row)], harness=row.get("harness"), config=config, context=[ctx])[0].role


def evaluate(
    rows: Iterable[Mapping[str, Any]], *, split: str | None = None, config: RoleConfig | None = None
) -> dict[str, Accuracy]:
    """Accuracy overall and for clear / ambiguous rows (keys `all`, `clear`, `ambiguous`)."""
    out = {k: Accuracy(0, 0, []) for k in ("all", "clear", "ambiguous")}
    for row in rows:
        if split is not None and row.get("split") != split:
            continue
        pred = predict(row, config)
        ok = pred == row["label"]
        for k in ("all", "ambiguous" if row.get("ambiguous") else "clear"):
            out[k].n += 1
            out[k].correct += int(ok)
            if not ok:
                out[k].misses.append((row["id"], row["label"], pred))
    return out
