# SPDX-License-Identifier: Apache-2.0
"""The run directory: where every file of a run lives, and the readers and writers of the shared ones.

A run directory is what `polar collect`, `polar serve`, `polar session run` and the NeMo Gym `polar_swe` server
write, and what `polar credit`, `polar export sft`, `polar view` and the summary read (docs/run_directory.md lists
every file, its writer, its readers and its format). `RunDir` names the top-level files, `SessionDir` the files of
one session under `sessions/<session_id>/`; nothing else in the package spells these names. The readers here are
the only way to read `trajectories.jsonl` and the proxy's records (through `nemo_polar.proxy.store`'s read API,
never by scanning its tables); `ResultLog` is the only appender of `trajectories.jsonl`. This module imports only
`types` and the store; it runs nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from nemo_polar.proxy.store import DB_NAME, read_records
from nemo_polar.types import CompletionRecord, SessionResult

__all__ = [
    "RECORDS_DB",
    "ResultLog",
    "RunDir",
    "SessionDir",
    "finished_session_ids",
    "read_json",
    "read_records_of",
    "read_results",
    "records_by_session",
    "write_json",
]

RECORDS_DB = DB_NAME  # the proxy's SQLite store: records and proxy sessions (nemo_polar.proxy.store)


@dataclass(frozen=True, slots=True)
class SessionDir:
    """`sessions/<session_id>/` of a run directory: one session's own files."""

    root: Path

    @property
    def agent_log(self) -> Path:  # the harness CLI's stdout + stderr (rollout gateway)
        return self.root / "agent.log"

    @property
    def result(self) -> Path:  # the SessionResult, compact JSON (rollout gateway, POSTRUN)
        return self.root / "result.json"

    @property
    def plan(self) -> Path:  # the resolved plan the session ran under (rollout gateway, READY)
        return self.root / "plan.json"

    @property
    def harness_stdout(self) -> Path:  # `polar session run`: the CLI's stdout
        return self.root / "harness.stdout"

    @property
    def harness_stderr(self) -> Path:
        return self.root / "harness.stderr"

    @property
    def diff(self) -> Path:  # the runtime's diff since creation (rollout gateway, POSTRUN)
        return self.root / "diff.patch"

    @property
    def workdir_diff(self) -> Path:  # `git diff HEAD` of the workdir (`polar session run`)
        return self.root / "workdir.diff"

    @property
    def connect(self) -> Path:  # the sandbox relay's connection trace, one JSON object per line
        return self.root / "connect.jsonl"

    @property
    def home(self) -> Path:  # the session's private HOME (`polar session run`)
        return self.root / "home"


@dataclass(frozen=True, slots=True)
class RunDir:
    """A run directory's paths. `RunDir(path).trajectories` etc.; `session(sid)` for one session's directory;
    `node(node_id)` for the sub-run-directory of one gateway when a stack runs several."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def records_db(self) -> Path:
        return self.root / RECORDS_DB

    @property
    def records_jsonl(self) -> Path:  # records exported as JSONL (accepted by the readers in place of the store)
        return self.root / "records.jsonl"

    @property
    def rollout_journal(self) -> Path:  # the rollout server's journal (tasks, attempts, results)
        return self.root / "rollout.sqlite"

    @property
    def tasks(self) -> Path:  # the TaskSpecs of the run, one per line
        return self.root / "tasks.jsonl"

    @property
    def trajectories(self) -> Path:  # one SessionResult per line (`polar session run`: one Trace per line)
        return self.root / "trajectories.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def credit(self) -> Path:
        return self.root / "credit.jsonl"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def sft(self) -> Path:
        return self.root / "sft.jsonl"

    @property
    def sessions(self) -> Path:
        return self.root / "sessions"

    @property
    def runtimes(self) -> Path:  # the gateway's per-session runtimes (removed when a session ends)
        return self.root / "runtimes"

    @property
    def outbox(self) -> Path:  # the gateway's finished results not yet acknowledged by the rollout server
        return self.root / "outbox"

    def session(self, session_id: str) -> SessionDir:
        return SessionDir(self.sessions / session_id)

    def node(self, node_id: str) -> RunDir:
        return RunDir(self.root / node_id)


def _dir(run_dir: str | os.PathLike[str] | RunDir) -> RunDir:
    return run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)


# -- readers ---------------------------------------------------------------------------------------------------------


def read_results(run_dir: str | os.PathLike[str] | RunDir) -> list[SessionResult]:
    """The `SessionResult` lines of `trajectories.jsonl` (empty when it does not exist yet); a line cut by a kill
    mid-write is skipped (its session is collected again on resume)."""
    path = _dir(run_dir).trajectories
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        if line.strip():
            try:
                out.append(SessionResult.from_dict(orjson.loads(line)))
            except orjson.JSONDecodeError:
                continue
    return out


def read_records_of(run_dir: str | os.PathLike[str] | RunDir) -> list[CompletionRecord]:
    """Every finished record of the run: `records.jsonl` when present (an export), else the proxy's store read
    through its API (`nemo_polar.proxy.store.read_records`; pending rows are not records yet); empty when neither
    exists."""
    rd = _dir(run_dir)
    if rd.records_jsonl.exists():
        text = rd.records_jsonl.read_text(encoding="utf-8")
        return [CompletionRecord.from_json(x) for x in text.splitlines() if x.strip()]
    if not rd.records_db.exists():
        return []
    return read_records(rd.root)


def records_by_session(run_dir: str | os.PathLike[str] | RunDir) -> dict[str, list[CompletionRecord]]:
    """`read_records_of` grouped by session, each list in `seq` order."""
    by: dict[str, list[CompletionRecord]] = {}
    for r in read_records_of(run_dir):
        by.setdefault(r.session_id, []).append(r)
    for recs in by.values():
        recs.sort(key=lambda r: r.seq)
    return by


def read_json(path: Path, default: Any = None) -> Any:
    """A JSON file (`summary.json`, `result.json`), or `default` when it does not exist."""
    return json.loads(path.read_text()) if path.exists() else default


# -- writers ---------------------------------------------------------------------------------------------------------


def write_json(path: Path, data: Mapping[str, Any] | list[Any]) -> None:
    """Write indented JSON atomically (a temporary file renamed over `path`): a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def finished_session_ids(run_dir: str | os.PathLike[str] | RunDir) -> set[str]:
    """Session ids already in `trajectories.jsonl`. A torn last line (a kill mid-write) is cut off first, so the
    next `ResultLog.append` starts on a fresh line."""
    path = _dir(run_dir).trajectories
    if not path.exists():
        return set()
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        with open(path, "r+b") as f:
            f.truncate(keep)
        data = data[:keep]
    done = set()
    for line in data.splitlines():
        if line.strip():
            try:
                done.add(str(orjson.loads(line)["session_id"]))
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
    return done


class ResultLog:
    """Appends `SessionResult`s to `trajectories.jsonl`, one line each, flushed and fsynced before it counts."""

    def __init__(self, run_dir: str | os.PathLike[str] | RunDir):
        self._f = open(_dir(run_dir).trajectories, "ab")  # held for the run, closed in close()

    def append(self, result: SessionResult) -> None:
        self._f.write(result.to_json(compact=False) + b"\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()
